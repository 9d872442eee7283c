"""A real Ray cluster of two nodes on this machine, and a `fedsmix run` whose parties run on both.

Two `ray start --block` processes on 127.0.0.1 (a head and a worker, one CPU each, so Flower's actor
pool holds one ClientApp actor per node), with their own temp dir and ports: other Ray sessions on the
machine are left alone. `fedsmix run --federation ray-address=...` joins the cluster; every
party's hello reply names the Ray node its ClientApp ran on, and results.json keeps that per party.
Every process the cluster started is stopped by its process group, then by PID (found by the cluster's
temp dir in its command line), also when the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from commands.launch import free_port, free_ports
from fedsmix.config import PROJECT_ROOT

pytestmark = [pytest.mark.sim, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")
NODE_IDS = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps(sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])))
ray.shutdown()
"""


class LocalRayCluster:
    """A head and `workers` worker nodes started with `ray start --block`, each in its own session."""

    def __init__(self, workers: int = 1, cpus_per_node: int = 1):
        self.workers, self.cpus = workers, cpus_per_node
        self.temp = Path(tempfile.mkdtemp(prefix="fsr-", dir="/tmp"))  # short: Ray's socket paths have a limit
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}

    def _ports(self, head: bool) -> list[str]:
        names = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                 "metrics-export-port", "runtime-env-agent-port"]
        if head:
            names += ["ray-client-server-port", "dashboard-port"]
        *ports, low = free_ports(len(names) + 1)
        return [f"--{name}={port}" for name, port in zip(names, ports, strict=True)] + [
            f"--min-worker-port={low}", f"--max-worker-port={low + 50}"]

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.temp / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        argv = [RAY, "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}", "--num-gpus=0",
                "--object-store-memory=80000000", f"--temp-dir={self.temp}", "--disable-usage-stats", *args]
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in (self.temp / f"{name}.log").read_text():
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray node {name} did not start:\n{(self.temp / f'{name}.log').read_text()[-3000:]}")
            time.sleep(0.5)

    def start(self) -> LocalRayCluster:
        self._start("head", ["--head", f"--port={self.port}", "--include-dashboard=false", *self._ports(head=True)])
        for i in range(self.workers):
            self._start(f"worker-{i}", [f"--address={self.address}", *self._ports(head=False)])
        return self

    def node_ids(self, expect: int, timeout: float = 120) -> list[str]:
        """The alive nodes, from a short-lived driver (waits until `expect` have registered)."""
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run([sys.executable, "-c", NODE_IDS, self.address], capture_output=True, text=True,
                                 env=self.env, timeout=timeout)
            ids = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []
            if len(ids) >= expect or time.monotonic() > deadline:
                return ids
            time.sleep(2)

    def leftovers(self) -> list[int]:
        """PIDs of processes whose command line names this cluster's temp dir."""
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if str(self.temp).encode() in cmdline:
                    pids.append(int(proc.name))
        return pids

    def stop(self) -> None:
        """Every process this cluster started: each node's process group, then anything left by PID."""
        for proc in reversed(self.procs):  # workers first, the head last
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group's stragglers (raylet workers)
            except ProcessLookupError:
                pass
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def ray_cluster():
    cluster = LocalRayCluster(workers=1)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        time.sleep(1)
        left = cluster.leftovers()
        if not left:
            import shutil

            shutil.rmtree(cluster.temp, ignore_errors=True)
        assert not left, f"Ray processes of {cluster.temp} still running: {left}"


def test_parties_run_on_both_nodes_of_a_ray_cluster(ray_cluster, tmp_path):
    nodes = ray_cluster.node_ids(expect=2)
    assert len(nodes) == 2, f"the cluster did not come up with two nodes: {nodes}"
    runs = tmp_path / "runs"
    http_port, control_port = free_ports(2)
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr-home"),  # our own local SuperLink, on free ports
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "PYTHONPATH": str(PROJECT_ROOT),
    }
    fedsmix = str(Path(sys.executable).parent / "fedsmix")  # the console script
    argv = [fedsmix, "run", "--preset", "configs/quickstart.yaml", "--parties", "4",
            "--set", "strategies=mixup-union,local-only", "--set", "epochs=2", "--set", "trainer=mlp",
            "--set", f"runs-dir={runs}",
            "--federation", f"ray-address={ray_cluster.address}", "--federation", "client-resources-num-cpus=1"]
    out = subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    results = json.loads((runs / "latest" / "results.json").read_text())
    where = results["party-ray-node"]
    assert sorted(where) == ["0", "1", "2", "3"], where
    assert set(where.values()) == set(nodes), f"parties ran on {set(where.values())}, the cluster's nodes: {nodes}"
    assert results["strategies"]["mixup-union"]["parties-used"] == 4
    assert results["strategies"]["local-only"]["parties-used"] == 4
    # the progress reached the `flwr run --stream` output, and the run directory
    assert "fedsmix [mixup-union] upload from party" in log and "fedsmix [local-only] party" in log
    kinds = [json.loads(line)["kind"] for line in (runs / "latest" / "progress.jsonl").read_text().splitlines()]
    assert kinds[0] == "run-start" and kinds[-1] == "run-end"
