"""The committed data slices (tests/data/slices, cut by tests/data/make_slices.py): a valid data dir for the tool,
small, reproducible, and (slow, with the whole archives) exactly what the script cuts from the published ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fedsmix import data as datalib

SCRIPT = Path(__file__).resolve().parent / "data" / "make_slices.py"
BUDGET_MB = 8  # the repository carries them: a few MB in all


def make_slices():
    spec = importlib.util.spec_from_file_location("make_slices", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_slices_are_a_data_dir_the_tool_reads(data_dir):
    """Same file names, keys and uint8 layout as the whole archives; every registered reader takes them."""
    shapes = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
    for name, shape in shapes.items():
        for split in ("train", "test"):
            raw = datalib.load_split(name, split, data_dir)
            assert raw.images.dtype == np.uint8 and raw.images.shape[1:] == shape, (name, split)
            assert set(np.unique(raw.labels)) == set(range(10)), (name, split)  # every class present
    train = datalib.load_split("tiny-imagenet", "train", data_dir)
    test = datalib.load_split("tiny-imagenet", "test", data_dir)
    assert train.images.shape[1:] == (3, 32, 32) and len(train) == 4 * len(test)  # the loader's 80/20 cut
    counts = np.bincount(np.concatenate([train.labels, test.labels]), minlength=200)
    assert counts.min() == counts.max() == make_slices().PER_CLASS  # class-balanced, all 200 classes
    wnids = datalib.class_ids("tiny-imagenet", data_dir)  # the class names travel with the slice
    assert len(wnids) == 200 and wnids[0] == "n01443537"


def test_the_slices_stay_small(data_dir):
    total = sum(f.stat().st_size for f in Path(data_dir).glob("*.npz"))
    assert 0 < total < BUDGET_MB * 1e6, total


def test_the_written_archive_is_reproducible_and_reads_back():
    """Fixed entry times and compression: the same arrays give the same bytes, and numpy reads them back."""
    import io

    script = make_slices()
    rng = np.random.RandomState(0)
    arrays = {"x_train": rng.randint(0, 256, (5, 4, 4), dtype=np.uint8), "y_train": np.arange(5, dtype=np.uint8)}
    first = script.npz_bytes(arrays)
    assert first == script.npz_bytes({k: v.copy() for k, v in arrays.items()})
    with np.load(io.BytesIO(first)) as archive:
        assert archive.files == ["x_train", "y_train"]
        assert all(np.array_equal(archive[k], v) and archive[k].dtype == v.dtype for k, v in arrays.items())
    arrays["y_train"] = arrays["y_train"][::-1].copy()
    assert script.npz_bytes(arrays) != first


@pytest.mark.slow
def test_the_committed_slices_are_what_the_script_cuts_from_the_published_archives(full_data_dir, capsys):
    """Reads the whole archives (checked against their published sha256) and cuts again, in memory."""
    assert make_slices().main(["--from", full_data_dir, "--check"]) == 0, capsys.readouterr().out
