import numpy as np
import pytest
import torch

from fedsmix import data
from fedsmix.partition import partition_indices


def test_digits_split_is_fixed_and_disjoint():
    train, test = data.load_split("digits", "train"), data.load_split("digits", "test")
    assert train.images.shape[1:] == (1, 8, 8) and len(train) + len(test) == 1797
    again = data.load_split.__wrapped__("digits", "train")
    assert np.array_equal(train.labels, again.labels)


def test_loading_twice_gives_the_same_tensors():
    """Raw splits are cached per process: converting them must never modify the cache."""
    raw = data.load_split("digits", "test")
    first, _ = data.normalized_tensors(raw)
    second, _ = data.normalized_tensors(data.load_split("digits", "test"))
    assert torch.equal(first, second)
    assert float(raw.images.max()) == 16.0


def test_mnist_from_data_dir_matches_readme(data_dir):
    test = data.load_split("mnist", "test", data_dir)
    assert test.images.shape == (10000, 1, 28, 28) and test.images.dtype == np.uint8
    assert test.labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    x, _ = data.normalized_tensors(test, np.arange(2000))
    assert abs(float(data.to_unit(test.images[:2000], test.spec).mean()) - 0.1307) < 0.01
    lo, hi = data.valid_range(test.spec)
    assert x.min() >= lo.min() - 1e-5 and x.max() <= hi.max() + 1e-5


def test_cifar10_channel_order(data_dir):
    test = data.load_split("cifar10", "test", data_dir)
    assert test.images.shape == (10000, 3, 32, 32)
    assert test.labels[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(data.DatasetUnavailable) as err:
        data.load_split("cifar100", "train", str(tmp_path))
    message = str(err.value)
    assert "cifar100.npz" in message and "data-dir" in message and "download" in message


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "pathological"])
def test_partitions_are_disjoint_complete_and_deterministic(scheme):
    labels = data.load_split("digits", "train").labels
    parts = [partition_indices(labels, p, 5, scheme, seed=3) for p in range(5)]
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined))
    if scheme != "pathological":
        assert len(joined) == len(labels)
    assert all(np.array_equal(a, partition_indices(labels, p, 5, scheme, seed=3)) for p, a in enumerate(parts))
    if scheme == "pathological":
        assert all(len(np.unique(labels[a])) <= 2 for a in parts)


def test_dirichlet_skews_labels_and_seed_matters():
    labels = data.load_split("digits", "train").labels
    a = partition_indices(labels, 0, 10, "dirichlet", seed=0, dirichlet_alpha=0.1)
    b = partition_indices(labels, 0, 10, "dirichlet", seed=1, dirichlet_alpha=0.1)
    assert not np.array_equal(a, b)
    counts = np.bincount(labels[a], minlength=10) / len(a)
    assert counts.max() > 0.3  # far from the uniform 0.1


def test_bad_party_id_is_named():
    with pytest.raises(ValueError, match="partition-id"):
        partition_indices(np.zeros(10, dtype=np.int64), 5, 3)


def test_one_hot():
    assert torch.equal(data.one_hot(torch.tensor([1, 0]), 3), torch.tensor([[0.0, 1, 0], [1, 0, 0]]))


def test_converting_a_split_leaves_the_cached_split_untouched():
    """digits is stored as float32: an in-place conversion would rescale the cached split on every load."""
    raw = data.load_split("digits", "test")
    before = raw.images.copy()
    data.to_unit(raw.images, raw.spec)
    data.normalized_tensors(raw)
    assert np.array_equal(data.load_split("digits", "test").images, before)
