"""results.json and the table printed at the end of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fedsmix import tuning
from fedsmix.runs import atomic_write_json


def write(run_dir: Path, results: dict[str, Any]) -> Path:
    path = run_dir / "results.json"
    atomic_write_json(path, results)
    return path


def _pct(value: Any) -> str:
    return f"{100 * value:.2f}" if isinstance(value, float) else "-"


def party_problems(results: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per dropped party, rejected or quarantined upload or discarded stored upload, in every strategy
    (a quarantined upload's `field` column names the plausibility check it failed)."""
    rows = []
    kinds = (("dropped", "dropped"), ("rejected", "rejected"), ("quarantined", "quarantined"),
             ("discarded", "discarded-uploads"))
    for name, res in results.get("strategies", {}).items():
        for kind, key in kinds:
            for rec in res.get(key) or []:
                party = rec.get("party")
                rows.append(
                    (
                        name, kind, "?" if party is None else str(party), str(rec.get("node", "-")),
                        str(rec.get("round", "-")), str(rec.get("field", rec.get("check", "-"))),
                        str(rec.get("reason", "")),
                    )
                )
    return rows


# What each column of the results table means, printed under it (docs/run.md says more).
LEGEND = (
    "test acc %: the strategy's model on the test split; local-only: party 0's own model (the paper's baseline)",
    "mean / min / max %: local-only's parties, each scored with its own model",
    "used / dropped: parties that counted / that raised or did not answer in time",
    "rejected: malformed uploads; quarantined: well-formed uploads that failed a plausibility check",
    "bytes up/party: from the real messages (local-only: its model, sent only so that it can be scored)",
    "every column: docs/run.md",
)
CALIBRATION_LEGEND = (
    "n: samples; D: their mean pairwise distance; c: the weight cap's constant; V_eff: the calibration variance",
    "m_f: Theorem 4.2's multiplier for tau; r: the noise radius (r^2 = k V_eff)",
    "SNR bound: what the calibration guarantees; SNR measured: the encoding's own; screened %: dropped by the screen",
)


def _legend(console: Console, lines: tuple[str, ...]) -> None:
    for line in lines:
        console.print(f"  {line}", style="dim", highlight=False)


def tuning_line(name: str, res: dict) -> str:
    """What a strategy's selection chose, and from what (nothing when it ran its configured setting only)."""
    tried, budget = res.get("tried") or [], res.get("tuning-budget")
    if len(tried) < 2:
        return ""
    how = f"of {len(tried)} tried (tuning budget {budget}), on the parties' validation splits"
    if "chosen-per-party" in res:
        picks = tuning.party_choices(res)
        return f"{name}: each party chose alone {how}: " + ", ".join(f"{k} ({n})" for k, n in picks.items())
    scores = res.get("selection", {}).get("validation-accuracy") or dict(
        zip(map(tuning.setting_text, tried), res.get("tried-validation-accuracy", []), strict=False))
    scored = ", ".join(f"{tuning.setting_text(k)} {_pct(v)}" for k, v in scores.items())
    stop = f", stopped at round {res['stopped-at']}" if "stopped-at" in res else ""
    return f"{name}: chose {tuning.setting_text(res['chosen'])}{stop} {how}: {scored}"


def render(results: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=140, force_terminal=False)
    table = Table(
        title=f"fedsmix results ({results.get('settings', {}).get('dataset')}, {results.get('num-parties')} parties)"
    )
    for col in (
        "strategy",
        "test acc %",
        "mean %",
        "min %",
        "max %",
        "used",
        "dropped",
        "rejected",
        "quarantined",
        "bytes up/party",
        "wall s",
    ):
        table.add_column(col, justify="right" if col != "strategy" else "left", no_wrap=col != "strategy")
    for name, res in results.get("strategies", {}).items():
        if "error" in res:
            table.add_row(name, "failed", "", "", "", "", "", "", "", "", "", style="red")
            continue
        per_party = bool(res.get("per-party-accuracy"))
        table.add_row(
            f"{name} (mixcon)" if res.get("encoder") == "mixcon" else
            f"{name} ({res['radius-mode']})" if res.get("radius-mode") else name,
            _pct(res.get("accuracy")),
            *(_pct(res.get(f"{k}-party-accuracy")) if per_party else "-" for k in ("mean", "min", "max")),
            str(res.get("parties-used", "-")),
            str(len(res.get("dropped", []))),
            str(len(res.get("rejected", []))),
            str(len(res.get("quarantined") or [])),
            f"{res.get('mean-bytes-up-per-party', 0):,.0f}",
            f"{res.get('wall-seconds', 0):.1f}",
        )
    console.print(table)
    _legend(console, LEGEND)
    problems = party_problems(results)
    if problems:
        lost = Table(title="parties dropped (raised or timed out), uploads rejected or quarantined (implausible)")
        for col in ("strategy", "what", "party", "node", "round", "field / check", "reason"):
            lost.add_column(col)
        for row in problems:
            lost.add_row(*row)
        console.print(lost)
    for name, res in results.get("strategies", {}).items():
        if line := tuning_line(name, res):
            console.print(line)
    mix = results.get("strategies", {}).get("mixup-union", {})
    if mix.get("trainer"):
        returned = mix.get("returned")
        if returned and returned.get("mean") is not None:
            console.print(
                f"model returned to the parties, recalibrated on their own data: test acc % mean "
                f"{_pct(returned['mean'])}, min {_pct(returned['min'])}, max {_pct(returned['max'])}"
            )
    if mix.get("parties") and mix.get("encoder") == "mixcon":
        sep = Table(title="mixup-union (encoder mixcon): uploaded representations per party (MixCon's dist = "
                    "||h_i - h_j||^2 of normalised h over pairs of different classes)")
        for col in ("party", "n", "mean dist", "min dist"):
            sep.add_column(col, justify="right")
        for party, p in sorted(mix["parties"].items(), key=lambda kv: int(kv[0])):
            sep.add_row(str(party), str(p["num-examples"]), f"{p['separability-mean']:.3g}",
                        f"{p['separability-min']:.3g}")
        console.print(sep)
    elif mix.get("parties"):
        mode = mix.get("radius-mode", "theorem")
        calibration = mix.get("calibration", "scalar")
        cal = Table(
            title=f"mixup-union: calibration per party (radius mode {mode}, calibration {calibration}, tau "
            f"{mix.get('tau', '-')}; r^2 = k V_eff; SNR bound = that calibration's bound for this r)"
        )
        for col in ("party", "n", "D", "c", "V_eff", "m_f", "r", "SNR bound", "SNR measured", "screened %"):
            cal.add_column(col, justify="right")
        for party, p in sorted(mix["parties"].items(), key=lambda kv: int(kv[0])):
            screened = p.get("screened-fraction")
            cal.add_row(
                str(party),
                str(p["num-examples"]),
                f"{p['D']:.3g}",
                f"{p['c']:.3f}",
                f"{p['calibration-variance']:.4g}" if "calibration-variance" in p else "-",
                f"{p['m-f']:.4g}",
                f"{p['radius']:.4g}",
                f"{p['snr-bound']:.2e}",
                f"{p['snr-empirical']:.2e}",
                _pct(screened) if screened is not None else "-",
            )
        console.print(cal)
        _legend(console, CALIBRATION_LEGEND)
    if results.get("run-dir"):
        console.print(f"results: {Path(results['run-dir']) / 'results.json'}")
