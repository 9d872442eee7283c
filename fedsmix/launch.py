"""Drive `flwr run` for a local simulation, and clean up after it.

Flower 1.42 keeps federations in $FLWR_HOME/config.toml, starts a detached local SuperLink on
first use and leaves it running, and `flwr run --stream` exits 0 even when the ServerApp
fails. This wrapper keeps FLWR_HOME inside the project, checks the run's real status with
`flwr ls`, and stops the SuperLink it started, by PID. It only shells out: no Flower import.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .config import PROJECT_ROOT

CONFIG_TOML = """[superlink]
default = "local"

[superlink.local]
address = ":local:"
"""


class LaunchError(RuntimeError):
    pass


@dataclass
class FlowerRun:
    run_id: int | None
    status: str
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.status.endswith("completed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _config_arg(values: dict) -> str:
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            parts.append(f"{key}={'true' if value else 'false'}")
        elif isinstance(value, int | float):
            parts.append(f"{key}={value!r}")
        else:
            parts.append(f"{key}={json.dumps(str(value))}")
    return " ".join(parts)


def run_status(run_id: int, env: dict[str, str], app_dir: Path) -> str:
    out = subprocess.run(
        ["flwr", "ls", "--run-id", str(run_id), "--format", "json"], env=env, cwd=app_dir, capture_output=True, text=True
    )
    try:
        data = json.loads(out.stdout)
        runs = data.get("runs") or []
        return str(runs[0].get("status", "unknown")) if runs else "unknown"
    except (json.JSONDecodeError, AttributeError, IndexError):
        match = re.search(r"finished:\w+|running|pending|starting", out.stdout)
        return match.group(0) if match else f"unknown ({out.stdout.strip()[:200]} {out.stderr.strip()[:200]})"


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
) -> FlowerRun:
    """`flwr run <app> --stream` with overrides; returns the run's status from `flwr ls`.

    `federation_config` holds Flower's federation-config keys (fedsmix.federation.flower_part);
    `num_supernodes` wins over a `num-supernodes` in it.
    """
    if shutil.which("flwr", path=str(Path(sys.executable).parent)) is None and shutil.which("flwr") is None:
        raise LaunchError("the `flwr` command is not installed in this environment (pip install 'flwr[simulation]==1.42.*')")
    env = flower_env(flwr_home, ports, environment)
    already_running = set(superlink_pids(env))
    federation = {**(federation_config or {}), "num-supernodes": num_supernodes}
    cmd = ["flwr", "run", str(app_dir), "--stream", "--federation-config", _config_arg(federation)]
    if run_config:
        cmd += ["--run-config", _config_arg(run_config)]
    output: list[str] = []
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=app_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if echo:
                print(line, end="", flush=True)
        returncode = proc.wait()
        text = "".join(output)
        match = re.search(r"run (\d+)", text) or re.search(r"Run ID[^\d]*(\d+)", text)
        run_id = int(match.group(1)) if match else None
        status = run_status(run_id, env, app_dir) if run_id is not None else "not started"
        deadline = time.monotonic() + 30
        while run_id is not None and not status.startswith("finished") and time.monotonic() < deadline:
            time.sleep(1)  # the stream can end a moment before the SuperLink records the status
            status = run_status(run_id, env, app_dir)
        return FlowerRun(run_id, status, returncode, text)
    finally:
        if stop_superlink:
            stop_pids([p for p in superlink_pids(env) if p not in already_running])
