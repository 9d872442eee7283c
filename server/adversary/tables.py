"""Markdown and CSV tables of attack results (the README and the issue notes paste the markdown)."""

from __future__ import annotations

import csv
from pathlib import Path


def pm(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def signed(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def markdown(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """columns: (key, header); rows hold already formatted cells."""
    head = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(str(row.get(k, "-")) for k, _ in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body]) + "\n"


def write_csv(path: Path, rows: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    return path
