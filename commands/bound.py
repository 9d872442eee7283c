"""`fedsmix bound RUN_OR_GRID_DIR`: what the uploads of finished mixup-union runs allow (fedsmix/bound.py).

For every run under the directory (a run directory, or a grid's cells) whose mixup-union uploads are still in its
store, the genie bounds are computed from those very uploads (the parties that were used, not the quarantined)
and written to the run's `upload-bound.json`; a table puts them beside the accuracy the run's trainer reached,
grouped by cell with a 95 % interval over seeds. `--sizes` adds the genie's accuracy for unions of other sizes
(multiples of the run's rows, same noise and mixing): the union size at which a tau becomes useful.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from pathlib import Path

from fedsmix import bound as genie_bound
from fedsmix import tables
from fedsmix.config import SettingsError, load_settings

ENCODERS = ("singularized", "mixup", "none")  # rows whose mean is linear in the soft labels


def run_dirs(root: Path) -> list[Path]:
    """The run directories of `root` that hold mixup-union uploads: itself (a run directory), or a grid's: its
    cells/<cell>/<run> (not the cells' `latest` links) and every run its grid.json names, so that a grid whose
    earlier seeds were reused from another directory (`--resume` on a copy of its grid.json) is bounded whole."""
    if (root / "results.json").is_file():  # a run directory (runs/latest is a link to one)
        found = [root]
    else:  # a grid
        found = [p.parent for p in root.glob("cells/*/*/results.json") if not p.parent.is_symlink()]
        if (root / "grid.json").is_file():
            named = json.loads((root / "grid.json").read_text()).get("results", {}).values()
            found += [Path(s["run-dir"]) for s in named if s.get("run-dir")]
        found = sorted({p.resolve() for p in found})
    return [p for p in found if (p / "uploads" / "manifest.json").is_file()]


def of_run(run_dir: Path, sizes: tuple[float, ...] = (), draws: int = 3, genies: dict | None = None) -> dict:
    """The bounds of one run, written to its upload-bound.json. `genies`: a cache of the genie per data digest."""
    from fedsmix.data import dataset_spec
    from fedsmix.party import pooled_data
    from fedsmix.space import load_test
    from fedsmix.training import tensors_digest
    from server.store import UploadStore

    results = json.loads((run_dir / "results.json").read_text())
    entry = results.get("strategies", {}).get("mixup-union")
    if not entry or "error" in entry:
        raise SettingsError(f"bound: {run_dir} has no finished mixup-union result")
    settings = load_settings(results["settings"])
    if settings.encoder not in ENCODERS:
        raise SettingsError(f"bound: encoder {settings.encoder!r} of {run_dir}: the genie needs rows whose mean is "
                            f"linear in the soft labels ({', '.join(ENCODERS)})")
    t0 = time.perf_counter()
    parties = int(results.get("num-parties") or entry.get("num-partitions"))
    x, labels = pooled_data(settings, parties)
    test_x, test_y = load_test(settings)
    key = tensors_digest((f"{name}{tuple(t.shape)}", t) for name, t in  # the genie is a function of these alone
                         (("x", x), ("labels", labels), ("test-x", test_x), ("test-y", test_y)))
    genies = {} if genies is None else genies
    if key not in genies:
        genies[key] = genie_bound.Genie.of(x, labels, dataset_spec(settings).num_classes)
    genie = genies[key]
    used = sorted(int(p) for p in entry["parties"])
    x, y = UploadStore(run_dir / "uploads").union(used)
    uploads = genie_bound.Regression.of(x, y)
    out = {**genie_bound.bound(genie, uploads, test_x, test_y), "accuracy": entry["accuracy"],
           "trainer": entry.get("trainer"), "tau": settings.tau, "seed": settings.seed, "parties-used": len(used)}
    out["sizes"] = {}
    for factor in sizes:
        rows = max(int(round(factor * uploads.rows)), 1)
        sub, sub_std = genie_bound.simulated(genie, uploads, test_x, test_y, rows, draws, settings.seed,
                                             genie.between())
        out["sizes"][f"{factor:g}"] = {"rows": rows, "genie-subspace": sub, "genie-subspace-std": sub_std}
    out["seconds"] = time.perf_counter() - t0
    (run_dir / "upload-bound.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def table(rows: list[tuple[str, dict]]) -> str:
    """One line per cell: the trainer's accuracy and each bound, mean ± 95 % interval over the cell's seeds."""
    cells: dict[str, list[dict]] = defaultdict(list)
    for cell, row in rows:
        cells[cell].append(row)
    keys = [("accuracy", "mixup-union"), ("genie-subspace", "genie (subspace known)"),
            ("genie-flat", "genie, flat prior (not a bound)"), ("clean-lda", "clean LDA")]
    sizes = sorted({s for _, r in rows for s in r["sizes"]}, key=float)
    header = ["cell", "tau", "seeds", *(name for _, name in keys),
              *(f"genie, x{s} rows" for s in sizes)]
    body = []
    for cell, group in cells.items():
        line = [cell, f"{group[0]['tau']:g}", ",".join(str(r["seed"]) for r in group)]
        line += [tables.ci(tables.interval(r[k] for r in group), ".2f", 100) for k, _ in keys]
        for s in sizes:
            have = [r["sizes"][s] for r in group if s in r["sizes"]]
            line.append(tables.ci(tables.interval(h["genie-subspace"] for h in have), ".1f", 100))
        body.append(line)
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(line) + " |" for line in body)])


def cmd_bound(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    dirs = run_dirs(root)
    if not dirs:
        raise SettingsError(f"bound: no run with stored mixup-union uploads under {root} (a run directory, or a "
                            "grid directory with cells/)")
    sizes = tuple(float(s) for s in args.sizes.split(",") if s.strip())
    rows, genies = [], {}
    for run_dir in dirs:
        out = of_run(run_dir, sizes, args.draws, genies)
        cell = run_dir.parent.name if run_dir != root else run_dir.name
        cell = re.sub(rf"_?seed={out['seed']}(?=_|$)", "", cell)  # seeds of one cell are grouped
        rows.append((cell, out))
        print(f"{run_dir.name}: trainer {100 * out['accuracy']:.2f} %, genie {100 * out['genie-subspace']:.2f} % "
              f"(flat prior {100 * out['genie-flat']:.2f} %), clean LDA {100 * out['clean-lda']:.2f} % "
              f"({out['seconds']:.0f} s)", flush=True)
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("bound", help="what the uploads of finished mixup-union runs allow: a genie told "
                                            "everything but the class means, beside the trainer's accuracy")
    p.add_argument("dir", help="a run directory, or a grid directory (its cells are grouped over seeds)")
    p.add_argument("--sizes", default="", help="multiples of the union's rows to simulate, e.g. 0.1,1,10,100")
    p.add_argument("--draws", type=int, default=3, help="draws of the estimated means per simulated size")
    p.add_argument("--out", default="", help="also write the table (markdown) here")
    p.set_defaults(func=cmd_bound)
