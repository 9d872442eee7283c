"""Shared by the benchmark scripts: JSON output, machine context, and a process-tree memory sampler.

Benchmarks are scripts, not tests: each measures ratios inside one run (both sides under the
same machine load) and writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import threading
import time
from pathlib import Path

# Threads that wait at an OpenMP barrier spin by default; on a box shared with other busy
# processes (this one: 2 cores, six agents) the spinning steals the CPU from the thread with
# work, and small torch ops run 3-10x slower. Set before torch loads libgomp; Ray workers and
# `flwr run`'s processes inherit it, so both sides of every ratio run under the same policy.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PROJECT = Path(__file__).resolve().parent.parent
if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))
RESULTS = PROJECT / "benchmarks" / "results"

from commands.launch import process_children  # noqa: E402  (after the path above)

DATA_DIR = str((PROJECT.parent / "shared" / "data").resolve())


def machine() -> dict:
    import torch

    return {
        "cpus": os.cpu_count(),
        "torch-threads": torch.get_num_threads(),
        "load-average": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
    }


def write(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {
        "benchmark": name,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"wrote {path.relative_to(PROJECT)}")
    return path


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _rss_kib(pid: int) -> int:
    """Resident set of one process from /proc/<pid>/statm (cheap: read every sample)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0


def _pss_kib(pid: int) -> int:
    """Proportional set (shared pages split among their users): the kernel walks the page
    tables for it, so it is read only at a new peak."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_kinds_kib(pid: int) -> dict[str, int]:
    """RssAnon (heap, tensors), RssFile (mapped files: libraries, the memory-mapped uploads;
    page cache the kernel may drop) and RssShmem (Ray's object store) of one process."""
    kinds = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                key, value = line.split()[:2]
                kinds[key.rstrip(":")] = int(value)
    except OSError:
        pass
    return kinds


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return ""


class TreeMemorySampler:
    """Samples, every `interval` s, the summed RSS of every process under the roots (and, at
    each new peak, their PSS and a per-process breakdown); also each process's CPU time.

    Roots: this process, plus whatever `extra_roots()` returns at each sample (e.g. the detached
    local SuperLink that `flwr run` starts, which is not our child). RSS counts shared pages
    (libraries, Ray's shared-memory object store) once per process; PSS splits them.
    """

    def __init__(self, interval: float = 0.5, extra_roots=None):
        self.interval, self.extra_roots = interval, extra_roots or (lambda: [])
        self.peak_rss = self.peak_pss = 0
        self.peak_processes: list[tuple[int, int, str]] = []
        self.samples = 0
        self.cpu: dict[int, float] = {}  # pid -> latest CPU seconds
        self.commands: dict[int, str] = {}
        self.most_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            tree = process_children()
            todo, seen = [os.getpid(), *self.extra_roots()], set()
            while todo:
                pid = todo.pop()
                if pid not in seen:
                    seen.add(pid)
                    todo.extend(tree.get(pid, []))
            rss_by_pid = {pid: _rss_kib(pid) for pid in seen}
            for pid, rss_kib in rss_by_pid.items():
                if rss_kib:
                    self.commands[pid] = _command(pid)  # Ray workers rename themselves (ray::IDLE -> actor)
                    self.cpu[pid] = _cpu_seconds(pid)
            rss = sum(rss_by_pid.values())
            self.most_processes = max(self.most_processes, sum(1 for v in rss_by_pid.values() if v))
            self.samples += 1
            if rss > self.peak_rss:
                rows = [
                    (r, _pss_kib(pid), self.commands.get(pid, ""), _rss_kinds_kib(pid))
                    for pid, r in rss_by_pid.items()
                    if r
                ]
                self.peak_rss, self.peak_pss = rss, sum(r[1] for r in rows)
                self.peak_processes = sorted(rows, key=lambda row: -row[0])
            self._stop.wait(self.interval)

    def cpu_by_command(self) -> dict[str, float]:
        """CPU seconds per kind of process over the run (as last sampled; a short-lived one may be missed)."""
        totals: dict[str, float] = {}
        for pid, seconds in self.cpu.items():
            command = self.commands.get(pid, "")
            words = [w for w in command.split() if not w.startswith("-") and not Path(w).name.startswith("python")]
            name = Path(words[0]).name if words else "python"
            if "default_worker.py" in command:
                name = "ray worker (party actor)"
            totals[name] = totals.get(name, 0.0) + seconds
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

    def report(self) -> dict:
        return {
            "cpu-seconds-by-process": self.cpu_by_command(),
            "peak-rss-gib": self.peak_rss / 2**20,
            "pss-at-peak-gib": self.peak_pss / 2**20,
            "samples": self.samples,
            "most-processes-at-once": self.most_processes,
            "at-peak-by-kind-gib": {
                kind: sum(row[3].get(kind, 0) for row in self.peak_processes) / 2**20
                for kind in ("RssAnon", "RssFile", "RssShmem")
            },
            "at-peak": [
                {"rss-mib": r // 1024, "pss-mib": p // 1024, **{k: v // 1024 for k, v in kinds.items()}, "command": c}
                for r, p, c, kinds in self.peak_processes[:15]
            ],
        }


def through_flower(overrides: dict, parties: int, runs: Path) -> tuple[float, dict, dict]:
    """`flwr run` of `overrides` with `parties` simulated parties (Flower's simulation engine, the default
    federation) from a fresh SuperLink: wall seconds end to end, the run's results.json, the process tree's memory."""
    from commands.federation import DEFAULT_FEDERATION
    from commands.launch import flower_env, flwr_run, free_ports, interrupt, superlink_pids

    ports = tuple(free_ports(2))
    home = PROJECT / "benchmarks" / ".flwr"
    env = flower_env(home, ports)
    t0 = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, interrupt)  # a stopped benchmark stops its SuperLink, Ray and all
    try:
        with TreeMemorySampler(extra_roots=lambda: superlink_pids(env)) as memory:
            run = flwr_run(overrides, parties, DEFAULT_FEDERATION, flwr_home=home, ports=ports, echo=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
    seconds = time.perf_counter() - t0
    if not run.ok:
        raise SystemExit(f"flwr run failed at {parties} parties ({run.status}):\n{run.output[-3000:]}")
    return seconds, json.loads((runs / "latest" / "results.json").read_text()), memory.report()
