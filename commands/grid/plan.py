"""A grid's plan: the preset's `grid:` block -> validated cells, and which strategy each cell must run.

A preset's `grid:` block names the axes: `parties` (numbers of SuperNodes) and any run setting with a
list of values (`tau`, `radius-mode`, ...). `seeds` (or `seed`, or `--seeds`) is the replicate axis: every
cell runs once per seed (the one `seed` setting draws the partitions, the encodings and every
initialisation) and the report gives each table cell the mean and a 95 % interval over its seeds, never
a row per seed. A strategy is not rerun for an axis it cannot depend on: the encoder's keys (tau,
radius-mode, ...) only change mixup-union, the number of parties does not change the centralised bound,
nor do the partition keys (`partitioner`, `dirichlet-alpha`, `poor-party-ratio`, ...: they change every
other strategy) unless `feature-skew` is on (then the bound pools the parties' shifted images), FedAvg/FedProx
keys only change those two.

Precedence, lowest first: schema defaults < the preset's keys < the preset's grid axes < `--axis`
(replaces an axis) < `--seeds` (replaces the seeds) < `--set key=value` (fixes a key everywhere, collapsing its
axis; `--set seed=N` leaves one seed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import yaml

from fedsmix.config import KEYS, SettingsError, load_settings, resolve_preset
from fedsmix.partition import check_poor_party
from fedsmix.registry import STRATEGIES

ENCODING_KEYS = frozenset(
    {
        "encoder", "tau", "alpha", "radius-mode", "radius", "permutation", "mix-k", "coefficient-cap",
        "private-mass-min", "encodings-per-sample", "upload-dtype", "max-upload-mb", "max-upload-samples",
        "adversary", "attack-victims", "attack-steps", "unet-width", "unet-epochs", "unet-train-size",
        "unet-select",
        # the central trainer of the uploads (fedsmix/trainers/)
        "trainer", "head-penalties", "validation-fraction", "return-model",
        # the server's plausibility checks of the uploads and robust central training
        "plausibility", "robust-training", "robust-trim", "class-prior",
    }
)
FEDERATED_KEYS = frozenset(
    {"rounds", "local-epochs", "proximal-mu", "fraction-train", "client-lr", "aggregation", "trimmed-beta",
     "malicious-parties"}
)
# how the training split is dealt to the parties: like `parties`, every strategy but the centralised bound
# (which trains on the whole split) depends on them, and the report keeps them in a table's rows
PARTITION_KEYS = frozenset(
    {"partitioner", "dirichlet-alpha", "classes-per-party", "min-partition-size", "poor-party-ratio", "poor-party"}
)
PLOTS = ("parties", "snr-bound")
SEED = "seed"  # the replicate axis: a cell's runs at each seed are one table cell's samples, not rows


def depends_on(strategy: str, key: str, skewed: bool = False) -> bool:
    """Whether a strategy's result can change along an axis (conservative: unknown keys count). `skewed`: under
    feature skew the centralised bound pools the parties' shifted images, so it depends on the parties too."""
    if key == "parties" or key in PARTITION_KEYS:
        return skewed or STRATEGIES[strategy].parties
    if key in ENCODING_KEYS:
        return STRATEGIES[strategy].uploads
    if key in FEDERATED_KEYS:
        return strategy in ("fedavg", "fedprox")
    return True


@dataclass(frozen=True)
class Cell:
    parties: int
    values: tuple[tuple[str, Any], ...]  # axis key -> value, in axis order

    @property
    def id(self) -> str:
        parts = [f"p{self.parties}"] + [f"{k}={v}" for k, v in self.values]
        return "_".join(parts).replace("/", "-")

    @property
    def seed(self) -> int | None:
        """This run's seed when the grid has a seed axis (else the preset's seed applies)."""
        return dict(self.values).get(SEED)

    @property
    def table_id(self) -> str:
        """The table cell this run is a replicate of: the id without its seed."""
        return Cell(self.parties, tuple((k, v) for k, v in self.values if k != SEED)).id

    def overrides(self) -> dict[str, Any]:
        return dict(self.values)

    def signature(self, strategy: str, skewed: bool = False) -> str:
        keys = [("parties", self.parties)] + list(self.values)
        return strategy + "|" + ",".join(f"{k}={v}" for k, v in keys if depends_on(strategy, k, skewed))


@dataclass
class GridPlan:
    preset: str
    name: str
    base: dict[str, Any]  # overrides shared by every cell (preset path + --set)
    axes: dict[str, list[Any]]  # parties first, then settings keys
    plot: str = "parties"
    table_rows: tuple[str, ...] = ()
    cells: list[Cell] = field(default_factory=list)

    def strategies(self) -> tuple[str, ...]:
        return load_settings(self.base).strategies

    @property
    def seeds(self) -> list[int]:
        """The replicates of every cell: the seed axis, else the one seed of the preset (and `--set`)."""
        return list(self.axes.get(SEED) or [load_settings(self.base).seed])

    def schedule(self) -> list[tuple[Cell, list[str]]]:
        """Each cell with the strategies it must run (first cell of each signature runs it)."""
        seen, out = set(), []
        skewed = load_settings(self.base).feature_skew > 0 or "feature-skew" in self.axes
        for cell in self.cells:
            todo = [s for s in self.strategies() if cell.signature(s, skewed) not in seen]
            seen.update(cell.signature(s, skewed) for s in todo)
            out.append((cell, todo))
        return out


def shared_axis(key: str) -> bool:
    """An axis every baseline's result depends on (seed, data, partitions): a row of the table, not a label."""
    return key == "parties" or key in PARTITION_KEYS or all(depends_on(s, key) for s in ("local-only", "centralized"))


def _list(key: str, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise SettingsError(f"grid: axis {key!r} has no values")
    return values


def _seeds(where: str, value: Any) -> list[int]:
    values = _list(SEED, value)
    bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 0]
    if bad:
        raise SettingsError(f"{where}: seeds are integers >= 0, got {bad[0]!r}")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise SettingsError(f"{where}: seed {twice[0]} given twice (each seed is one replicate)")
    return values


def make_plan(
    preset: str,
    sets: dict[str, Any] | None = None,
    axes: dict[str, list[Any]] | None = None,
    seeds: list[int] | None = None,
) -> GridPlan:
    """Preset + overrides -> validated cells (every cell's settings are checked before anything runs).
    `seeds` (`--seeds`) replaces the replicate axis (the grid block's `seeds:` or `seed:`, `--axis seed=`)."""
    path = resolve_preset(preset)
    data = yaml.safe_load(path.read_text()) or {}
    grid = dict(data.get("grid") or {})
    if "seeds" in grid:
        if SEED in grid:
            raise SettingsError("grid: give the replicate seeds once, as `seeds:` or as `seed:`, not both")
        grid = {(SEED if k == "seeds" else k): v for k, v in grid.items()}
    plot = str(grid.pop("plot", "parties"))
    if plot not in PLOTS:
        raise SettingsError(f"grid.plot: {plot!r} unknown; allowed: {', '.join(PLOTS)}")
    table_rows = tuple(grid.pop("table-rows", ()) or ())
    grid_axes: dict[str, list[Any]] = {"parties": _list("parties", grid.pop("parties", [10]))}
    for key, value in grid.items():
        if key not in KEYS:
            raise SettingsError(f"grid: unknown axis {key!r}; axes are 'parties' or run settings: {', '.join(KEYS)}")
        grid_axes[key] = _list(key, value)
    for key, values in (axes or {}).items():
        if key != "parties" and key not in KEYS:
            raise SettingsError(f"--axis: unknown key {key!r}; allowed: parties, {', '.join(KEYS)}")
        grid_axes[key] = _list(key, values)
    if seeds is not None:
        grid_axes[SEED] = list(seeds)
    if SEED in grid_axes:  # the replicate axis sits next to `parties` in a cell's id: p10_seed=0_tau=...
        grid_axes[SEED] = _seeds("--seeds" if seeds is not None else "grid.seeds", grid_axes[SEED])
        others = {k: v for k, v in grid_axes.items() if k not in ("parties", SEED)}
        grid_axes = {"parties": grid_axes["parties"], SEED: grid_axes[SEED], **others}
    sets = dict(sets or {})
    if "parties" in sets:
        grid_axes["parties"] = _list("parties", sets.pop("parties"))
    for key in sets:  # an explicit override fixes the key everywhere
        grid_axes.pop(key, None)
    for key in table_rows:
        if key in (SEED, "seeds"):
            raise SettingsError("grid.table-rows: seeds are replicates, not rows: every cell reports the mean and "
                                "interval over its seeds")
        if key not in grid_axes and key not in sets:
            raise SettingsError(f"grid.table-rows: {key!r} is not an axis of this grid ({', '.join(grid_axes)})")
    table_rows = tuple(k for k in table_rows if k in grid_axes)
    base = {"preset": str(preset), **sets}
    base.pop("runs-dir", None)
    load_settings(base)
    keys = [k for k in grid_axes if k != "parties"]
    cells = []
    for parties, *values in itertools.product(grid_axes["parties"], *(grid_axes[k] for k in keys)):
        if not isinstance(parties, int) or parties < 2:
            raise SettingsError(f"grid: parties must be integers >= 2, got {parties!r}")
        cell = Cell(parties, tuple(zip(keys, values)))
        settings = load_settings({**base, **cell.overrides()})  # fail now, naming the key, not hours later
        check_poor_party(settings.partitioner, settings.poor_party, parties, where=f" in cell {cell.id}")
        cells.append(cell)
    if SEED in grid_axes:  # one whole pass per seed: an interrupted grid has every table cell at the first seeds
        cells.sort(key=lambda c: grid_axes[SEED].index(c.seed))
    return GridPlan(str(preset), path.stem, base, grid_axes, plot, table_rows, cells)


