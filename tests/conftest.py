"""Shared fixtures: small slices of real data, temporary run dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SHARED_DATA = PROJECT.parent / "shared" / "data"

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture(scope="session")
def data_dir() -> str:
    if not (SHARED_DATA / "mnist.npz").exists():
        pytest.fail(f"real data expected in {SHARED_DATA} (see ../shared/data/README.md)")
    return str(SHARED_DATA)


@pytest.fixture
def runs_dir(tmp_path) -> str:
    return str(tmp_path / "runs")
