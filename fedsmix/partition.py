"""Split a training set among N parties with flwr-datasets' partitioners.

Every party computes the same split from (labels, seed) and keeps only its own
share, so no index ever has to travel.

Schemes: `iid`, `dirichlet` (flwr-datasets' DirichletPartitioner: sizes follow the label draw),
`pathological` (a few classes per party), and the published paper's two, both through
flwr-datasets' InnerDirichletPartitioner (fixed partition sizes, labels per party from Dirichlet(beta)):
`dirichlet-equal` (Table 5: parties of equal size) and `size-skew` (Table 6: one data-poor party).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .config import SettingsError

SCHEMES = ("iid", "dirichlet", "pathological", "dirichlet-equal", "size-skew")
SIZED = ("dirichlet-equal", "size-skew")  # schemes with partition sizes fixed before any label is drawn


def check_poor_party(scheme: str, poor_party: int, num_parties: int, where: str = "") -> None:
    """Refuse a data-poor party that the federation does not have (named by key, before any run starts)."""
    if scheme == "size-skew" and not 0 <= poor_party < num_parties:
        raise SettingsError(
            f"poor-party: {poor_party} is outside 0..{num_parties - 1} ({num_parties} parties){where}"
        )


def partition_sizes(
    scheme: str, n: int, num_parties: int, poor_party_ratio: float = 1.0, poor_party: int = 0
) -> np.ndarray:
    """Rows per party for the sized schemes; they always sum to `n`.

    `dirichlet-equal`: floor(n / N) rows each, the remainder n mod N spread one each over the first
    parties (sizes differ by at most one). `size-skew`: party `poor_party` holds n_poor = rho * n_rich
    rows and the N - 1 others n_rich each, with the total fixed: n_rich = n / (N - 1 + rho). Both are
    the largest-remainder apportionment of n to weights (1, ..., rho, ..., 1), ties to the lower party
    id, so the poor party gets floor or ceil of rho * n / (N - 1 + rho) and the rich ones differ by at
    most one; rho = 1 gives exactly the `dirichlet-equal` sizes.
    """
    if scheme not in SIZED:
        raise ValueError(f"partitioner: {scheme!r} has no fixed partition sizes; sized schemes: {', '.join(SIZED)}")
    if not 0 < poor_party_ratio <= 1:
        raise SettingsError(f"poor-party-ratio: must be in (0, 1], got {poor_party_ratio}")
    check_poor_party(scheme, poor_party, num_parties)
    weights = np.ones(num_parties)
    if scheme == "size-skew":
        weights[poor_party] = poor_party_ratio
    exact = n * weights / weights.sum()
    sizes = np.floor(exact).astype(np.int64)
    extra = np.argsort(-(exact - sizes), kind="stable")[: n - int(sizes.sum())]
    sizes[extra] += 1
    return sizes


def _partitioner(
    scheme: str,
    labels: np.ndarray,
    num_parties: int,
    seed: int,
    dirichlet_alpha: float,
    classes_per_party: int,
    min_size: int,
    poor_party_ratio: float,
    poor_party: int,
):
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        InnerDirichletPartitioner,
        PathologicalPartitioner,
    )

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
    if scheme in SIZED:
        sizes = partition_sizes(scheme, len(labels), num_parties, poor_party_ratio, poor_party)
        small = int(np.argmin(sizes))
        if sizes[small] < min_size:
            role = " (the data-poor party)" if scheme == "size-skew" and small == poor_party else ""
            raise SettingsError(
                f"min-partition-size: partitioner {scheme!r} gives party {small}{role} only {sizes[small]} rows "
                f"(of {len(labels)} among {num_parties} parties), below min-partition-size {min_size}"
                + (f" (poor-party-ratio {poor_party_ratio})" if scheme == "size-skew" else "")
            )
        # When a class runs out, InnerDirichletPartitioner zeroes it in every party's Dirichlet draw and
        # renormalises the rest: every party still gets exactly its size, a late or small party with
        # the remaining classes. It needs labels 0..K-1 without gaps (see _all_partitions).
        return InnerDirichletPartitioner(
            partition_sizes=sizes, partition_by="label", alpha=float(dirichlet_alpha), seed=seed
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
    poor_party_ratio: float = 1.0,
    poor_party: int = 0,
) -> tuple[np.ndarray, ...]:
    from datasets import Dataset

    labels = np.frombuffer(labels_key, dtype=np.int64)
    if scheme in SIZED:  # InnerDirichletPartitioner indexes classes 0..K-1: a subset may miss a class
        labels = np.unique(labels, return_inverse=True)[1].astype(np.int64)
    table = Dataset.from_dict({"label": labels, "row": np.arange(len(labels), dtype=np.int64)})
    partitioner = _partitioner(
        scheme, labels, num_parties, seed, dirichlet_alpha, classes_per_party, min_size, poor_party_ratio, poor_party
    )
    if scheme == "iid":  # IidPartitioner takes no seed: shuffle rows with ours first
        table = table.shuffle(seed=seed)
    partitioner.dataset = table
    try:
        rows = [partitioner.load_partition(i)["row"] for i in range(num_parties)]
    except ValueError as err:
        if scheme not in SIZED or "NaN" not in str(err):
            raise
        # numpy draws Dirichlet(beta < 0.1) by stick-breaking: a party's draw can hold exact zeros, and when
        # its other classes run out InnerDirichletPartitioner renormalises its row 0/0 = NaN
        raise SettingsError(
            f"dirichlet-alpha: {dirichlet_alpha} is too small for partitioner {scheme!r}: a party's Dirichlet "
            "draw put all its mass on classes that ran out (flwr-datasets InnerDirichletPartitioner); "
            "use dirichlet-alpha >= 0.1 or another seed"
        ) from err
    return tuple(np.sort(np.asarray(r, dtype=np.int64)) for r in rows)


def partition_indices(
    labels: np.ndarray,
    party: int,
    num_parties: int,
    scheme: str = "dirichlet",
    seed: int = 0,
    dirichlet_alpha: float = 0.5,
    classes_per_party: int = 2,
    min_size: int = 10,
    poor_party_ratio: float = 1.0,
    poor_party: int = 0,
) -> np.ndarray:
    """Rows of the training set that belong to `party` (sorted, disjoint across parties).

    `poor_party_ratio` and `poor_party` only shape `size-skew` (see `partition_sizes`).
    """
    if num_parties < 1:
        raise ValueError(f"num-partitions: need at least 1 party, got {num_parties}")
    if not 0 <= party < num_parties:
        raise ValueError(f"partition-id: {party} is outside 0..{num_parties - 1}")
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    parts = _all_partitions(
        labels.tobytes(),
        scheme,
        num_parties,
        seed,
        float(dirichlet_alpha),
        classes_per_party,
        min_size,
        float(poor_party_ratio) if scheme == "size-skew" else 1.0,
        int(poor_party) if scheme == "size-skew" else 0,
    )
    return parts[party]
