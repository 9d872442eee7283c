"""Shared by the benchmark scripts: JSON output, machine context, and a process-tree memory sampler.

Benchmarks are scripts, not tests: each measures ratios inside one run (both sides under the
same machine load) and writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import json
import os
import platform
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
    data = {"benchmark": name, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(), **data}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"wrote {path.relative_to(PROJECT)}")
    return path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(proc.name))
    return tree


def _memory_kib(pid: int) -> tuple[int, int, str]:
    """(RSS, PSS) in KiB and the command name of one process; zeros when it is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
        name = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return 0, 0, ""
    return rss, pss, name


class TreeMemorySampler:
    """Samples, every `interval` s, the summed RSS and PSS of every process under the roots.

    Roots: this process, plus whatever `extra_roots()` returns at each sample (e.g. the detached
    local SuperLink that `flwr run` starts, which is not our child). RSS counts shared pages
    (libraries, Ray's shared-memory object store) once per process; PSS splits them.
    """

    def __init__(self, interval: float = 0.5, extra_roots=None):
        self.interval, self.extra_roots = interval, extra_roots or (lambda: [])
        self.peak_rss = self.peak_pss = 0
        self.peak_processes: list[tuple[int, int, str]] = []
        self.samples = 0
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
            tree = _children()
            todo, seen = [os.getpid(), *self.extra_roots()], set()
            while todo:
                pid = todo.pop()
                if pid not in seen:
                    seen.add(pid)
                    todo.extend(tree.get(pid, []))
            rows = [(*_memory_kib(pid), pid) for pid in seen]
            rss, pss = sum(r[0] for r in rows), sum(r[1] for r in rows)
            self.samples += 1
            if rss > self.peak_rss:
                self.peak_rss = rss
                self.peak_processes = sorted(((r[0], r[1], r[2]) for r in rows if r[0]), reverse=True)
            self.peak_pss = max(self.peak_pss, pss)
            self._stop.wait(self.interval)

    def report(self) -> dict:
        return {
            "peak-rss-gib": self.peak_rss / 2**20,
            "peak-pss-gib": self.peak_pss / 2**20,
            "samples": self.samples,
            "at-peak": [{"rss-mib": r // 1024, "pss-mib": p // 1024, "command": c} for r, p, c in self.peak_processes[:15]],
        }
