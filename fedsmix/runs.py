"""Run directories: runs/<timestamp>-<name>/, atomic writes, and a `latest` link."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=_jsonable) + "\n").encode())


def atomic_save_npy(path: Path, array: np.ndarray) -> str:
    """Save an array atomically and return its sha256 (of the .npy file bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, array)
        handle.flush()
        os.fsync(handle.fileno())
    digest = sha256_file(tmp)
    os.replace(tmp, path)
    return digest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, set | tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def new_run_dir(runs_dir: str | Path, name: str = "", run_id: int | str | None = None) -> Path:
    """Create runs/<UTC time>-<name or run id>/ and point runs/latest at it."""
    root = Path(runs_dir).expanduser()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    label = "-".join(str(p) for p in (name, run_id) if p not in ("", None)) or "run"
    path = root / f"{stamp}-{label}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = root / f"{stamp}-{label}-{suffix}"
    path.mkdir(parents=True)
    link_latest(root, path)
    return path


def link_latest(root: Path, target: Path) -> None:
    latest = root / "latest"
    tmp = root / f".latest.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, latest)
