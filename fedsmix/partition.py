"""Split a training set among N parties with flwr-datasets' partitioners.

Every party computes the same split from (labels, seed) and keeps only its own
share, so no index ever has to travel.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

SCHEMES = ("iid", "dirichlet", "pathological")


def _partitioner(
    scheme: str, num_parties: int, seed: int, dirichlet_alpha: float, classes_per_party: int, min_size: int
):
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, PathologicalPartitioner

    if scheme == "iid":
        return IidPartitioner(num_partitions=num_parties)
    if scheme == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_parties,
            partition_by="label",
            alpha=dirichlet_alpha,
            min_partition_size=min_size,
            seed=seed,
        )
    if scheme == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_parties,
            partition_by="label",
            num_classes_per_partition=classes_per_party,
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    raise ValueError(f"partitioner: unknown {scheme!r}; allowed: {', '.join(SCHEMES)}")


@lru_cache(maxsize=16)
def _all_partitions(
    labels_key: bytes,
    scheme: str,
    num_parties: int,
    seed: int,
    dirichlet_alpha: float,
    classes_per_party: int,
    min_size: int,
) -> tuple[np.ndarray, ...]:
    from datasets import Dataset

    labels = np.frombuffer(labels_key, dtype=np.int64)
    table = Dataset.from_dict({"label": labels, "row": np.arange(len(labels), dtype=np.int64)})
    partitioner = _partitioner(scheme, num_parties, seed, dirichlet_alpha, classes_per_party, min_size)
    if scheme == "iid":  # IidPartitioner takes no seed: shuffle rows with ours first
        table = table.shuffle(seed=seed)
    partitioner.dataset = table
    return tuple(np.sort(np.asarray(partitioner.load_partition(i)["row"], dtype=np.int64)) for i in range(num_parties))


def partition_indices(
    labels: np.ndarray,
    party: int,
    num_parties: int,
    scheme: str = "dirichlet",
    seed: int = 0,
    dirichlet_alpha: float = 0.5,
    classes_per_party: int = 2,
    min_size: int = 10,
) -> np.ndarray:
    """Rows of the training set that belong to `party` (sorted, disjoint across parties)."""
    if num_parties < 1:
        raise ValueError(f"num-partitions: need at least 1 party, got {num_parties}")
    if not 0 <= party < num_parties:
        raise ValueError(f"partition-id: {party} is outside 0..{num_parties - 1}")
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    parts = _all_partitions(
        labels.tobytes(), scheme, num_parties, seed, float(dirichlet_alpha), classes_per_party, min_size
    )
    return parts[party]
