"""The compose deployment as native processes: the same services, the same flags.

docker-compose.yml (plus an overlay such as docker-compose.tls.yml) is the one source. Each
service's `command`, `healthcheck`, `volumes` and `depends_on` are read from it and run on
127.0.0.1: container ports become free ports, service names 127.0.0.1, mounted paths folders of
this machine. The ServerApp and the ClientApps then run through Flower's real deployment runtime
(SuperLink, SuperNodes, SuperExecs with `--isolation process`), as they do in the containers, and
a flag the installed Flower does not take fails here before it fails in Docker.

    python -m deploy.smoke            # three parties: mixup-union, then FedProx for 2 rounds with
                                      # party 2's SuperNode killed when round 2 starts
    python -m deploy.smoke --tls      # two parties, the demo run over TLS, with SuperNode
                                      # authentication and an unregistered SuperNode refused

The same two runs as the containers' demo (deploy/containers.py); tests/test_deployment.py runs
both in CI. Every process is started in its own process group and stopped by group (children
included), also when a step fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from commands import launch
from commands.launch import FlowerRun, free_port, free_ports

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
TLS_OVERLAY = REPO / "docker-compose.tls.yml"
BIN = Path(sys.executable).parent
IMAGE_BINARIES = {  # by repository name, whatever the registry: flwr/superlink or a local stand-in
    "superlink": "flower-superlink",
    "supernode": "flower-supernode",
    "fedsmix-superexec": "flower-superexec",  # deploy/Dockerfile
}
SERVERAPP_SERVICE = "superexec-serverapp"
SUPERLINK_SERVICE = "superlink"
PARTY_SERVICES = ("supernode", "superexec-clientapp")

# What docs/deployment.md runs against the containers (paths are the containers'); the smoke
# test runs the same, with the paths mapped to this machine.
# The demo shows the deployment, not the trainers: one MLP and each strategy's configured setting (no selection
# or evaluation round) and no model sent back, so each party gets the hello, the encode query and one message per
# FedProx round (a ClientApp process each); the selection and return rounds are tested through the simulations
# (tests/test_simulation.py, tests/test_tuning.py).
DEMO_RUN_CONFIG = {
    "preset": "configs/quickstart.yaml",
    "strategies": "mixup-union,fedprox",
    "epochs": 5,
    "rounds": 2,
    "trainer": "mlp",
    "return-model": False,
    "tuning-budget": 1,
    "runs-dir": "/app/runs",
}
# The run in the clear: the demo's strategies with a third party, whose SuperNode is killed when
# FedProx's round 2 (the last) starts; reply-timeout outlasts Flower's heartbeat patience (2 x 30 s) with room
# for a loaded machine (under make test's own load, average 11-14, honest parties answered a digits
# round in 2 min 43 s and one missed 150 s); min-parties is 2, so the two remaining parties finish the run.
FAULT_RUN = {**DEMO_RUN_CONFIG, "min-parties": 2, "reply-timeout": 300.0}
KILL_ROUND = 2
KILL_AT = f"[ROUND {KILL_ROUND}/{FAULT_RUN['rounds']}]"  # Flower's log line when the round starts
CHANCE = 0.1  # digits: ten balanced classes
MIN_ACCURACY = {"mixup-union": 0.6, "fedprox": 0.6}  # measured: 0.95 and 0.96


def demo_run(tls: bool, parties: int) -> tuple[dict, str | None]:
    """What a deployment's demo runs (natively and in containers), and the SuperNode it kills:
    FAULT_RUN with the last party's SuperNode killed in the clear, the plain demo over TLS."""
    return (DEMO_RUN_CONFIG, None) if tls else (FAULT_RUN, f"supernode-{parties - 1}")


def kill_problems(victim: str | None, killed: dict, running: bool) -> list[str]:
    """The victim was killed when FedProx's round started, and is not running now."""
    if victim is None:
        return []
    if not killed:
        return [f"{victim} was never killed: no {KILL_AT!r} in the stream"]
    return [f"{victim} is running again after the kill"] if running else []


class DeploymentError(RuntimeError):
    """A service did not start, did not become healthy, or a run did not finish."""


# ---------------------------------------------------------------------------- compose files
def _depends(value) -> dict[str, str]:
    if isinstance(value, list):
        return {name: "service_started" for name in value}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in (value or {}).items()}


def _volume(entry: str, base: Path) -> tuple[str, str]:
    """Short syntax `source:target[:mode]` -> (source, target); bind sources become absolute."""
    if not isinstance(entry, str):
        raise DeploymentError(f"volume {entry!r}: only the short syntax source:target[:mode] is supported here")
    source, target = entry.split(":")[:2]
    if source.startswith((".", "/", "~")):
        source = str((base / source).expanduser().resolve())
    return source, target


VARIABLE = re.compile(r"\$(?:\$|\{(\w+)(?:(:?-)([^}]*))?\})")


def interpolate(text: str, environ: dict[str, str] | None = None) -> str:
    """Compose's variable substitution for the forms the files use: ${VAR}, ${VAR:-default}
    (default when unset or empty), ${VAR-default} (default when unset), and $$ for a literal $."""
    environ = os.environ if environ is None else environ

    def value(m: re.Match) -> str:
        if m[0] == "$$":
            return "$"
        name, form, default = m[1], m[2], m[3] or ""
        if name in environ and (environ[name] or form != ":-"):
            return environ[name]
        return default if form else ""

    return VARIABLE.sub(value, text)


def load_services(files: Sequence[Path]) -> dict[str, dict]:
    """The services of `docker compose -f a -f b ...`, variables substituted from the environment
    and merged as Compose merges them for the keys used here: `depends_on`, `volumes` (by target)
    and `healthcheck` merge; everything else is replaced."""
    services: dict[str, dict] = {}
    for path in files:
        document = yaml.safe_load(interpolate(Path(path).read_text())) or {}
        for name, spec in (document.get("services") or {}).items():
            merged = services.setdefault(name, {})
            for key, value in spec.items():
                if key == "depends_on":
                    merged[key] = {**merged.get(key, {}), **_depends(value)}
                elif key == "volumes":
                    volumes = dict(merged.get(key, {}))
                    volumes.update(
                        {target: source for source, target in (_volume(v, Path(path).parent) for v in value)}
                    )
                    merged[key] = volumes
                elif key == "healthcheck":
                    merged[key] = {**merged.get(key, {}), **value}
                else:
                    merged[key] = value
    return services


def party_indices(services: dict[str, dict]) -> list[int]:
    return sorted(int(m[1]) for name in services if (m := re.fullmatch(r"supernode-(\d+)", name)))


def _party_of(name: str) -> int | None:
    m = re.fullmatch(rf"(?:{'|'.join(PARTY_SERVICES)})-(\d+)", name)
    return int(m[1]) if m else None


def with_parties(services: dict[str, dict], parties: int) -> dict[str, dict]:
    """The deployment with `parties` parties: the last party's services cloned (or dropped) and
    num-partitions set, exactly the edit docs/deployment.md describes for adding a party."""
    indices = party_indices(services)
    if not indices:
        raise DeploymentError("no supernode-<i> service in the compose files")
    last = indices[-1]
    out = {name: spec for name, spec in services.items() if _party_of(name) is None or _party_of(name) < parties}
    template = json.dumps({name: services[f"{name}-{last}"] for name in PARTY_SERVICES})
    for i in range(last + 1, parties):
        text = re.sub(rf"\b({'|'.join(PARTY_SERVICES)})-{last}(?!\d)", rf"\g<1>-{i}", template)
        text = re.sub(rf"partition-id={last}(?!\d)", f"partition-id={i}", text)
        text = re.sub(rf"party-{last}-data(?!\d)", f"party-{i}-data", text)
        for name, spec in json.loads(text).items():
            out[f"{name}-{i}"] = spec
    return json.loads(re.sub(r"num-partitions=\d+", f"num-partitions={parties}", json.dumps(out)))


# ----------------------------------------------------------------------- native translation
@dataclass
class NativeService:
    name: str
    argv: list[str]
    health: list[str] | None
    depends_on: dict[str, str]


def listening_ports(command: Sequence[str]) -> list[int]:
    ports = [int(b) for a, b in zip(command, command[1:]) if a == "--port"]
    return ports + [int(m[1]) for arg in command if (m := re.fullmatch(r"0\.0\.0\.0:(\d+)", str(arg)))]


class Translator:
    """Container view -> this machine: ports, service names and mounted paths."""

    def __init__(self, services: dict[str, dict], mounts: dict[str, Path], volumes_root: Path):
        self.services = services
        listening = [
            (name, port) for name, spec in services.items() for port in listening_ports(spec.get("command", []))
        ]
        self.ports = dict(zip(listening, free_ports(len(listening)), strict=True))
        self.mounts = mounts
        self.volumes_root = volumes_root
        names = sorted(services, key=len, reverse=True)
        self._service_address = re.compile(rf"(?<![\w.-])({'|'.join(map(re.escape, names))}):(\d+)\b")
        # A SuperNode's --node-config names paths of the container its ClientApps run in: the
        # SuperExec whose --runtime-api-address points at it.
        self.app_container = {
            str(b).split(":")[0]: name
            for name, spec in services.items()
            for a, b in zip(spec.get("command", []), spec.get("command", [])[1:])
            if a == "--runtime-api-address"
        }

    def port(self, service: str, container_port: int) -> int:
        try:
            return self.ports[(service, container_port)]
        except KeyError:
            raise DeploymentError(f"{service}: nothing listens on container port {container_port}") from None

    def host_path(self, service: str, container_path: str) -> str | None:
        """Where `container_path` of `service` lives here (None when it is not under a mount)."""
        for target, source in sorted(self.services[service].get("volumes", {}).items(), key=lambda kv: -len(kv[0])):
            if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
                return str(self.source_dir(source)) + container_path[len(target.rstrip("/")) :]
        return None

    def source_dir(self, source: str) -> Path:
        """A volume's or bind mount's folder (or file) here; `mounts` may move a bind source's folder."""
        for given, here in self.mounts.items():
            if source == given or source.startswith(given.rstrip("/") + "/"):
                return Path(here) / Path(source).relative_to(given)
        if source.startswith("/"):
            return Path(source)
        path = self.volumes_root / source  # a named volume: a folder of its own
        path.mkdir(parents=True, exist_ok=True)
        return path

    def arg(self, service: str, value: str, previous: str | None) -> str:
        value = str(value)
        if previous == "--host" and value == "0.0.0.0":
            return "127.0.0.1"
        if previous == "--port":
            return str(self.port(service, int(value)))
        value = re.sub(r"\b0\.0\.0\.0:(\d+)\b", lambda m: f"127.0.0.1:{self.port(service, int(m[1]))}", value)
        value = re.sub(r"\blocalhost:(\d+)\b", lambda m: f"localhost:{self.port(service, int(m[1]))}", value)
        value = self._service_address.sub(lambda m: f"127.0.0.1:{self.port(m[1], int(m[2]))}", value)
        where = self.app_container.get(service, service) if previous == "--node-config" else service
        targets = sorted((t.rstrip("/") for t in self.services[where].get("volumes", {})), key=len, reverse=True)
        if targets:  # one pass, so a substituted path is never substituted again
            pattern = rf"(?<![\w.-])({'|'.join(map(re.escape, targets))})(?=$|[/'\"\s,])"
            value = re.sub(pattern, lambda m: self.host_path(where, m[1]), value)
        return value

    def args(self, service: str, values: Sequence[str]) -> list[str]:
        out, previous = [], None
        for value in values:
            out.append(self.arg(service, value, previous))
            previous = str(value)
        return out


def executable(spec: dict) -> list[str]:
    """What the container runs: its entrypoint, else the Flower binary its image starts."""
    if spec.get("entrypoint"):
        entry = list(spec["entrypoint"])
        return [sys.executable if entry[0] == "python" else str(BIN / entry[0]), *entry[1:]]
    image = str(spec.get("image", "")).rsplit("/", 1)[-1].split(":")[0]
    if image not in IMAGE_BINARIES:
        raise DeploymentError(
            f"image {spec.get('image')!r}: no native binary for it (known: {', '.join(IMAGE_BINARIES)})"
        )
    return [str(BIN / IMAGE_BINARIES[image])]


def native_services(services: dict[str, dict], translator: Translator) -> dict[str, NativeService]:
    out = {}
    for name, spec in services.items():
        test = (spec.get("healthcheck") or {}).get("test")
        health = None
        if test and test[0] == "CMD":
            health = translator.args(name, [sys.executable if test[1] == "python" else test[1], *test[2:]])
        elif test and test[0] == "CMD-SHELL":  # `python` comes first on the PATH of Deployment.env
            health = ["/bin/sh", "-c", translator.arg(name, test[1], None)]
        elif test:
            raise DeploymentError(f"{name}: healthcheck must be [CMD, ...] or [CMD-SHELL, command]")
        argv = executable(spec) + translator.args(name, spec.get("command", []))
        out[name] = NativeService(name, argv, health, dict(spec.get("depends_on", {})))
    return out


def startup_order(services: dict[str, NativeService]) -> list[str]:
    order, seen = [], set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in seen:
            return
        if name in path:
            raise DeploymentError(f"depends_on cycle: {' -> '.join(path + (name,))}")
        for dep in services[name].depends_on:
            visit(dep, path + (name,))
        seen.add(name)
        order.append(name)

    for name in services:
        visit(name, ())
    return order


# ------------------------------------------------------------------------------ deployment
def connection_toml(name: str, address: str, root_certificates: str | None) -> str:
    """A `[superlink.<name>]` entry of $FLWR_HOME/config.toml (docs/deployment.md shows the same)."""
    trust = f'root-certificates = "{root_certificates}"' if root_certificates else "insecure = true"
    return f'[superlink.{name}]\naddress = "{address}"\n{trust}\n'


class SuperLinkClient:
    """The flwr CLI on the host against a deployed SuperLink, as a user runs it: subclasses give
    `cli_env` (FLWR_HOME with the connection), `tls`, `run_config` and `results`."""

    tls: bool

    def start(self) -> SuperLinkClient:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def kill(self, service: str) -> None:
        raise NotImplementedError

    def __enter__(self) -> SuperLinkClient:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def connection(self) -> str:
        return "docker-tls" if self.tls else "docker"

    def cli_env(self) -> dict[str, str]:
        raise NotImplementedError

    def with_connection(self, env: dict[str, str], address: str, root_certificates: str | None) -> dict[str, str]:
        """`env` with this deployment's connection written to its FLWR_HOME's config.toml."""
        Path(env["FLWR_HOME"], "config.toml").write_text(connection_toml(self.connection, address, root_certificates))
        return env

    def kill_when(self, service: str, marker: str) -> tuple[Callable[[str], None], dict[str, float]]:
        """An on_line hook for flwr_run that kills `service` the moment the stream shows `marker`,
        and the dict that then holds the kill's time under "at"."""
        killed: dict[str, float] = {}

        def on_line(line: str) -> None:
            if not killed and marker in line:
                killed["at"] = time.time()
                self.kill(service)

        return on_line, killed

    def run_config(self, config: dict) -> dict:
        return config

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return launch.flwr(*args, env=self.cli_env(), cwd=REPO, timeout=timeout)

    def online_nodes(self) -> list[int]:
        out = self.flwr("supernode", "list", self.connection, "--format", "json")
        try:
            return [int(n["node-id"]) for n in json.loads(out.stdout)["nodes"] if n["status"] == "online"]
        except (ValueError, KeyError):
            return []

    def wait_online(self, count: int, timeout: float = 120.0) -> list[int]:
        """`flwr supernode list`, until `count` SuperNodes are online (as a user checks before `flwr run`)."""
        deadline = time.monotonic() + timeout
        while len(nodes := self.online_nodes()) < count:
            if time.monotonic() > deadline:
                raise DeploymentError(f"{len(nodes)} of {count} SuperNodes online after {timeout:.0f}s")
            time.sleep(1.0)
        return nodes

    def flwr_run(self, config: dict, timeout: float = 600.0, on_line: Callable[[str], None] | None = None) -> FlowerRun:
        """`flwr run . <connection> --stream` through the project's one driver (commands/launch.py)."""
        try:
            return launch.stream_run(
                self.run_config(config),
                self.cli_env(),
                connection=self.connection,
                app_dir=REPO,
                timeout=timeout,
                on_line=on_line,
            )
        except launch.LaunchError as err:
            raise DeploymentError(str(err)) from None


class Deployment(SuperLinkClient):
    """Start the compose services natively, wait for their health checks, stop them by process group."""

    def __init__(
        self,
        files: Sequence[Path] = (COMPOSE,),
        parties: int = 2,
        workdir: Path | None = None,
        mounts: dict[str, Path] | None = None,
        log: Callable[[str], None] = print,
    ):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fedsmix-deploy-"))
        self.services = with_parties(load_services(files), parties)
        self.parties = parties
        self.translator = Translator(self.services, dict(mounts or {}), self.workdir / "volumes")
        self.native = native_services(self.services, self.translator)
        self.procs: dict[str, subprocess.Popen] = {}
        self.log = log
        self.tls = "--insecure" not in self.services[SUPERLINK_SERVICE].get("command", [])

    # -- processes
    def env(self, name: str) -> dict[str, str]:
        home = self.workdir / "home" / name  # each container has a FLWR_HOME of its own
        home.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "FLWR_HOME": str(home),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PYTHONUNBUFFERED": "1",
        }

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def tail(self, name: str, lines: int = 25) -> str:
        path = self.log_path(name)
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def spawn(self, name: str) -> subprocess.Popen:
        service = self.native[name]
        self.log_path(name).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(name), "ab") as handle:
            proc = subprocess.Popen(
                service.argv,
                cwd=REPO,
                env=self.env(name),
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        self.log(f"started {name} (pid {proc.pid}): {' '.join(service.argv[1:])}")
        return proc

    def wait_healthy(self, name: str, timeout: float = 120.0) -> None:
        service, proc = self.native[name], self.procs[name]
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise DeploymentError(f"{name} exited with code {proc.returncode}:\n{self.tail(name)}")
            if service.health is None:
                return
            try:
                if subprocess.run(service.health, env=self.env(name), capture_output=True, timeout=15).returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise DeploymentError(f"{name} not healthy after {timeout:.0f}s:\n{self.tail(name)}")
            time.sleep(0.5)

    def wait_completed(self, name: str, timeout: float = 180.0) -> None:
        try:
            code = self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DeploymentError(f"{name} did not finish within {timeout:.0f}s:\n{self.tail(name)}") from None
        if code != 0:
            raise DeploymentError(f"{name} exited with code {code}:\n{self.tail(name)}")

    def start(self) -> Deployment:
        for name in startup_order(self.native):
            for dep, condition in self.native[name].depends_on.items():
                if condition == "service_healthy":
                    self.wait_healthy(dep)
                elif condition == "service_completed_successfully":
                    self.wait_completed(dep)
            self.spawn(name)
        for name in self.native:
            if name not in self.oneshots():
                self.wait_healthy(name)
        self.wait_online(self.parties)  # a SuperNode is healthy before the SuperLink knows it
        self.log(
            f"deployment up: {len(self.procs)} processes, {self.parties} parties, {'TLS' if self.tls else 'insecure'}"
        )
        return self

    def oneshots(self) -> set[str]:
        """Services others wait to finish (`service_completed_successfully`), not to be healthy."""
        return {
            d for s in self.native.values() for d, c in s.depends_on.items() if c == "service_completed_successfully"
        }

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill a service and everything it started (its process group), as `docker kill` would."""
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        self.log(f"killed {name} (pid {proc.pid}) with signal {sig}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process group, SIGKILL what is left after `grace`, reap everything."""
        for proc in reversed(list(self.procs.values())):
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            _signal_group(proc.pid, signal.SIGKILL)  # also children whose leader already exited
            proc.wait()

    def alive(self) -> list[int]:
        """PIDs of processes this deployment started (leaders and their groups) still alive."""
        groups = {proc.pid for proc in self.procs.values()}
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if stat[0] != "Z" and int(stat[2]) in groups:
                    pids.append(int(entry.name))
        return pids

    # -- the flwr CLI, as a user on the host runs it
    def cli_env(self) -> dict[str, str]:
        address = f"127.0.0.1:{self.translator.port(SUPERLINK_SERVICE, 8000)}"
        ca = self.translator.host_path(SUPERLINK_SERVICE, "/certs/ca.crt") if self.tls else None
        return self.with_connection(self.env("cli"), address, ca)

    def server_path(self, container_path: str) -> str:
        return self.translator.host_path(SERVERAPP_SERVICE, container_path) or container_path

    def run_config(self, config: dict) -> dict:
        """A run config in the containers' terms, with absolute paths mapped to the ServerApp's mounts."""
        return {k: self.server_path(v) if isinstance(v, str) and v.startswith("/") else v for k, v in config.items()}

    def results(self, config: dict) -> dict:
        """results.json of the newest run in the ServerApp's runs volume."""
        path = Path(self.run_config(config)["runs-dir"]) / "latest" / "results.json"
        if not path.exists():
            raise DeploymentError(f"no results at {path}")
        return json.loads(path.read_text())


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------------- checks
def check_demo(results: dict, parties: int, runs_dir: Path, dropped: frozenset[int] = frozenset()) -> list[str]:
    """What the smoke test demands of the demo run; an empty list when all holds. `dropped`: the
    parties FedProx must record as dropped (a SuperNode killed mid-run), none by default."""
    from server.store import UploadStore

    problems = []
    if results.get("num-parties") != parties:
        problems.append(f"num-parties {results.get('num-parties')}, expected {parties}")
    strategies = results.get("strategies", {})
    mix = strategies.get("mixup-union", {})
    expected = {str(p) for p in range(parties)}
    if set(mix.get("parties", {})) != expected or mix.get("rejected") or mix.get("dropped"):
        problems.append(
            f"mixup-union: uploads of parties {sorted(mix.get('parties', {}))}, "
            f"rejected {mix.get('rejected')}, dropped {mix.get('dropped')}"
        )
    store = UploadStore(Path(results["run-dir"]) / "uploads")
    if set(map(str, store.parties())) != expected or store.verify():
        problems.append(f"upload store: parties {store.parties()}, sha256 mismatches {store.verify()}")
    prox = strategies.get("fedprox", {})
    rounds = results.get("settings", {}).get("rounds")
    lost = {record.get("party") for record in prox.get("dropped") or []}
    if [p["round"] for p in prox.get("curve", [])] != list(range((rounds or 0) + 1)) or lost != set(dropped):
        problems.append(f"fedprox: curve {prox.get('curve')}, dropped {prox.get('dropped')}, expected {set(dropped)}")
    for name, floor in MIN_ACCURACY.items():
        accuracy = strategies.get(name, {}).get("accuracy")
        if not isinstance(accuracy, float) or accuracy < floor:
            problems.append(f"{name}: accuracy {accuracy} below {floor} (chance {CHANCE})")
    if Path(results["run-dir"]).resolve().parent != runs_dir.resolve():
        problems.append(f"run dir {results['run-dir']} is not in the runs volume {runs_dir}")
    return problems


def answers_plain_http(port: int, host: str = "127.0.0.1") -> bool:
    """Whether the SuperLink's /health answers over plain HTTP (over TLS the handshake fails)."""
    try:
        urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10)
        return True
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return False


def tls_checks(deployment: Deployment) -> list[str]:
    """TLS is really on, and SuperNode authentication really refuses an unregistered key."""
    from deploy.make_certs import authentication_key

    problems = []
    if answers_plain_http(deployment.translator.port(SUPERLINK_SERVICE, 8000)):
        problems.append("the SuperLink answered plain HTTP")
    key = deployment.workdir / "unregistered.auth-key"
    authentication_key(key, comment="unregistered")
    argv = list(deployment.native["supernode-0"].argv)
    argv[argv.index("--auth-supernode-private-key") + 1] = str(key)
    argv[argv.index("--port") + 1] = str(free_port())
    deployment.native["unregistered-supernode"] = NativeService("unregistered-supernode", argv, None, {})
    proc = deployment.spawn("unregistered-supernode")
    try:
        code = proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        return problems + ["a SuperNode with an unregistered key was still running after 180s"]
    if code == 0 or "Failed to activate" not in deployment.tail("unregistered-supernode", 60):
        problems.append(f"an unregistered SuperNode exited with {code}: {deployment.tail('unregistered-supernode')}")
    return problems


def run_summary(tls: bool, parties: int, run: FlowerRun, results: dict) -> dict:
    """What a deployment's demo run reports, natively and in containers."""
    return {
        "tls": tls,
        "parties": parties,
        "run-id": run.run_id,
        "status": run.status,
        "accuracy": {name: res.get("accuracy") for name, res in results["strategies"].items()},
        "run-seconds": round(run.seconds, 1),
    }


def smoke(
    tls: bool = False, parties: int | None = None, workdir: Path | None = None, log: Callable[[str], None] = print
) -> dict:
    """Bring the deployment up natively, run, check, tear everything down. In the clear: three
    parties (by default), FAULT_RUN with the last party's SuperNode killed when FedProx's round 2
    starts. Over TLS: two parties, the demo run, and an unregistered SuperNode refused."""
    from deploy.make_certs import make_deployment_certs

    parties = parties or (2 if tls else 3)
    if not tls and parties < FAULT_RUN["min-parties"] + 1:
        raise DeploymentError(
            f"parties: {parties}; the run in the clear kills one SuperNode and keeps min-parties "
            f"{FAULT_RUN['min-parties']}, so it needs at least {FAULT_RUN['min-parties'] + 1}"
        )
    t0 = time.monotonic()
    workdir = Path(workdir or tempfile.mkdtemp(prefix="fedsmix-smoke-"))
    files, mounts = [COMPOSE], {}
    if tls:
        files.append(TLS_OVERLAY)
        mounts[str((REPO / "deploy" / "certs").resolve())] = make_deployment_certs(workdir / "certs", parties)
    config, victim = demo_run(tls, parties)
    deployment = Deployment(files, parties, workdir, mounts, log)
    with deployment:
        up = time.monotonic() - t0
        on_line, killed = deployment.kill_when(victim, KILL_AT) if victim else (None, {})
        run = deployment.flwr_run(config, on_line=on_line)
        if not run.ok:
            raise DeploymentError(f"run {run.run_id}: {run.status} {run.details}\n{run.output[-3000:]}")
        results = deployment.results(config)
        runs_dir = Path(deployment.run_config(config)["runs-dir"])
        problems = tls_checks(deployment) if tls else []
        problems += kill_problems(victim, killed, victim is not None and deployment.procs[victim].poll() is None)
    leftovers = deployment.alive()
    problems += check_demo(results, parties, runs_dir, frozenset({parties - 1}) if victim else frozenset())
    return {
        **run_summary(tls, parties, run, results),
        "dropped": results["strategies"].get("fedprox", {}).get("dropped"),
        "killed-at": killed.get("at") if killed else None,
        "startup-seconds": round(up, 1),
        "wall-seconds": round(time.monotonic() - t0, 1),
        "leftover-pids": leftovers,
        "problems": problems,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tls", action="store_true", help="add docker-compose.tls.yml (TLS and SuperNode authentication)"
    )
    parser.add_argument("--parties", type=int, help="default: 3 in the clear (one is killed), 2 over TLS")
    parser.add_argument("--workdir", type=Path, help="keep logs, volumes and homes here (default: a temporary folder)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedsmix-smoke-"))
    try:
        summary = smoke(args.tls, args.parties, workdir)
    except DeploymentError as err:
        print(f"smoke: FAILED: {err}\n(logs kept in {workdir / 'logs'})", file=sys.stderr)
        return 1
    summary.pop("results")
    print(json.dumps(summary, indent=2))
    ok = not summary["problems"] and not summary["leftover-pids"]
    if ok and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
