"""The numerics-sensitive test files again, with PyTorch's CPU kernels forced to each lower level this CPU
offers (`ATEN_CPU_CAPABILITY`: `default` is the scalar code, then `avx2`, `avx512`): what they pin (upload
bytes, bit-identical reruns, exact recoveries, tolerances) must hold on every x86 CPU, not only on the one that
runs the suite (docs/reliability.md, "Reproducibility"). The native level is the rest of the suite's own run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# files that pin bits or tight tolerances of tensor arithmetic (digests, exact solves, same-seed reruns)
NUMERICS = (
    "test_replay.py",
    "test_encoders.py",
    "test_training.py",
    "test_pairing.py",
    "test_instahide.py",
    "test_mixing_attacks.py",
    "test_paper_settings.py",
    "test_scale.py",
)
LEVELS = ("default", "avx2", "avx512")  # lowest first, as torch.backends.cpu.get_cpu_capability() names them


def _lower_levels() -> list[str]:
    import torch

    native = torch.backends.cpu.get_cpu_capability().lower()
    return list(LEVELS[: LEVELS.index(native)]) if native in LEVELS else ["default"]


def _forced(level: str) -> dict[str, str]:
    return {**os.environ, "ATEN_CPU_CAPABILITY": level}


@pytest.mark.slow
@pytest.mark.parametrize("level", _lower_levels())
def test_numerics_hold_with_the_cpu_kernels_forced_lower(level):
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    reported = subprocess.run([sys.executable, "-c", probe], env=_forced(level), capture_output=True, text=True)
    assert reported.stdout.strip().lower() == level, reported.stdout + reported.stderr  # the level really is forced
    files = [str(REPO / "tests" / name) for name in NUMERICS]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow and not sim", *files],
        env=_forced(level), cwd=REPO, capture_output=True, text=True, timeout=1500,
    )
    assert run.returncode == 0, f"ATEN_CPU_CAPABILITY={level}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
