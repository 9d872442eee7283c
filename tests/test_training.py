import torch
from torch import nn

from fedsmix.models import MLPHead, UNet, build_classifier
from fedsmix.training import TrainConfig, proximal_term, soft_cross_entropy, train


def test_soft_cross_entropy_is_eq7_and_ce_on_one_hot():
    logits = torch.randn(8, 5)
    labels = torch.randint(0, 5, (8,))
    one_hot = nn.functional.one_hot(labels, 5).float()
    assert torch.allclose(soft_cross_entropy(logits, one_hot), nn.functional.cross_entropy(logits, labels))
    soft = torch.softmax(torch.randn(8, 5), dim=1)
    assert torch.allclose(soft_cross_entropy(logits, soft), -(soft * torch.log_softmax(logits, 1)).sum(1).mean())


def test_proximal_term_is_the_squared_distance():
    model = nn.Linear(3, 2)
    reference = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model.weight.add_(2.0)  # 6 weights moved by 2: squared distance 24, unsquared sqrt(24)
    assert torch.isclose(proximal_term(model, reference), torch.tensor(24.0))


def test_proximal_training_stays_closer_to_the_global_model():
    torch.manual_seed(0)
    x, labels = torch.randn(256, 10), torch.randint(0, 3, (256,))
    y = nn.functional.one_hot(labels, 3).float()
    start = nn.Linear(10, 3)
    reference = [p.detach().clone() for p in start.parameters()]
    distances = {}
    for mu in (0.0, 1.0):
        model = nn.Linear(10, 3)
        model.load_state_dict(start.state_dict())
        cfg = TrainConfig(
            epochs=5, batch_size=32, lr=0.1, optimizer="sgd", cosine=False, proximal_mu=mu, weight_decay=0
        )
        train(model, x, y, cfg, torch.Generator().manual_seed(0), proximal_reference=reference)
        distances[mu] = float(proximal_term(model, reference).detach())
    assert distances[1.0] < 0.5 * distances[0.0]


def test_resume_from_checkpoint_is_bit_identical(tmp_path):
    x, labels = torch.randn(300, 16), torch.randint(0, 4, (300,))
    y = nn.functional.one_hot(labels, 4).float()
    cfg = TrainConfig(epochs=6, batch_size=32)

    def fresh():
        torch.manual_seed(0)
        return MLPHead(16, 4, hidden=(32, 16))

    full = fresh()
    torch.manual_seed(1)
    train(full, x, y, cfg, torch.Generator().manual_seed(0))

    ckpt = tmp_path / "central.pt"

    class Crash(Exception):
        pass

    def crash_after_3(epoch, loss):
        if epoch == 3:
            raise Crash

    partial = fresh()
    torch.manual_seed(1)
    try:
        train(
            partial,
            x,
            y,
            cfg,
            torch.Generator().manual_seed(0),
            checkpoint_path=ckpt,
            checkpoint_every=1,
            on_epoch=crash_after_3,
        )
    except Crash:
        pass
    torch.manual_seed(12345)  # the restarted process has other RNG state: the checkpoint must restore it
    resumed = fresh()
    report = train(resumed, x, y, cfg, torch.Generator().manual_seed(0), checkpoint_path=ckpt, checkpoint_every=1)
    assert report.resumed_from == 3
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_build_classifier_picks_by_input():
    assert isinstance(build_classifier("auto", (1280,), 10), MLPHead)
    assert isinstance(build_classifier("auto", (1, 8, 8), 10), MLPHead)
    assert not isinstance(build_classifier("auto", (3, 32, 32), 10), MLPHead)


def test_unet_keeps_the_shape_even_for_28px():
    net = UNet(channels=1, width=4)
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 1, 28, 28)
