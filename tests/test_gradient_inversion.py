"""Inverting gradients against a first-round FedAvg/FedProx update, produced as the ClientApp trains."""

import pytest
import torch

from fedsmix import data
from fedsmix.config import load_settings
from fedsmix.metrics import score
from fedsmix.party import load_partition
from fedsmix.training import soft_cross_entropy
from server.adversary.cases import public_samples, update_case
from server.adversary.gradient import InvertingGradients, attacker_copy, cosine_distance

pytestmark = pytest.mark.usefixtures("one_thread")


def first_round_update(settings, part, rows, mu, batch_size, local_epochs):
    """The party's first-round update on `rows`, trained by the party's own code."""
    return update_case(
        settings, part, rows, proximal_mu=mu, batch_size=batch_size, local_epochs=local_epochs
    ).observation


@pytest.fixture(scope="module")
def victim(data_dir):
    settings = load_settings({"dataset": "mnist", "data-dir": data_dir, "train-subset": 600, "partitioner": "iid"})
    return settings, load_partition(settings, 0, 2)


def test_a_single_image_batch_trains_a_conv_net(victim):
    """BatchNorm2d normalises over H x W, so batch size 1 is a real SGD step (BatchNorm1d would skip it)."""
    settings, part = victim
    obs = first_round_update(settings, part, torch.tensor([0]), mu=0.01, batch_size=1, local_epochs=1)
    assert obs.local_steps == 1 and obs.batch_size == 1
    assert sum(float(u.abs().sum()) for u in obs.update) > 0


def test_one_step_update_is_the_gradient_of_the_image_under_the_replayed_dropout_mask(victim):
    settings, part = victim
    obs = first_round_update(settings, part, torch.tensor([3]), mu=0.01, batch_size=1, local_epochs=1)
    x, y = part.x[3:4], data.one_hot(part.labels[3:4], 10)
    replayed = attacker_copy(obs.model, obs.update, obs.lr, obs.weight_decay)
    grads = torch.autograd.grad(soft_cross_entropy(replayed(x), y), list(replayed.parameters()))
    assert float(cosine_distance(list(grads), obs.update)) < 1e-4  # exact up to weight decay and rounding
    blind = attacker_copy(obs.model)  # dropout switched off instead: a visibly different direction
    grads = torch.autograd.grad(soft_cross_entropy(blind(x), y), list(blind.parameters()))
    assert float(cosine_distance(list(grads), obs.update)) > 0.05


def test_inverting_gradients_recovers_one_image_from_a_single_step_update(victim):
    settings, part = victim
    row = torch.tensor([0])
    obs = first_round_update(settings, part, row, mu=0.0, batch_size=1, local_epochs=1)
    attack = InvertingGradients(steps=400, restarts=1, seed=0)
    x_hat = attack.reconstruct(obs)
    assert x_hat.shape == part.x[row].shape
    to_unit = lambda t: data.denormalize(t, part.spec)  # noqa: E731
    recovered, _ = score(part.x[row], x_hat, to_unit)
    trivial, _ = score(part.x[row], public_samples(settings, part.spec).mean(dim=0).unsqueeze(0), to_unit)
    assert attack.last_losses[0] < 0.05  # the cosine objective is (nearly) met
    assert recovered.snr_mean > trivial.snr_mean + 6 and recovered.ssim_mean > trivial.ssim_mean + 0.12


def test_gradient_inversion_checks_the_update_matches_the_model(victim):
    settings, part = victim
    obs = first_round_update(settings, part, torch.tensor([0]), mu=0.0, batch_size=1, local_epochs=1)
    obs.update = obs.update[:-1]
    with pytest.raises(ValueError, match="trainable parameters"):
        InvertingGradients(steps=8, restarts=1).reconstruct(obs)


def test_snapshots_are_one_schedule_read_along_the_way_and_end_at_the_answer(victim):
    """The budget study's learning curve: the winning restart's unknowns after given steps of one schedule."""
    settings, part = victim
    obs = first_round_update(settings, part, torch.tensor([0]), mu=0.0, batch_size=1, local_epochs=1)
    attack = InvertingGradients(steps=40, restarts=2, seed=0, snapshots=(10, 40, 99))
    x_hat = attack.reconstruct(obs)
    assert sorted(attack.taken) == [10, 40]  # a step beyond the schedule is never reached
    assert torch.equal(attack.taken[40], x_hat)
    assert not torch.equal(attack.taken[10], x_hat)


def test_cnn_width_sets_the_model_whose_update_the_attacker_inverts(victim):
    """`cnn-width` widens both conv blocks: more gradient equations per unknown pixel for the same batch."""
    settings, part = victim
    narrow = first_round_update(settings, part, torch.arange(4), mu=0.0, batch_size=4, local_epochs=1)
    wide = first_round_update(settings.replace(cnn_width=64), part, torch.arange(4), mu=0.0, batch_size=4,
                              local_epochs=1)
    count = lambda obs: sum(u.numel() for u in obs.update)  # noqa: E731
    assert wide.model.features[0].out_channels == 64 and narrow.model.features[0].out_channels == 32
    assert count(wide) > 2 * count(narrow)


def test_alpha_tv_grid_is_chosen_on_a_public_probe_put_through_the_same_round(victim):
    """The attacker tunes alpha_TV on public images it trains through the victims' round itself (same model, batch
    size, steps, labels), never on the victims; the best probe reconstruction decides."""
    from server.adversary.registry import build_attack, public_probe

    settings, part = victim
    public = public_samples(settings, part.spec)
    obs = first_round_update(settings, part, torch.arange(4), mu=0.0, batch_size=4, local_epochs=1)
    probe = public_probe(settings, public)(obs)
    assert torch.equal(probe.truth, public[:4].float())  # the attacker's own images, not the victims'
    same = torch.equal(probe.observation.labels.sort().values, obs.labels.sort().values)  # the step shuffles rows
    assert same and probe.observation.batch_size == 4
    assert probe.observation.local_steps == obs.local_steps
    assert all(torch.equal(a, b) for a, b in zip(probe.observation.model.state_dict().values(),
                                                 obs.model.state_dict().values()))
    attack = build_attack("gradient", settings, public=public, gradient_steps=16, gradient_restarts=1,
                          gradient_tv=(1e-2, 1e-1))
    x_hat = attack.reconstruct(obs)
    assert set(attack.probe_scores) == {1e-2, 1e-1}
    assert attack.tv == max(attack.probe_scores, key=attack.probe_scores.get)
    assert x_hat.shape == (4, *part.sample_shape) and "chosen on a public probe" in attack.threat_model
    fixed = build_attack("gradient", settings, public=public, gradient_steps=16, gradient_restarts=1, gradient_tv=0.1)
    fixed.reconstruct(obs)
    assert fixed.probe_scores == {} and fixed.tv == 0.1  # one value: no probe is run
