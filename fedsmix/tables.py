"""Markdown and CSV tables: the one writer every report uses (grid, adversary, sweep, frontier), and the one
mean ± 95 % interval over replicates (seeds) every table cell reports (`interval`, `ci`, `ci_caption`)."""

from __future__ import annotations

import csv
import io
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .runs import atomic_write_bytes


def pm(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


@dataclass(frozen=True)
class Interval:
    """A mean over replicates (seeds) with its two-sided Student-t confidence interval: mean +- t_{q, n-1} s/sqrt(n),
    q = (1 + level) / 2, s the sample standard deviation. One value: no interval (`half` None)."""

    mean: float
    half: float | None  # half-width of the interval; None for one value
    n: int
    values: tuple[float, ...]
    level: float = 0.95

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half

    def as_dict(self) -> dict[str, Any]:
        """What a JSON output keeps: every value and the summary."""
        return {"mean": self.mean, "ci-low": self.low, "ci-high": self.high, "half-width": self.half, "n": self.n,
                "level": self.level, "values": list(self.values)}


def t_quantile(n: int, level: float = 0.95) -> float:
    """t_{(1+level)/2, n-1}: the Student-t quantile of a two-sided interval over n replicates (scipy.stats)."""
    from scipy.stats import t

    if n < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {n}")
    return float(t.ppf((1 + level) / 2, n - 1))


def interval(values: Iterable[Any], level: float = 0.95) -> Interval | None:
    """Mean and Student-t interval of the numeric, finite values (None, NaN and non-numbers are dropped);
    None when none is left."""
    xs = tuple(
        float(v) for v in values
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))
    )
    if not xs:
        return None
    mean = math.fsum(xs) / len(xs)
    if len(xs) == 1:
        return Interval(mean, None, 1, xs, level)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    if sd <= 1e-12 * max(abs(x) for x in xs):  # equal up to rounding (a bound that is tau at every seed)
        sd = 0.0
    return Interval(mean, t_quantile(len(xs), level) * sd / math.sqrt(len(xs)), len(xs), xs, level)


def ci(value: Interval | None, spec: str = ".2f", scale: float = 1.0, half_spec: str | None = None) -> str:
    """'mean ± half-width' of an Interval (each times `scale`, formatted with `spec`; the half-width with
    `half_spec`, default the same), the bare mean for one value, '-' for none."""
    if value is None:
        return "-"
    text = format(scale * value.mean, spec)
    if value.half is None:
        return text
    return f"{text} ± {format(scale * value.half, half_spec or spec.replace('+', ''))}"


def ci_caption(counts: Iterable[int], level: float = 0.95, seeds: Sequence[Any] = ()) -> str:
    """What a table's intervals are, once, for its caption: 'mean ± 95 % CI over 3 seeds (Student t, t = 4.30)',
    or 'one seed (seed 0), no interval'; cells with fewer replicates than the most say their n."""
    counts = sorted({int(c) for c in counts if c})
    most = counts[-1] if counts else 1
    if most <= 1:
        return f"one seed{f' (seed {seeds[0]})' if len(seeds) == 1 else ''}, no interval"
    named = f" ({', '.join(str(s) for s in seeds)})" if seeds else ""
    text = (f"mean ± {100 * level:g} % CI over {most} seeds{named} (Student t: half-width "
            f"t_{{{(1 + level) / 2:g}, {most - 1}}} · s/√n, t = {t_quantile(most, level):.2f})")
    if len(counts) > 1:
        text += "; a cell over fewer seeds says its n"
    return text


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
