"""Same seeds, same results, on every CPU: the party module reproduces the uploads, and the in-process transport
(the real ServerApp and ClientApp) the trained models, of a recorded run (tests/data/replay.json). The run is
small (digits, 3 parties, 2 epochs / rounds) and on one thread, with no validation split and each strategy's
configured setting (`validation-fraction` 0, `tuning-budget` 1: the record predates the shared selection protocol,
whose draws tests/test_tuning.py checks).

What holds where (docs/reliability.md, "Reproducibility"):
- Upload bytes: the digests recorded by the code before the structural refactor, exact on PyTorch's vector
  kernels (AVX2 and AVX-512: every x86-64 CPU that PyTorch dispatches to a vector kernel). PyTorch's scalar
  kernels (`ATEN_CPU_CAPABILITY=default`, CPUs without AVX2) draw Gaussians and resize images with other
  roundings (ulps): there the uploads agree with the record's sketch within 1e-5, labels bit for bit.
  instahide-cross mixes in the public pool, the committed Tiny-ImageNet slice (tests/data/slices): its upload records
  were re-recorded there by the code that, on the whole archive, still gave the pre-refactor bytes (checked first).
- Trained weights: bit-identical for the same seed on the same machine (each model is trained twice here);
  against the record, within 1 % relative distance (sketches, `fedsmix.training.sketch`) and 2 test images of
  accuracy. Measured across kernel levels on one AVX-512 CPU: at most 0.12 % apart (local-only, 2 epochs with
  BatchNorm), accuracies equal; a different seed or learning rate moves the weights by tens of per cent.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from commands import inprocess
from fedsmix.config import load_settings
from fedsmix.party import prepare_upload
from fedsmix.training import sketch, state_digest, state_sketch

RECORDED = json.loads((Path(__file__).parent / "data" / "replay.json").read_text())
TRAINED = RECORDED["training"]
VECTOR_KERNELS = ("AVX2", "AVX512")  # torch.backends.cpu.get_cpu_capability() where upload bytes are exact
UPLOAD_TOLERANCE = 1e-5  # relative sketch distance of an upload on the scalar kernels (measured: about 1e-7)
WEIGHTS_TOLERANCE = 0.01  # relative sketch distance of trained weights on another CPU (measured: at most 1.2e-3)
ACCURACY_TOLERANCE = 2 / 360  # two of digits' 360 test images
pytestmark = pytest.mark.usefixtures("one_thread")  # training bits depend on the thread count


def _settings(data_dir: str, **extra):
    return load_settings({**RECORDED["settings"], "data-dir": data_dir, **extra})


def _sha(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def _distance(sketch_: list[float], recorded: list[float]) -> float:
    a, b = np.asarray(sketch_), np.asarray(recorded)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _agrees(name: str, result: dict) -> None:
    """A strategy's result (accuracy, weights' sketch) against the recorded run's."""
    record = TRAINED[name]
    assert _distance(result["weights-sketch"], record["sketch"]) <= WEIGHTS_TOLERANCE, name
    if "accuracy" in record:
        assert abs(result["accuracy"] - record["accuracy"]) <= ACCURACY_TOLERANCE, name


@pytest.fixture(scope="module")
def trained_twice(data_dir, one_thread, tmp_path_factory) -> list[dict]:
    """The recorded run's strategies through the in-process transport, twice with the same seed."""
    settings = _settings(data_dir, trainer="mlp", strategies="mixup-union,fedavg,fedprox,centralized",
                         **{"return-model": False, "runs-dir": str(tmp_path_factory.mktemp("runs"))})
    return [inprocess.run(settings, RECORDED["parties"])["strategies"] for _ in range(2)]


@pytest.mark.parametrize("encoder", ["singularized", "mixup", "instahide-inside", "instahide-cross"])
def test_uploads_are_the_recorded_bytes(data_dir, encoder):
    import torch

    exact = torch.backends.cpu.get_cpu_capability() in VECTOR_KERNELS
    settings = _settings(data_dir, encoder=encoder, **({"mix-k": 4} if encoder != "singularized" else {}))
    for party in range(RECORDED["parties"]):
        upload = prepare_upload(settings, party, RECORDED["parties"])
        key = f"{encoder}/{party}"
        assert upload.arrays["x"].dtype == np.float32
        assert _sha(upload.arrays["y"]) == RECORDED["label-digests"][key], key
        assert _distance(sketch([upload.arrays["x"]]), RECORDED["upload-sketches"][key]) <= UPLOAD_TOLERANCE, key
        if exact:
            assert _sha(upload.arrays["x"], upload.arrays["y"]) == RECORDED["uploads"][key], key


@pytest.mark.slow
def test_instahide_cross_uploads_are_the_bytes_recorded_on_the_whole_public_set(full_data_dir):
    """The record made before the refactors, on the whole Tiny-ImageNet archive (the fast tier's slice has another
    public pool, so its instahide-cross records differ)."""
    import torch

    settings = _settings(full_data_dir, encoder="instahide-cross", **{"mix-k": 4})
    for party in range(RECORDED["parties"]):
        upload = prepare_upload(settings, party, RECORDED["parties"])
        key = f"instahide-cross/{party}"
        recorded = RECORDED["upload-sketches-whole-public-set"][key]
        assert _distance(sketch([upload.arrays["x"]]), recorded) <= UPLOAD_TOLERANCE, key
        if torch.backends.cpu.get_cpu_capability() in VECTOR_KERNELS:
            assert _sha(upload.arrays["x"], upload.arrays["y"]) == RECORDED["uploads-whole-public-set"][key], key


@pytest.mark.parametrize("strategy", ["mixup-union", "fedavg", "fedprox", "centralized"])
def test_models_are_the_recorded_weights(trained_twice, strategy):
    first, second = (run[strategy] for run in trained_twice)
    assert first["weights-sha256"] == second["weights-sha256"]  # same seed, same machine: the same bytes
    _agrees(strategy, first)


def test_local_training_is_the_recorded_step(data_dir):
    from fedsmix.models import new_classifier
    from fedsmix.party import load_partition, train_local
    from fedsmix.space import mixing_shape

    settings = _settings(data_dir)
    initial = new_classifier(settings, mixing_shape(settings), 10).state_dict()
    partition = load_partition(settings, 0, RECORDED["parties"])
    models = [train_local(settings, partition, initial, mode="local-only").model for _ in range(2)]
    assert state_digest(models[0]) == state_digest(models[1])
    assert _distance(state_sketch(models[0]), TRAINED["local-only-0"]["sketch"]) <= WEIGHTS_TOLERANCE


def test_the_tolerance_tells_another_run_from_rounding(data_dir):
    """The weights' tolerance is no blanket: one more seed, or another learning rate, lands far outside it."""
    from fedsmix.models import new_classifier
    from fedsmix.party import load_partition, train_local
    from fedsmix.space import mixing_shape

    for change in ({"seed": RECORDED["settings"]["seed"] + 1}, {"lr": 2e-3}):
        settings = _settings(data_dir, **change)
        initial = new_classifier(settings, mixing_shape(settings), 10).state_dict()
        partition = load_partition(settings, 0, RECORDED["parties"])
        model = train_local(settings, partition, initial, mode="local-only").model
        assert _distance(state_sketch(model), TRAINED["local-only-0"]["sketch"]) > 10 * WEIGHTS_TOLERANCE, change
