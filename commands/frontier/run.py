"""Run a frontier: every row a real run on the same partitions, then every applicable attack on the
same victims, through the adversary's one registry and one attack-and-score loop.

1. Runs: one in-process Flower simulation runs the real ServerApp logic once per row (a row is the
   preset plus a strategy/encoder override), so accuracy, bytes sent and wall time come from real
   runs on the same partitions and seeds.
2. Leakage: the victim party's upload (or round update, with the row's defences) is replayed with the
   party's own code, every applicable attack reconstructs the same victims, and each row keeps its
   strongest attack.
3. Re-encoding: the averaging attack against T encodings per sample, for every upload row.
4. Gradient study (`gradient-study` batch sizes): both gradient attackers (BN_exact and BN_infer) against
   every FedAvg/FedProx row at each batch size, the appendix's table.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedsmix import data as datalib
from fedsmix import tuning
from fedsmix.config import INSTAHIDE, Settings, SettingsError, load_settings
from fedsmix.metrics import snr_db
from fedsmix.models import load_split_model
from fedsmix.party import Partition, encode_partition, load_partition
from fedsmix.registry import STRATEGIES
from fedsmix.runs import atomic_write_json, new_run_dir
from server.adversary.analysis import Blind, Outcome, attack_cases, leakage
from server.adversary.cases import Case, public_samples, threat_model, update_case, upload_case
from server.adversary.registry import applicable, build_attacks

from ..simulate import simulate_each
from . import report
from .plan import FrontierPlan, Row, load_plan, parse_row

TRIVIAL = "trivial guess"


@dataclass
class Victims:
    """The private samples every attack is scored on: the first rows of the victim party."""

    part: Partition
    index: torch.Tensor  # rows of part.x

    @property
    def x(self) -> torch.Tensor:
        return self.part.x[self.index]


def victims(settings: Settings, party: int, num_parties: int, count: int) -> Victims:
    part = load_partition(settings, party, num_parties)
    return Victims(part, torch.arange(min(count, len(part.x))))


@dataclass
class Space:
    """Where a row's attacks are scored: the victims (the same images, as pixels or as the backbone's
    features), the public data and the blind guesses made from it."""

    vict: Victims
    public: torch.Tensor
    blind: Blind  # the blind guesses the gains are measured from: the mean sample (also the attacks' prior mean),
    # and a perceptual one for ST-LPIPS


def spaces(base: Settings, rows: list[Row], row_settings: list[Settings], plan: FrontierPlan) -> dict[str, Space]:
    """One Space per space the rows use: pixels from the preset, features from the first feature row."""
    out = {}
    for space, settings in [("pixels", base)] + [(r.space, s) for r, s in zip(rows, row_settings) if r.features][:1]:
        vict = victims(settings, plan.victim_party, plan.parties, base.attack_victims)
        public = public_samples(settings, vict.part.spec)
        out[space] = Space(vict, public, Blind.of(public, to_unit_for(settings, vict)))
    return out


def to_unit_for(settings: Settings, vict: Victims):
    return None if settings.backbone != "none" else (lambda t: datalib.denormalize(t, vict.part.spec))


def check_against_store(replayed: torch.Tensor, upload_path: Path) -> None:
    """The replayed upload must be the one the run stored (same partitions, same seeds, same h)."""
    stored = torch.from_numpy(np.load(upload_path).astype(np.float32))
    if stored.shape != replayed.shape or not torch.equal(stored, replayed.float()):
        raise RuntimeError(f"replayed upload differs from the stored one at {upload_path}: settings or seeds drifted")


def gradient_cases(row: Row, settings: Settings, run: dict, vict: Victims, plan: FrontierPlan,
                   batch_size: int, count: int = 0) -> list[Case]:
    """The victim party's round updates, one per batch of `batch_size` victims, with the row's defences: round 1
    from the initial model, or (gradient-round last) from the row's trained global model; the first `count`
    victims (0 = all)."""
    index = vict.index[:count] if count else vict.index
    mu = settings.proximal_mu if row.strategy == "fedprox" else 0.0
    state, server_round = None, 1
    if plan.gradient_round == "last":
        path = run.get("strategies", {}).get(row.strategy, {}).get("global-model")
        if not path or not Path(path).is_file():
            raise RuntimeError(f"frontier row {row.name}: no trained global model to attack ({path!r})")
        state, server_round = torch.load(path, weights_only=True), settings.rounds + 1
    return [
        update_case(settings, vict.part, index[start : start + batch_size], proximal_mu=mu,
                    batch_size=batch_size, local_epochs=plan.gradient_local_epochs, server_round=server_round,
                    global_state=state)
        for start in range(0, len(index), batch_size)
    ]


def row_cases(row: Row, settings: Settings, run: dict, vict: Victims, prior: torch.Tensor, plan: FrontierPlan,
              encodings_per_sample: int | None = None) -> list[Case]:
    """What the server saw from the victim party in this row, as attackable cases."""
    if row.strategy in ("fedavg", "fedprox"):
        return gradient_cases(row, settings, run, vict, plan, plan.gradient_batch_size)
    if not STRATEGIES[row.strategy].uploads:
        return []  # local-only: nothing a party sends is attacked
    if encodings_per_sample is not None:
        settings = settings.replace(encodings_per_sample=encodings_per_sample)
    encoder = None
    if settings.encoder == "mixcon":  # the split model the run trained and shipped: the white-box h
        encoder = load_split_model(settings, Path(run.get("run-dir", "")), vict.part.sample_shape,
                                   vict.part.num_classes).encoder
    enc, calibration = encode_partition(settings, vict.part,
                                        encoder_state=encoder.state_dict() if encoder is not None else None)
    case = upload_case(settings, vict.part, enc, calibration, vict.index, prior_mean=prior, encoder=encoder)
    stored = Path(run.get("run-dir", "")) / "uploads" / f"party-{plan.victim_party:03d}.x.npy"
    if encodings_per_sample is None and stored.is_file():
        dtype = torch.float16 if settings.upload_dtype == "float16" else torch.float32
        check_against_store(enc.x.to(dtype), stored)
    return [case]


def _digest(cases: list[Case]) -> str:
    """Equal digests: the same updates and labels (FedAvg and FedProx agree after one local step)."""
    h = hashlib.sha256()
    for case in cases:
        for t in [*case.observation.update, case.observation.labels]:
            h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def scored(name: str, summary: dict, per_image: dict, vict: Victims, seconds: float, **info) -> dict:
    """One attack's record: scores, gains over the trivial guess, and against the party's own mean
    sample, an oracle guess: a gain over the trivial guess but not over the party mean means the
    attack learnt the party's average image, not its individual samples."""
    x = vict.x
    party_mean = snr_db(x, vict.part.x.mean(dim=0, keepdim=True).expand_as(x)).mean().item()
    trivial = summary["trivial"]
    if name == TRIVIAL:
        zero = (lambda metric: None if trivial[metric] is None else 0.0)
        a, g = trivial, {"snr_db": 0.0, "psnr_db": zero("psnr_mean"), "ssim": zero("ssim_mean"),
                         "st_lpips": zero("st_lpips_mean")}
        ssim, setting = per_image["trivial"]["ssim"], None
    else:
        entry = summary["attacks"][name]
        a, g, ssim, setting = entry["score"], entry["gain"], per_image[name]["ssim"], entry.get("setting")
    return {
        "attack": name, "attack_setting": setting,
        "snr_db": a["snr_mean"], "psnr_db": a["psnr_mean"], "ssim": a["ssim_mean"],
        "trivial_snr_db": trivial["snr_mean"], "trivial_psnr_db": trivial["psnr_mean"],
        "trivial_ssim": trivial["ssim_mean"], "gain_snr_db": g["snr_db"], "gain_psnr_db": g["psnr_db"],
        "gain_ssim": g["ssim"], "best_ssim": float(ssim.max()) if not torch.isnan(ssim).all() else float("nan"),
        "st_lpips": a.get("st_lpips_mean"), "trivial_st_lpips": trivial.get("st_lpips_mean"),
        "trivial_st_lpips_guess": trivial.get("st_lpips_guess"),
        "gain_st_lpips": g.get("st_lpips"),
        "party_mean_snr_db": party_mean, "gain_vs_party_mean_db": a["snr_mean"] - party_mean,
        "attack_seconds": seconds, **info,
    }


def row_leakage(outcome: Outcome | None, vict: Victims, blind: Blind, to_unit, info: dict):
    """(strongest record, its estimate), and every record: the trivial guess is the floor."""
    if outcome is None or not len(outcome.truth):
        summary, per_image = leakage(vict.x, {}, blind, to_unit)
        estimates, seconds = {}, {}
    else:
        summary, per_image, estimates, seconds = outcome.summary, outcome.per_image, outcome.estimates, outcome.seconds
    trivial = blind.mean.unsqueeze(0).expand_as(vict.x).clone()
    records = [(scored(TRIVIAL, summary, per_image, vict, 0.0), trivial)]
    for name, estimate in estimates.items():
        records.append((scored(name, summary, per_image, vict, seconds.get(name, 0.0), **info), estimate))
    best, x_hat = max(records, key=lambda item: item[0]["gain_snr_db"])
    return (best, x_hat), [r for r, _ in records]


def attack_row(row: Row, settings: Settings, cases: list[Case], public: torch.Tensor, blind: Blind, to_unit,
               plan: FrontierPlan, cache: dict, names: list[str] | None = None) -> Outcome | None:
    names = names if names is not None else [name for name in applicable(row.target) if name in plan.attacks]
    if not cases or not names:
        return None
    key = _digest(cases) + ",".join(names) if row.strategy in ("fedavg", "fedprox") else None
    if key is not None and key in cache:  # FedAvg and FedProx send the same update after one step
        return cache[key]
    attacks, skipped = build_attacks(
        names, settings, public, tuple(cases[0].truth.shape[1:]), gradient_steps=plan.gradient_steps,
        gradient_restarts=plan.gradient_restarts, gradient_tv=plan.gradient_tv,
        gradient_alpha_bn=plan.gradient_alpha_bn, gradient_labels=plan.gradient_labels,
        inversion_steps=plan.inversion_steps, inversion_lr=plan.inversion_lr, inversion_tv=plan.inversion_tv,
        decoder_epochs=plan.decoder_epochs,
    )
    outcome = attack_cases(cases, attacks, blind, to_unit)
    outcome.skipped.update(skipped)
    for name, attack in attacks.items():  # what an attacker's own tuning chose, one value per attacked update
        chosen = getattr(attack, "chosen", None)
        if chosen and name in outcome.summary.get("attacks", {}):
            outcome.summary["attacks"][name]["setting"] = "alpha_TV " + " / ".join(f"{t:g}" for t in chosen)
    if outcome.errors:
        raise RuntimeError(f"frontier row {row.name}: attacks failed: {outcome.errors}")
    if key is not None:
        cache[key] = outcome
    return outcome


def reencoding(rows: list[Row], row_settings: list[Settings], runs: list[dict], where: dict[str, Space],
               plan: FrontierPlan) -> list[dict]:
    """The averaging attack against T encodings of each private sample (InstaHide re-encodes every epoch)."""
    out = []
    for row, settings, run in zip(rows, row_settings, runs):
        if not STRATEGIES[row.strategy].uploads or row.target == "mixcon":  # h(x) is the same at every re-encoding
            continue
        vict, prior = where[row.space].vict, where[row.space].blind.mean
        to_unit = to_unit_for(settings, vict)
        attacks, _ = build_attacks(["averaging"], settings, None)
        for T in plan.reencoding:
            cases = row_cases(row, settings, run, vict, prior, plan, encodings_per_sample=T)
            outcome = attack_cases(cases, attacks, where[row.space].blind, to_unit)
            record = scored("averaging", outcome.summary, outcome.per_image, vict, outcome.seconds["averaging"])
            out.append({"strategy": row.name, "space": row.space, "encodings_per_sample": T, **record})
    return out


def privacy_parameters(row: Row, settings: Settings, result: dict) -> dict:
    """Each defence's own privacy parameter in its own column (different units: never one axis)."""
    upload = STRATEGIES[row.strategy].uploads
    mixcon = upload and settings.encoder == "mixcon"
    lam, beta = settings.mixcon_lambda, settings.mixcon_beta
    return {
        "tau": settings.tau if upload and settings.encoder == "singularized" else None,
        "upload_k": settings.mix_k if upload and settings.encoder in ("mixup", *INSTAHIDE) else None,
        "mixcon": (f"lambda={lam:g} beta={beta:g}" if lam else "lambda=0 (vanilla split)") if mixcon else None,
        "prune_p": settings.prune_ratio if settings.prune_ratio > 0 and not upload else None,
        "batch_mix": (f"{settings.batch_mix} k={settings.batch_mix_k}"
                      if settings.batch_mix != "none" and not upload else None),
        "dp_fedavg_epsilon": (result.get("dp-fedavg") or {}).get("epsilon"),
        "dp_fedavg_noise": (result.get("dp-fedavg") or {}).get("noise-multiplier"),
        "dp_sgd_epsilon": (result.get("dp-sgd") or {}).get("epsilon"),
    }


def time_overheads(records: list[dict]) -> None:
    """Each FedAvg/FedProx row's local training time (mean party, all rounds) over undefended FedAvg's of its own
    space (`fedavg`, `fedavg-features`), same run."""
    base = {r["space"]: r.get("local_train_seconds") for r in records if r["strategy"] in ("fedavg", "fedavg-features")}
    for r in records:
        mine, reference = r.get("local_train_seconds"), base.get(r["space"])
        r["time_overhead"] = mine / reference if mine is not None and reference else None


def gradient_study(rows: list[Row], row_settings: list[Settings], runs: list[dict], where: dict[str, Space],
                   plan: FrontierPlan) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The appendix's table: both gradient attackers against every pixel-space FedAvg/FedProx row at each study
    batch size; and the strongest attacker's (BN_exact) reconstructions of the first victims, one panel per row
    and batch size (every batch starts with the same victims)."""
    out, panels = [], {}
    names = [n for n in ("gradient", "gradient-realistic") if n in plan.attacks]
    vict, public, blind = where["pixels"].vict, where["pixels"].public, where["pixels"].blind
    for row, settings, run in zip(rows, row_settings, runs):
        if row.strategy not in ("fedavg", "fedprox") or row.features or run.get("error"):
            continue
        to_unit = to_unit_for(settings, vict)
        for B in plan.gradient_study:
            count = max(B, plan.gradient_study_victims) if plan.gradient_study_victims else 0
            try:
                cases = gradient_cases(row, settings, run, vict, plan, B, count)
            except ValueError as err:  # the model cannot train on such a batch (BatchNorm1d and B = 1)
                out.append({"strategy": row.name, "study_batch_size": B, "attack": f"none: {err}"})
                continue
            outcome = attack_row(row, settings, cases, public, blind, to_unit, plan, {}, names)
            scored_on = Victims(vict.part, vict.index[: len(outcome.truth)])
            for name in outcome.estimates:
                record = scored(name, outcome.summary, outcome.per_image, scored_on, outcome.seconds[name],
                                victims=len(outcome.truth), **cases[0].info)
                out.append({"strategy": row.name, "study_batch_size": B, **record})
                print(f"  study {row.name} B={B} {name}: gain {record['gain_snr_db']:+.2f} dB", flush=True)
            if names[0] in outcome.estimates:
                panels[f"{row.name}\nB={B} {names[0]}"] = outcome.estimates[names[0]]
    return out, panels


def reused_runs(reuse: Path, rows: list[Row], row_settings: list[Settings], plan: FrontierPlan) -> dict[int, dict]:
    """The rows an earlier frontier (`--reuse <its directory>`) already ran with the same settings and finished,
    by row index: their results.json. A row runs again when its settings changed (the keys are named), it
    failed, or what its attacks replay (the trained global model) is gone."""
    from server.resume import changed_settings

    if not (reuse / "runs").is_dir():
        raise SettingsError(f"frontier --reuse: {reuse} holds no runs/ directory of an earlier frontier")
    earlier = {}
    for path in sorted((reuse / "runs").glob("*/results.json")):  # time-stamped names: the latest run wins
        results = json.loads(path.read_text())
        results["run-dir"] = str(path.parent.resolve())  # where it is now, whatever it was called when it ran
        earlier[results.get("settings", {}).get("run-name")] = results
    out = {}
    for i, (row, settings) in enumerate(zip(rows, row_settings)):
        results = earlier.get(row.name)
        result = (results or {}).get("strategies", {}).get(row.strategy)
        if results is None or results.get("error") or result is None or "error" in result:
            continue
        changed = changed_settings(results.get("settings", {}), settings)
        if changed:
            print(f"  {row.name}: runs again, settings changed ({', '.join(changed)})", flush=True)
            continue
        model = result.get("global-model")
        if row.strategy in ("fedavg", "fedprox") and plan.gradient_round == "last" and not (
                model and Path(model).is_file()):
            continue
        out[i] = results
    return out


def _attack_scope(settings: Settings, plan: FrontierPlan) -> dict:
    """What a row's attacks depend on besides its trained run: its settings and the plan, less the row list."""
    from fedsmix.config import dump_settings

    return json.loads(json.dumps({"settings": dump_settings(settings),
                                  "plan": plan.model_dump(mode="json", by_alias=True, exclude={"rows"})}))


def save_attacks(run_dir: Path, row: Row, settings: Settings, plan: FrontierPlan, best: dict, every: list[dict],
                 x_hat: torch.Tensor) -> None:
    """A row's attack records as soon as they exist (`attacks/<row>.pt`), so that a stopped attack phase keeps
    the rows it finished: `--reuse` of this directory takes them back."""
    path = run_dir / "attacks" / f"{row.name}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"scope": json.dumps(_attack_scope(settings, plan)), "best": json.dumps(best),
                "every": json.dumps(every), "x_hat": x_hat.detach().cpu()}, partial)
    partial.replace(path)


def earlier_attacks(reuse: Path, row: Row, settings: Settings, plan: FrontierPlan):
    """(best, every, x_hat) of a reused row's attacks in the earlier frontier, or None where they must run again:
    none saved, or the row's settings or the plan's attack keys changed (named)."""
    from server.resume import changed_settings

    path = reuse / "attacks" / f"{row.name}.pt"
    if not path.is_file():
        return None
    saved = torch.load(path, weights_only=True)
    stored, now = json.loads(saved["scope"]), _attack_scope(settings, plan)["plan"]
    changed = changed_settings(stored["settings"], settings) + sorted(
        k for k in set(stored["plan"]) | set(now) if stored["plan"].get(k) != now.get(k))
    if changed:
        print(f"  {row.name}: attacked again, {', '.join(changed)} changed", flush=True)
        return None
    return json.loads(saved["best"]), json.loads(saved["every"]), saved["x_hat"]


def feature_budget(rows: list[Row], row_settings: list[Settings]) -> str:
    """The feature-space rows' own budget, for the table's header ('' without such rows)."""
    first = next((s for r, s in zip(rows, row_settings) if r.features), None)
    if first is None:
        return ""
    return (f"Feature-space rows: {first.backbone} features at {first.image_size} px of the same images, head "
            f"trained {first.epochs} epochs (batch {first.batch_size}, lr {first.lr:g}), trainer {first.trainer}, "
            f"FedAvg/FedProx {first.rounds} rounds at client-lr {first.client_lr:g}; their leakage is scored in "
            f"feature space (victims' and public images through the same backbone). ")


def run_frontier(preset: str, overrides: dict | None = None, plan_overrides: dict | None = None,
                 reuse: str | Path | None = None) -> dict:
    t_start = time.perf_counter()
    base = load_settings({**(overrides or {}), "preset": preset})
    plan = load_plan(preset, plan_overrides)
    rows = [parse_row(name) for name in plan.rows]
    if base.attack_pairing != "oracle":  # the frontier's rows re-encode (T > 1) and mix other encoders
        raise SettingsError("frontier: attack-pairing must be 'oracle' here; the recovered-pairing leakage of "
                            "singularized mixup is measured by `fedsmix attack --set attack-pairing=recovered`")
    run_dir = new_run_dir(base.runs_dir, f"frontier-{datalib.dataset_key(base)}")
    print(f"fedsmix frontier: {len(rows)} rows, {plan.parties} parties; output in {run_dir}", flush=True)
    row_settings = [row.settings(base, run_dir / "runs", plan.parties, plan.features) for row in rows]
    reused = reused_runs(Path(reuse).expanduser(), rows, row_settings, plan) if reuse else {}
    if reused:
        print(f"fedsmix frontier: reusing {len(reused)} finished row(s) of {reuse}: "
              f"{', '.join(rows[i].name for i in reused)}", flush=True)
    for results in reused.values():  # linked, so that this directory can be reused in turn
        link = run_dir / "runs" / Path(results["run-dir"]).name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(results["run-dir"], target_is_directory=True)
    todo = [i for i in range(len(rows)) if i not in reused]
    fresh = iter(simulate_each([row_settings[i] for i in todo], plan.parties) if todo else [])
    runs = [reused[i] if i in reused else next(fresh) for i in range(len(rows))]

    where = spaces(base, rows, row_settings, plan)
    records, attacks, panels, cache = [], [], {}, {}
    attacks_reused = []
    for i, (row, settings, run) in enumerate(zip(rows, row_settings, runs)):
        result = run.get("strategies", {}).get(row.strategy, {})
        saved = earlier_attacks(Path(reuse).expanduser(), row, settings, plan) if i in reused else None
        if saved is None:
            space = where[row.space]
            vict, public, prior = space.vict, space.public, space.blind.mean
            to_unit = to_unit_for(settings, vict)
            cases = row_cases(row, settings, run, vict, prior, plan)
            outcome = attack_row(row, settings, cases, public, space.blind, to_unit, plan, cache)
            info = cases[0].info if cases else {}
            (best, x_hat), every = row_leakage(outcome, vict, space.blind, to_unit, info)
        else:
            best, every, x_hat = saved
            attacks_reused.append(row.name)
            print(f"  {row.name}: attacks reused from {reuse}", flush=True)
        save_attacks(run_dir, row, settings, plan, best, every, x_hat)
        measured = result.get("mean-bytes-up-per-party", 0.0)
        base_record = {
            "strategy": row.name,
            "space": row.space,
            "accuracy": result.get("accuracy"),
            **tuning.described(result),  # the setting its selection chose on the parties' validation, and the budget
            # local-only parties send nothing; the simulator returns their models only to evaluate them
            "bytes_up_per_party": 0.0 if row.strategy == "local-only" else measured,
            "measured_bytes_up_per_party": measured,
            "wall_seconds": result.get("wall-seconds"),
            "local_train_seconds": result.get("local-train-seconds"),
            **privacy_parameters(row, settings, result),
            "run_dir": run.get("run-dir"),
            "error": run.get("error") or result.get("error"),
        }
        records.append({**base_record, **best})
        attacks += [{**base_record, **s} for s in every]
        if row.space == "pixels":  # the figure shows images; feature rows' estimates are vectors
            panels[f"{row.name}\n{best['attack']}"] = x_hat
        print(f"  {row.name}: accuracy {base_record['accuracy']}, strongest {best['attack']} "
              f"gain {best['gain_snr_db']:+.2f} dB", flush=True)
    time_overheads(records)
    for r in attacks:
        r["time_overhead"] = next(x["time_overhead"] for x in records if x["strategy"] == r["strategy"])
    report.dominated_by(records)
    study = reencoding(rows, row_settings, runs, where, plan)
    gstudy, gpanels = gradient_study(rows, row_settings, runs, where, plan)
    vict = where["pixels"].vict
    tv_text = "/".join(f"{t:g}" for t in plan.gradient_tv) + (
        ", chosen on a public probe batch" if len(plan.gradient_tv) > 1 else "")
    attacked_round = ("first-round update (initial model)" if plan.gradient_round == "first"
                      else f"round-{base.rounds + 1} update (the row's trained global model)")
    attacks_note = (f"Attacks reused from there (same settings and plan): {len(attacks_reused)}. "
                    if attacks_reused else "")
    meta = {
        "dataset": base.dataset,
        "threat-model": threat_model(base),
        "budget": (
            f"{base.dataset}, train-subset {base.train_subset or 'all'}, {plan.parties} parties "
            f"({base.partitioner}), seed {base.seed}; victims: party {plan.victim_party}'s first "
            f"{len(vict.index)} of {len(vict.part.x)} samples, the same for every attack. Central/local training "
            f"{base.epochs} epochs, FedAvg/FedProx {base.rounds} rounds x {base.local_epochs} local epoch(s) "
            f"(mu {base.proximal_mu}), batch {base.batch_size}. abs-solve {base.attack_steps} iterations; gradient "
            f"inversion {plan.gradient_steps} steps x {plan.gradient_restarts} restarts (TV {tv_text}, "
            f"alpha_BN {plan.gradient_alpha_bn:g}, labels {plan.gradient_labels}) on the "
            f"{attacked_round} "
            f"of B={plan.gradient_batch_size} image(s), {plan.gradient_local_epochs} local epoch(s); 'gradient' is the "
            f"appendix's strongest attacker (BN_exact, dropout masks known; against batch mixing the coefficients and "
            f"indices known), 'gradient-realistic' BN_infer. Model inversion "
            f"(mixcon rows) {plan.inversion_steps} SGD steps at lr {plan.inversion_lr:g}, TV weight chosen on 16 "
            f"public images among {', '.join(f'{t:g}' for t in plan.inversion_tv)}; "
            f"its decoder {plan.decoder_epochs} epochs on the public images. Threat model for uploads: the "
            f"oracle pairing (the attacker is handed W, the pairing and r; for mixcon rows, h's weights). "
            f"{feature_budget(rows, row_settings)}"
            f"{f'Rows reused from {reuse} (run there, same settings): {len(reused)}. ' if reused else ''}"
            f"{attacks_note}"
            f"Total wall time {time.perf_counter() - t_start:.0f} s."
        ),
    }
    files = report.write_all(run_dir, records, attacks, study, meta, vict.x, panels, to_unit_for(base, vict),
                             gstudy, gpanels)
    summary = {
        "run-dir": str(run_dir), "plan": plan.model_dump(by_alias=True), "settings": base.model_dump(by_alias=True),
        "meta": meta, "records": records, "attacks": attacks, "reencoding": study, "gradient-study": gstudy,
        "files": files,
    }
    atomic_write_json(run_dir / "frontier.json", summary)
    print((run_dir / "frontier.md").read_text(), flush=True)
    return summary
