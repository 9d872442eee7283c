"""The one `flwr run` driver: a local simulation (`fedsmix run`, the grid's flwr engine, benchmarks)
and a deployed SuperLink (deploy/smoke.py) go through `stream_run`.

Flower 1.42 keeps federations in $FLWR_HOME/config.toml, starts a detached local SuperLink on
first use and leaves it running, and `flwr run --stream` exits 0 even when the ServerApp fails.
The driver reads the run id from the stream, the run's real status from `flwr ls`, never waits
past its timeout, and `flwr_run` stops the local SuperLink it started, by PID. It only shells
out: no Flower import.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedsmix.config import PROJECT_ROOT

CONFIG_TOML = """[superlink]
default = "local"

[superlink.local]
address = ":local:"
"""
RUN_ID = re.compile(r"started run (\d+)")  # flwr/cli/run/run.py: "Successfully started run <id>"
# Lines of `flwr run --stream` that contradict what fedsmix did or ask nothing of its user: hidden from the
# console (the run's flwr-run.log keeps every line; `fedsmix run --verbose` shows them)
NOISE = re.compile(
    r"default simulated SuperNodes changed from 10 to 2"  # fedsmix always passes num-supernodes
    r"|To change federation size, use the following command|flwr federation simulation-config"
    r"|Successfully installed fedsmix to "  # the app's FAB, installed into FLWR_HOME for every run
    r"|Ray will no longer override accelerator visible devices|^\s*warnings\.warn\($"  # Ray's FutureWarning
)


class LaunchError(RuntimeError):
    pass


@dataclass
class FlowerRun:
    run_id: int | None
    status: str  # from `flwr ls`, e.g. "finished:completed"
    returncode: int | None
    output: str
    details: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: every socket stays bound until all are drawn (a port released
    and drawn again would otherwise be handed out twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def free_port() -> int:
    return free_ports(1)[0]


def config_arg(values: dict) -> str:
    """A dict as `--run-config` / `--federation-config` text (TOML values)."""
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            parts.append(f"{key}={'true' if value else 'false'}")
        elif isinstance(value, int | float):
            parts.append(f"{key}={value!r}")
        else:
            parts.append(f"{key}={json.dumps(str(value))}")
    return " ".join(parts)


def flower_env(
    flwr_home: Path | None = None, ports: tuple[int, int] | None = None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment for `flwr`: project-local FLWR_HOME, no runtime dependency install, /tmp for Ray.

    `extra` (e.g. RAY_ADDRESS) reaches the SuperLink `flwr run` starts and its simulation process.
    """
    env = {**os.environ, **(extra or {})}
    home = Path(flwr_home or env.get("FLWR_HOME") or PROJECT_ROOT / ".flwr")
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "config.toml").exists():
        (home / "config.toml").write_text(CONFIG_TOML)
    env["FLWR_HOME"] = str(home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("RAY_TMPDIR", "/tmp/ray")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ports is not None:
        env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"], env["FLWR_LOCAL_CONTROL_API_PORT"] = map(str, ports)
    bin_dir = str(Path(sys.executable).parent)  # the venv's flwr and flower-superlink
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def flwr(*args: str, env: dict[str, str], cwd: Path = PROJECT_ROOT, timeout: float = 60) -> subprocess.CompletedProcess:
    """The `flwr` command line of this environment."""
    return subprocess.run([_flwr_binary(), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_status(
    run_id: int, env: dict[str, str], connection: str | None = None, cwd: Path = PROJECT_ROOT
) -> tuple[str, str]:
    """(status, status details) of a run, from `flwr ls`."""
    out = flwr(
        "ls", *([connection] if connection else []), "--run-id", str(run_id), "--format", "json", env=env, cwd=cwd
    )
    try:
        run = json.loads(out.stdout)["runs"][0]
        return str(run.get("status", "unknown")), str(run.get("status-details", ""))
    except (ValueError, KeyError, IndexError, TypeError):
        return "unknown", (out.stdout + out.stderr).strip()[-500:]


def stream_run(
    run_config: dict,
    env: dict[str, str],
    *,
    connection: str | None = None,
    federation_config: dict | None = None,
    app_dir: Path = PROJECT_ROOT,
    timeout: float | None = None,
    on_line: Callable[[str], None] | None = None,
    echo: bool = False,
    verbose: bool = False,
) -> FlowerRun:
    """`flwr run <app> [<connection>] --stream`; the status comes from `flwr ls` (the exit code of
    `flwr run --stream` says nothing about the ServerApp). Past `timeout` the run is stopped and
    LaunchError raised. `echo` prints the stream, less the NOISE lines unless `verbose`."""
    argv = [_flwr_binary(), "run", str(app_dir), *([connection] if connection else []), "--stream"]
    if federation_config:
        argv += ["--federation-config", config_arg(federation_config)]
    if run_config:
        argv += ["--run-config", config_arg(run_config)]
    t0 = time.monotonic()
    deadline = t0 + timeout if timeout else float("inf")
    proc = subprocess.Popen(
        argv, env=env, cwd=app_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    output: list[str] = []
    run_id = None
    try:
        while True:
            if time.monotonic() > deadline:
                if run_id is not None:
                    flwr("stop", str(run_id), *([connection] if connection else []), env=env, cwd=app_dir)
                raise LaunchError(f"run {run_id} did not finish within {timeout:.0f}s:\n{''.join(output)[-3000:]}")
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                break
            output.append(line)
            if echo and (verbose or not NOISE.search(line)):
                print(line, end="", flush=True)
            if run_id is None and (match := RUN_ID.search(line)):
                run_id = int(match[1])
            if on_line:
                on_line(line)
        returncode = proc.wait()
    finally:
        _signal_group(proc.pid, signal.SIGKILL)  # the stream's process group, should it still be there
        proc.wait()
    if run_id is None:
        return FlowerRun(None, "not started", returncode, "".join(output), seconds=time.monotonic() - t0)
    status, details = run_status(run_id, env, connection, app_dir)
    settle = min(deadline, time.monotonic() + 30)
    while not status.startswith("finished") and time.monotonic() < settle:
        time.sleep(1.0)  # the stream can end a moment before the SuperLink records the status
        status, details = run_status(run_id, env, connection, app_dir)
    return FlowerRun(run_id, status, returncode, "".join(output), details, time.monotonic() - t0)


def flwr_run(
    run_config: dict,
    num_supernodes: int,
    federation_config: dict | None = None,
    app_dir: Path = PROJECT_ROOT,
    flwr_home: Path | None = None,
    ports: tuple[int, int] | None = None,
    echo: bool = True,
    stop_superlink: bool = True,
    environment: dict[str, str] | None = None,
    timeout: float | None = None,
    verbose: bool = False,
) -> FlowerRun:
    """A local simulation through `flwr run`: `stream_run` against the local SuperLink, which is
    stopped afterwards (by PID) when this call started it.

    `federation_config` holds Flower's federation-config keys (commands.federation.flower_part);
    `num_supernodes` wins over a `num-supernodes` in it.
    """
    env = flower_env(flwr_home, ports, environment)
    already_running = set(superlink_pids(env))
    federation = {**(federation_config or {}), "num-supernodes": num_supernodes}
    try:
        return stream_run(run_config, env, federation_config=federation, app_dir=app_dir, timeout=timeout, echo=echo,
                          verbose=verbose)
    finally:  # also on Ctrl-C or SIGTERM: the SuperLink this call started, and all it started (the simulation, Ray)
        if stop_superlink:
            started = [p for p in superlink_pids(env) if p not in already_running]
            stop_pids(started + descendants(started))


def interrupt(signum, frame) -> None:
    """A signal handler: SIGTERM stops a run as Ctrl-C does (`flwr_run`'s cleanup runs on the way out)."""
    raise KeyboardInterrupt(f"signal {signum}")


def superlink_pids(env: dict[str, str]) -> list[int]:
    """PIDs of local SuperLinks using this FLWR_HOME and control port (read from /proc)."""
    port = env.get("FLWR_LOCAL_CONTROL_API_PORT", "39093")
    home = env["FLWR_HOME"]
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = b" ".join(args).decode(errors="replace")
        if "flower-superlink" in line and f"127.0.0.1:{port}" in line and home in line:
            pids.append(int(proc.name))
    return pids


def process_children() -> dict[int, list[int]]:
    """Parent pid -> its children's pids, read from /proc."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    return children


def descendants(pids: list[int]) -> list[int]:
    """Every process below `pids` (children, theirs, ...): looked up before the parents stop, since an orphan's
    parent becomes init."""
    children = process_children()
    found, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_pids(pids: list[int], grace: float = 10.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            try:
                if (Path(f"/proc/{pid}/stat").read_text().split()[2]) == "Z":
                    break
            except OSError:
                break
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _flwr_binary() -> str:
    local = Path(sys.executable).parent / "flwr"
    if local.exists():
        return str(local)
    found = shutil.which("flwr")
    if found is None:
        raise LaunchError(
            "the `flwr` command is not installed in this environment (pip install 'flwr[simulation]==1.42.*')"
        )
    return found


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
