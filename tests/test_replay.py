"""Same seeds, same bytes: the party module reproduces the uploads and weights recorded before the
structural refactor (issue 18), through the Flower-free engine that calls the same party steps as the
ClientApp. tests/data/pre-refactor-digests.json was written by the pre-refactor code on one thread.

Uploads are numpy and the same on every x86 CPU. Training digests depend on the kernels PyTorch dispatches to:
the pre-refactor ones hold on the CPUs this project ran on until 2026-11-27; an AVX2-only CPU (no AVX-512) rounds
differently, to the same accuracy. `training-by-cpu-capability` holds the digests of such a CPU (AVX2: written on
2026-11-27 by the code that gave the pre-refactor digests on the other CPUs at the last CI run), picked by
`torch.backends.cpu.get_cpu_capability()`; any other capability is held to the pre-refactor digests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from commands import direct
from fedsmix.config import load_settings
from fedsmix.party import prepare_upload
from fedsmix.space import load_test

RECORDED = json.loads((Path(__file__).parent / "data" / "pre-refactor-digests.json").read_text())
pytestmark = pytest.mark.usefixtures("one_thread")  # training digests depend on the thread count


def _trained() -> dict:
    """The training digests recorded for this CPU's kernels (see the module docstring)."""
    import torch

    return RECORDED.get("training-by-cpu-capability", {}).get(torch.backends.cpu.get_cpu_capability(), RECORDED)


def _settings(data_dir: str, **extra):
    return load_settings({**RECORDED["settings"], "data-dir": data_dir, **extra})


def _sha(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("encoder", ["singularized", "mixup", "instahide-inside", "instahide-cross"])
def test_uploads_are_the_recorded_bytes(data_dir, encoder):
    settings = _settings(data_dir, encoder=encoder, **({"mix-k": 4} if encoder != "singularized" else {}))
    for party in range(RECORDED["parties"]):
        upload = prepare_upload(settings, party, RECORDED["parties"])
        assert upload.arrays["x"].dtype == np.float32
        assert _sha(upload.arrays["x"], upload.arrays["y"]) == RECORDED["uploads"][f"{encoder}/{party}"], party


def test_models_are_the_recorded_weights(data_dir):
    settings, parties, trained = _settings(data_dir), RECORDED["parties"], _trained()
    test = load_test(settings)
    mix = direct.mixup_union(settings.replace(trainer="mlp", return_model=False), parties, test, "cpu")
    assert mix["weights-sha256"] == trained["mixup-union"]["weights"]
    assert mix["accuracy"] == trained["mixup-union"]["accuracy"]
    for mode in ("fedavg", "fedprox"):
        assert direct.federated(settings, parties, test, "cpu", mode)["weights-sha256"] == trained[mode], mode
    assert direct.centralized(settings, parties, test, "cpu")["weights-sha256"] == trained["centralized"]


def test_local_training_is_the_recorded_step(data_dir):
    from fedsmix.models import new_classifier
    from fedsmix.party import load_partition, train_local
    from fedsmix.space import mixing_shape
    from fedsmix.training import state_digest

    settings = _settings(data_dir)
    initial = new_classifier(settings, mixing_shape(settings), 10).state_dict()
    result = train_local(settings, load_partition(settings, 0, RECORDED["parties"]), initial, mode="local-only")
    assert state_digest(result.model) == _trained()["local-only-0"]
