"""Register SuperNode public keys with a SuperLink that runs `--enable-supernode-auth`.

    python -m deploy.register_supernodes --superlink superlink:8000 \
        --root-certificates /certs/ca.crt /certs/supernodes.pub

A SuperNode whose key is not registered is refused (it exits with Flower's code 305), so this
runs once after the SuperLink is healthy and before any SuperNode starts (the compose TLS
overlay's `register-supernodes` service; the native smoke test runs the same command). A key
file holds one OpenSSH public key per line, like `authorized_keys`. Keys already registered
count as done, so a restart does not fail. Goes through `flwr supernode register`, Flower's CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONNECTION = "target"


def public_keys(paths: list[Path], folder: Path) -> dict[str, Path]:
    """Each public key line (named by its comment) as a file of its own, which `flwr supernode
    register` reads, written to `folder`."""
    keys: dict[str, Path] = {}
    for path in paths:
        lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        if not lines:
            raise SystemExit(f"register-supernodes: no public key in {path}")
        for line in lines:
            fields = line.split()
            name = fields[2] if len(fields) > 2 else f"key-{len(keys)}"
            keys[name] = folder / f"{len(keys):03d}.pub"
            keys[name].write_text(line + "\n")
    return keys


def flwr_command() -> str:
    beside = Path(sys.executable).parent / "flwr"
    return str(beside) if beside.exists() else "flwr"


def register(key: Path, env: dict[str, str]) -> str:
    """Node id of the registered key; 'already registered' when the SuperLink knows it."""
    out = subprocess.run(
        [flwr_command(), "supernode", "register", str(key), CONNECTION, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    text = out.stdout + out.stderr
    if "already in use" in text:
        return "already registered"
    try:
        reply = json.loads(out.stdout[out.stdout.index("{") :])
    except ValueError:
        reply = {}
    if out.returncode != 0 or not reply.get("success"):
        raise RuntimeError(f"flwr supernode register {key} failed (exit {out.returncode}): {text.strip()[-600:]}")
    return str(reply["node-id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("keys", nargs="+", type=Path, help="files of OpenSSH public keys, one per line")
    parser.add_argument("--superlink", required=True, help="SuperLink address host:port")
    parser.add_argument("--root-certificates", required=True, type=Path, help="CA certificate of the SuperLink")
    parser.add_argument("--retries", type=int, default=10, help="attempts per key while the SuperLink comes up")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flwr-home-") as home:
        keys = public_keys(args.keys, Path(home))
        Path(home, "config.toml").write_text(
            f'[superlink.{CONNECTION}]\naddress = "{args.superlink}"\n'
            f'root-certificates = "{args.root_certificates.resolve()}"\n'
        )
        env = {**os.environ, "FLWR_HOME": home, "FLWR_DISABLE_UPDATE_CHECK": "1"}
        for name, key in keys.items():
            for attempt in range(1, args.retries + 1):
                try:
                    print(f"register-supernodes: {name}: {register(key, env)}", flush=True)
                    break
                except (RuntimeError, subprocess.TimeoutExpired) as err:
                    if attempt == args.retries:
                        print(f"register-supernodes: {err}", file=sys.stderr)
                        return 1
                    time.sleep(2.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
