"""Defences in local training and the realistic gradient attacker, on small MNIST slices."""

from pathlib import Path

import numpy as np
import pytest
import torch

from commands.frontier.plan import parse_row
from fedsmix import data
from fedsmix.config import SettingsError, load_settings
from fedsmix.defences import dp_sgd_spent
from fedsmix.metrics import score
from fedsmix.models import new_classifier
from fedsmix.party import load_partition, train_local
from fedsmix.training import StepTrace
from server.adversary.cases import public_samples, update_case
from server.adversary.gradient import InvertingGradients, attacker_copy, restore_labels

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def mnist(data_dir):
    # the attacked party's whole partition (no validation split: the batches the thresholds were measured on)
    settings = load_settings({"dataset": "mnist", "data-dir": data_dir, "train-subset": 600, "partitioner": "iid",
                              "batch-size": 32, "rounds": 3, "validation-fraction": 0.0, "tuning-budget": 1})
    return settings, load_partition(settings, 0, 2)


def one_round(settings, part, **changes):
    settings = settings.replace(**changes)
    state = new_classifier(settings, part.sample_shape, part.num_classes).state_dict()
    trace = StepTrace()
    result = train_local(settings, part, state, server_round=1, trace=trace)
    named = dict(result.model.named_parameters())
    update = {k: named[k].detach() - state[k] for k in named}
    return settings, result, update, trace


@pytest.mark.parametrize("ratio", [0.5, 0.9, 0.99])
def test_pruning_zeroes_the_stated_fraction_of_each_update(mnist, ratio):
    settings, part = mnist
    _, _, dense, _ = one_round(settings, part)
    assert all(float((u == 0).float().mean()) < 0.05 for u in dense.values())  # an unpruned update is dense
    _, _, pruned, _ = one_round(settings, part, prune_ratio=ratio)
    for name, u in pruned.items():
        zeros = int((u == 0).sum())
        assert zeros == int(ratio * u.numel()), name  # exactly floor(p n) entries of every tensor
        kept = u != 0  # the kept entries are the largest changes of that tensor in the party's own round
        if kept.any() and (~kept).any():
            assert float(dense[name][kept].abs().min()) >= float(dense[name][~kept].abs().max()) - 1e-6


@pytest.mark.parametrize("mix", ["mixup", "instahide"])
@pytest.mark.parametrize("batch_size", [1, 16])
def test_the_defended_local_batch_holds_no_raw_image(mnist, mix, batch_size):
    settings, part = mnist
    _, result, _, trace = one_round(settings, part, batch_mix=mix, batch_mix_k=4, batch_size=batch_size,
                                    local_epochs=1, train_subset=600)
    assert result.report.steps == len(trace.inputs) > 0
    raw = part.x.flatten(1)
    for inputs, encoded in zip(trace.inputs[:20], trace.mixes[:20]):
        flat = inputs.flatten(1)
        nearest = torch.cdist(flat, raw).min(dim=1).values / raw.norm(dim=1).mean()
        assert float(nearest.min()) > 0.1  # no input is (close to) any of the party's images
        assert encoded.weights.max() <= 0.65 + 1e-6 and torch.allclose(encoded.weights.sum(1), torch.ones(len(flat)))
        assert (encoded.signs is not None) == (mix == "instahide")
    if mix == "instahide":  # fresh masks: two steps never share one
        assert not torch.equal(trace.mixes[0].signs[0], trace.mixes[1].signs[0])


def test_dp_sgd_spends_its_target_epsilon_through_opacus(mnist):
    settings, part = mnist
    settings, result, _, _ = one_round(settings, part, model_norm="group", dp_sgd_epsilon=4.0)
    assert result.report.dp_noise_multiplier > 0.5
    spent = [dp_sgd_spent(settings, result.report, r) for r in (1, settings.rounds)]
    assert spent[0] < spent[1] and spent[1] == pytest.approx(4.0, rel=0.02)  # the budget is the whole run's


def test_dp_settings_name_what_they_need():
    with pytest.raises(SettingsError, match="model-norm"):
        load_settings({"dp-sgd-epsilon": 8})
    with pytest.raises(SettingsError, match="model-norm"):
        load_settings({"dp-fedavg": "server"})
    with pytest.raises(SettingsError, match="batch-mix-k"):
        load_settings({"batch-mix": "mixup", "batch-mix-k": 2, "coefficient-cap": 0.4})


def test_defence_rows_parse_into_overrides():
    row = parse_row("fedavg-instahide-k4-prune0.9")
    assert row.overrides == {"batch_mix": "instahide", "batch_mix_k": 4, "prune_ratio": 0.9}
    assert parse_row("fedprox-dpsgd-eps8").overrides == {"model_norm": "group", "dp_sgd_epsilon": 8.0}
    for bad in ("fedavg-prune0.9-prune0.5", "fedavg-prune1.5", "fedavg-dp-eps0", "fedavg-blur"):
        with pytest.raises(SettingsError, match="frontier.rows"):
            parse_row(bad)


def test_a_dp_fedavg_row_solves_its_noise_for_the_target_epsilon():
    from strategies import dp_fedavg

    row = parse_row("fedavg-dp-eps4")
    settings = row.settings(load_settings({"rounds": 6}), Path("/tmp/x"), parties=10)
    assert settings.dp_fedavg == "server" and settings.model_norm == "group"
    spent = dp_fedavg.epsilon(settings.dp_noise_multiplier, 6, 10, 10, settings.dp_delta)
    assert spent == pytest.approx(4.0, rel=0.01) and spent <= 4.0


def test_the_dp_wrapper_adds_noise_of_its_stated_size():
    """Flower's wrapper around our strategy: noise std z C / m on the aggregate, a different draw per seed."""
    from flwr.app import ArrayRecord

    from strategies import dp_fedavg
    from strategies.fedprox import ReportingFedProx

    settings = load_settings({"dp-fedavg": "server", "model-norm": "group", "dp-noise-multiplier": 2.0,
                              "dp-clipping-norm": 0.5})
    wrapper = dp_fedavg.wrap(ReportingFedProx(None, weighted_by_key="equal-weight"), settings, sampled=4)
    zero = ArrayRecord([np.zeros(20000, dtype=np.float32)])
    draws = []
    for seed in (0, 1):
        np.random.seed(seed)
        draws.append(wrapper._add_noise_to_aggregated_arrays(zero).to_numpy_ndarrays()[0])
    assert not np.array_equal(draws[0], draws[1])
    assert float(draws[0].std()) == pytest.approx(2.0 * 0.5 / 4, rel=0.03)


def test_idlg_restores_single_labels_and_counts_restore_a_batch(mnist):
    settings, part = mnist
    for row in range(5):
        obs = update_case(settings, part, torch.tensor([row]), proximal_mu=0.0, batch_size=1,
                          local_epochs=1).observation
        params = [p for p in attacker_copy(obs.model).parameters() if p.requires_grad]
        assert restore_labels(obs, params).tolist() == obs.labels.tolist()
    obs = update_case(settings, part, torch.arange(8), proximal_mu=0.0, batch_size=8, local_epochs=1).observation
    params = [p for p in attacker_copy(obs.model).parameters() if p.requires_grad]
    restored = restore_labels(obs, params)
    assert len(restored) == 8
    assert sum(min(int((restored == c).sum()), int((obs.labels == c).sum())) for c in range(10)) >= 6


def test_bn_exact_beats_bn_infer_on_a_small_batch(mnist):
    """Same update, same start: knowing the batch's BatchNorm statistics recovers the images better."""
    settings, part = mnist
    case = update_case(settings, part, torch.arange(8), proximal_mu=0.0, batch_size=8, local_epochs=1)
    assert len(case.observation.bn_stats) == 2
    to_unit = lambda t: data.denormalize(t, part.spec)  # noqa: E731
    prior = public_samples(settings, part.spec).mean(dim=0)
    trivial, _ = score(case.truth, prior.expand_as(case.truth), to_unit)
    results = {}
    for bn in ("exact", "infer"):
        attack = InvertingGradients(steps=240, restarts=1, bn=bn, alpha_bn=1e-2, dropout="known", seed=0)
        estimate = case.align(case.truth, attack.reconstruct(case.observation)[case.rows])
        results[bn], _ = score(case.truth, estimate, to_unit)
    assert results["exact"].snr_mean > results["infer"].snr_mean + 1  # measured: 5.67 against 3.97 dB (slice)
    assert results["exact"].ssim_mean > results["infer"].ssim_mean + 0.2  # 0.61 against 0.25
    assert results["exact"].snr_mean > trivial.snr_mean + 6  # and it leaks: well above the blind guess


def test_the_mixup_attacker_reconstructs_the_originals_it_was_told_about(mnist):
    """Against a MixUp-defended update the strongest attacker knows coefficients and indices: it recovers the
    originals (every image mixed into the batch), scored on the victims among them."""
    settings, part = mnist
    settings = settings.replace(batch_mix="mixup", batch_mix_k=4)
    case = update_case(settings, part, torch.arange(4), proximal_mu=0.0, batch_size=4, local_epochs=1)
    obs = case.observation
    assert obs.mix_weights.shape == (4, 4) and obs.targets.shape == (4, 10) and not obs.masked
    originals = int(obs.mix_sources.max()) + 1
    estimate = InvertingGradients(steps=16, restarts=1, bn="exact", dropout="known").reconstruct(obs)
    assert estimate.shape == (originals, *part.sample_shape) and len(case.rows) == 4
    assert case.info["originals"] == originals >= 4


@pytest.mark.sim
@pytest.mark.slow
def test_a_dp_run_reports_the_accountants_epsilon_with_every_defence_at_once(runs_dir):
    """One FedAvg run through the real ServerApp/ClientApp with all defences combined: Flower's client-side
    clipping wrapper (and its mod), per-party DP-SGD, Intra-InstaHide batches and pruning."""
    from dp_accounting import dp_event, rdp

    from commands.simulate import simulate

    overrides = {"dataset": "digits", "strategies": "fedavg", "rounds": 2, "batch-size": 32, "runs-dir": runs_dir,
                 "partitioner": "iid", "model-norm": "group", "dp-fedavg": "client", "dp-noise-multiplier": 1.5,
                 "dp-clipping-norm": 0.5, "dp-sgd-epsilon": 6.0, "batch-mix": "instahide", "prune-ratio": 0.9,
                 "tuning-budget": 2}
    result = simulate(overrides, num_parties=2)["strategies"]["fedavg"]
    assert "error" not in result, result.get("error")
    dp = result["dp-fedavg"]

    def accountant(releases: int) -> float:  # Google's RDP accountant directly, add-or-remove-one adjacency
        rdp_accountant = rdp.RdpAccountant()
        rdp_accountant.compose(dp_event.GaussianDpEvent(1.5), releases)
        return rdp_accountant.get_epsilon(1e-5)

    # both settings tried trained on the parties' data: the guarantee covers their 2 x 2 releases
    assert dp["releases"] == 4 and dp["sampled-per-round"] == 2
    assert dp["epsilon"] == pytest.approx(accountant(4), rel=1e-6)
    assert dp["epsilon-one-setting"] == pytest.approx(accountant(2), rel=1e-6)
    clipping = result["chosen"]["dp-clipping-norm"]  # the clipping norms are tuned (epsilon does not move)
    assert {t["dp-clipping-norm"] for t in result["tried"]} >= {0.5} and "dp-sgd-max-grad-norm" in result["chosen"]
    assert dp["noise-std"] == pytest.approx(1.5 * clipping / 2)
    assert result["dp-sgd"]["epsilon-one-setting"] == pytest.approx(6.0, rel=0.02)
    assert result["dp-sgd"]["epsilon"] == pytest.approx(12.0, rel=0.02)  # sequential composition of the two
    saved = torch.load(result["global-model"], weights_only=True)
    assert not any("running" in key for key in saved)  # GroupNorm: every array sent is clipped and noised


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_the_defences_presets_plan_every_row(dataset):
    from commands.frontier.plan import load_plan

    preset = f"configs/frontier-defences-{dataset}.yaml"
    base, plan = load_settings(preset=preset), load_plan(preset)
    pixel_rows = [name for name in plan.rows if not parse_row(name).features]
    assert len(pixel_rows) == 25 and plan.gradient_batch_size == 32 and plan.gradient_round == "last"
    built = {name: parse_row(name).settings(base, Path("/tmp/x"), plan.parties, plan.features) for name in plan.rows}
    assert built["fedavg-instahide-k4-prune0.9"].batch_mix == "instahide"
    assert built["fedavg-dp-eps2"].dp_noise_multiplier > built["fedavg-dp-eps32"].dp_noise_multiplier
