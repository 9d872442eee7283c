"""One selection protocol for every strategy.

Each party keeps `validation-fraction` of its own clean rows as a validation split (fedsmix/party.py): never
encoded, uploaded or trained on. Every strategy tries at most `tuning-budget` settings, the configured one
first and the rest a seeded draw from its search space below (random search: the same budget buys each
strategy the same number of tries), and keeps the one with the most correct predictions pooled over the
parties' validation splits (`selection-score trimmed`: pooled without the voter that scores a candidate highest
and the one that scores it lowest, so that no one party's answers move it alone); the test split is never read
to choose. A setting's training curve comes with it:
FedAvg/FedProx also choose the round to stop at, local-only parties the epoch, on the same scores.

Who scores: mixup-union's candidates and FedAvg/FedProx's global models are scored by the parties (query
`validate`, Flower's evaluate round), which answer counts on their own split for at most `query_cap` models a
run; local-only parties choose alone, on their own split, and say only what they chose.
"""

from __future__ import annotations

import itertools
import math

import torch

from .config import Settings
from .seeding import generator

# Search spaces, in the settings' own keys; the configured setting is tried first, on the grid or not.
FEDERATED = {"client-lr": (0.2, 0.1, 0.05, 0.02, 0.01, 0.005), "local-epochs": (1, 2)}
FEDPROX = {**FEDERATED, "proximal-mu": (0.001, 0.01, 0.1, 1.0)}
LOCAL = {"lr": (1e-2, 3e-3, 1e-3, 3e-4, 1e-4)}
SPACES = {"fedavg": FEDERATED, "fedprox": FEDPROX, "local-only": LOCAL}
# A defence's utility knobs join the space of the strategy it defends, where it is on: a clipping norm moves
# accuracy, not the guarantee (the noise is a multiple of it; epsilon follows from the noise multiplier and the
# sampling alone). Strength knobs (epsilon, pruning ratio, MixUp/InstaHide k) are not tuned: each strength is
# its own row of the frontier's privacy axis.
CLIPPING_NORMS = (0.1, 0.3, 1.0, 3.0, 10.0)
DEFENCE_KNOBS = {
    "dp-sgd-max-grad-norm": (lambda settings: settings.dp_sgd_epsilon > 0, CLIPPING_NORMS),
    "dp-clipping-norm": (lambda settings: settings.dp_fedavg != "off", CLIPPING_NORMS),
}


def space(settings: Settings, strategy: str) -> dict[str, tuple]:
    """`strategy`'s search space under `settings`: its own axes, and the knobs of each defence that is on."""
    knobs = {key: values for key, (on, values) in DEFENCE_KNOBS.items() if on(settings)}
    return {**SPACES[strategy], **knobs}


def configured(settings: Settings, space: dict[str, tuple]) -> dict:
    """The setting the run's keys name, on the axes of `space`."""
    return {key: getattr(settings, key.replace("-", "_")) for key in space}


def draw(settings: Settings, strategy: str) -> list[dict]:
    """At most `tuning-budget` settings of `strategy`'s search space: the configured one first, then a draw
    from the seed (the same draw for every party and every transport)."""
    axes = space(settings, strategy)
    first = configured(settings, axes)
    grid = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    rest = [setting for setting in grid if setting != first]
    order = torch.randperm(len(rest), generator=generator(settings.seed, strategy, "tuning")).tolist()
    return [first] + [rest[i] for i in order[: settings.tuning_budget - 1]]


def draw_names(settings: Settings, names: list[str], purpose: str) -> list[str]:
    """At most `tuning-budget` of `names` (candidates of mixup-union's trainer): the first, then a seeded draw,
    kept in their own order."""
    if len(names) <= settings.tuning_budget:
        return list(names)
    order = torch.randperm(len(names) - 1, generator=generator(settings.seed, purpose, "tuning")).tolist()
    keep = {0, *(1 + i for i in order[: settings.tuning_budget - 1])}
    return [name for i, name in enumerate(names) if i in keep]


def apply(settings: Settings, setting: dict) -> Settings:
    return settings.replace(**{key.replace("-", "_"): value for key, value in setting.items()})


def score(counts: list[dict], rule: str = "pooled") -> float:
    """One candidate's validation score from the voters' counts ({"correct", "n"} each): the accuracy pooled over
    them, or (`trimmed`) pooled over the voters left when the one that scores the candidate highest and the one
    that scores it lowest are set aside: one party's answers (a consistent liar's votes among them) can then
    neither lift a candidate nor sink it beyond what the other voters say. With fewer than three voters that
    answered, the pooled accuracy. NaN: nobody answered."""
    counts = [(int(c["correct"]), int(c["n"])) for c in counts if int(c["n"])]
    if rule == "trimmed" and len(counts) >= 3:
        counts = sorted(counts, key=lambda cn: cn[0] / cn[1])[1:-1]
    correct, total = sum(c for c, _ in counts), sum(n for _, n in counts)
    return correct / total if total else math.nan


def pooled(scores: dict[int, dict[str, dict[str, int]]], names: list, rule: str = "pooled") -> tuple[object, dict]:
    """The candidate with the best `score` under `rule` (ties: the earlier one), and every candidate's score.
    `scores`: party -> candidate -> {"correct", "n"}."""
    accuracy = {name: score([s[name] for s in scores.values() if name in s], rule) for name in names}
    valid = [n for n in names if not math.isnan(accuracy[n])]
    if not valid:
        raise ValueError("no party scored any candidate: nothing to choose with")
    return max(valid, key=lambda n: (accuracy[n], -names.index(n))), accuracy


def query_cap(settings: Settings) -> int:
    """Models a party scores in one run before it refuses: `validation-queries`, or what the budget needs (each
    strategy's settings, each scored once per round; the protocols never ask for more)."""
    if settings.validation_queries:
        return settings.validation_queries
    return settings.tuning_budget * (max(settings.rounds, 1) + 1) * len(settings.strategies)


def report(settings: Settings, tried: list[dict], chosen: int) -> dict:
    """What a strategy's entry in results.json says about its selection."""
    return {"tuning-budget": settings.tuning_budget, "chosen": tried[chosen], "tried": tried}


def described(res: dict) -> dict[str, str]:
    """What a strategy's entry in results.json says of its selection, as table text: `chosen` (the setting it
    kept, with the round it stopped at; local-only: each party's choice, with how many parties made it) and
    `tuning` (settings tried, of what budget). Empty for an entry that names no tuning budget."""
    if res.get("tuning-budget") is None:
        return {}
    out = {"tuning": f"{len(res.get('tried') or [])} tried, budget {res['tuning-budget']}"}
    if "chosen" in res:
        out["chosen"] = setting_text(res["chosen"]) + (f", round {res['stopped-at']}" if "stopped-at" in res else "")
    elif "chosen-per-party" in res:  # each party chose alone
        out["chosen"] = "; ".join(f"{key} ({count} part{'y' if count == 1 else 'ies'})"
                                  for key, count in party_choices(res).items())
    return out


def cell_text(record: dict) -> str:
    """A table cell from `described`'s fields: the setting chosen and its tuning budget ('-': one setting ran)."""
    if not record.get("tuning"):
        return "-"
    return f"{record.get('chosen') or '-'} ({record['tuning']})"


def party_choices(res: dict) -> dict[str, int]:
    """Where each party chose alone (local-only): each setting chosen, as text, and how many parties chose it."""
    picks: dict[str, int] = {}
    for choice in res.get("chosen-per-party", {}).values():
        key = setting_text({k: v for k, v in choice.items() if k != "validation-accuracy"})
        picks[key] = picks.get(key, 0) + 1
    return picks


def setting_text(setting) -> str:
    """A setting as one line of text: `key=value ...` (a trainer candidate's name as it is)."""
    if not isinstance(setting, dict):
        return str(setting)
    return " ".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}" for k, v in setting.items())
