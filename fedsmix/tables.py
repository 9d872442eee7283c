"""Markdown and CSV tables: the one writer every report uses (grid, adversary, sweep, frontier)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .runs import atomic_write_bytes


def pm(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def signed(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def fmt(value: Any, spec: str) -> str:
    """`format(value, spec)`, or '-' for a missing or NaN value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def markdown(rows: Iterable[dict], columns: Sequence[tuple[str, str]], align: str = "") -> str:
    """columns: (key, header); rows hold already formatted cells. `align`: one of 'l', 'r' per column
    (default: left)."""
    head = "| " + " | ".join(h for _, h in columns) + " |"
    rules = [("---:" if a == "r" else "---") for a in (align or "l" * len(columns))]
    body = ["| " + " | ".join(str(row.get(k, "-")) for k, _ in columns) + " |" for row in rows]
    return "\n".join([head, "|" + "|".join(rules) + "|", *body]) + "\n"


def write_csv(
    path: Path, rows: Sequence[dict], columns: Sequence[str] | None = None, first: Sequence[str] = ()
) -> Path:
    """Write rows atomically. `columns`: exactly these (other keys ignored); else the `first` keys that
    occur, then every other key in the order first seen. Missing values are empty cells."""
    path = Path(path)
    if columns is None:
        seen: list[str] = [k for k in first if any(k in r for r in rows)]
        for row in rows:
            seen += [k for k in row if k not in seen]
        columns = seen
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    atomic_write_bytes(path, text.getvalue().encode())
    return path
