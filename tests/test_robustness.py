"""One bad party: dishonest faults, plausibility checks, robust central training, robust aggregation.

The fast tests here work on the real uploads of the quick-start parties (digits), prepared exactly as the
ClientApp does; the simulations through the real ServerApp and ClientApp are in test_robustness_sim.py.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from rich.console import Console

from fedsmix.config import SettingsError, load_settings
from fedsmix.faults import corrupt, derangement, falsify_update, flip_classes
from fedsmix.party import load_partition, prepare_upload, replayed_upload, validation_counts
from fedsmix.seeding import generator
from fedsmix.trainers import Union, clipped
from fedsmix.training import soft_cross_entropy
from server import plausibility
from server.results import render

PARTIES, BAD = 10, 3


@pytest.fixture(scope="module")
def quickstart(one_thread):
    """The quick-start setting's ten honest uploads and the server's evidence of each."""
    settings = load_settings({"preset": "configs/quickstart.yaml"})
    uploads = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
    return settings, uploads, examine_all(settings, uploads)


def examine_all(settings, uploads):
    return [plausibility.examine(p, u.arrays["x"], u.arrays["y"], u.metrics, settings) for p, u in enumerate(uploads)]


def with_bad(quickstart, arrays, metrics):
    settings, _, evidence = quickstart
    faulty = list(evidence)
    faulty[BAD] = plausibility.examine(BAD, arrays["x"], arrays["y"], metrics, settings)
    return plausibility.quarantine(faulty, settings)


# ------------------------------------------------------------------------------------------- faults
def test_fault_kinds_parse_and_unknown_ones_name_the_key():
    settings = load_settings({"fault": "scale:1;garbage:2;label-flip:3;replay:4;sign-flip:5", "fault-scale": 1e4})
    assert settings.fault_scale == 1e4
    with pytest.raises(SettingsError, match="fault.*unknown fault kind 'flip'"):
        load_settings({"fault": "flip:1"})
    with pytest.raises(SettingsError, match="aggregation"):
        load_settings({"aggregation": "median"})
    with pytest.raises(SettingsError, match="fault-strength: 2 is a share of the rows for fault 'label-noise'"):
        load_settings({"fault": "label-noise:1", "fault-strength": 2})
    assert load_settings({"fault": "shift:1", "fault-strength": 2}).fault_strength == 2  # a length, not a share


def test_fault_families_do_what_their_names_say_at_their_strength(quickstart):
    _, uploads, _ = quickstart
    honest = uploads[BAD]
    x, y, n = honest.arrays["x"], honest.arrays["y"], len(honest.arrays["y"])

    def fault(kind, **kw):
        return corrupt(kind, honest.arrays, honest.metrics, generator=generator(0, BAD, "fault"), **kw)

    both, told = fault("scale-report", scale=3.0)
    assert np.allclose(both["x"], 3 * x, rtol=1e-6)
    assert (told["D"], told["V"], told["c"]) == pytest.approx((3 * honest.metrics["D"], 9 * honest.metrics["V"],
                                                               honest.metrics["c"]))
    moved, _ = fault("shift", strength=0.5)
    step = (moved["x"] - x).reshape(n, -1).astype(np.float64)
    flat = x.reshape(n, -1).astype(np.float64)
    assert np.allclose(step, step[0], atol=1e-5)  # one direction for every row...
    assert np.linalg.norm(step[0]) == pytest.approx(0.5 * np.sqrt(((flat - flat.mean(0)) ** 2).sum(1).mean()), 1e-4)
    part, _ = fault("partial-garbage", strength=0.25)
    changed = (part["x"] != x).reshape(n, -1).any(axis=1)
    assert changed.sum() == round(0.25 * n) and np.array_equal(part["y"], y)
    noisy, _ = fault("label-noise", strength=0.25)
    relabelled = (noisy["y"] != y).any(axis=1)
    assert relabelled.sum() == round(0.25 * n) and np.array_equal(noisy["x"], x)
    targeted, _ = fault("label-target", strength=1.0)
    common = int(np.argmax((y > 0).sum(axis=0)))
    assert not (targeted["y"][:, common] > 0).any() and np.allclose(targeted["y"].sum(1), 1)
    assert ((targeted["y"] != y).any(axis=1) == (y[:, common] > 0)).all()  # exactly the rows that held it


def test_dishonest_uploads_are_what_their_names_say(quickstart):
    settings, uploads, _ = quickstart
    honest = uploads[BAD]
    x, y = honest.arrays["x"], honest.arrays["y"]
    scaled, _ = corrupt("scale", honest.arrays, honest.metrics, 100.0)
    assert np.allclose(scaled["x"], 100 * x, rtol=1e-6) and np.array_equal(scaled["y"], y)
    garbage, _ = corrupt("garbage", honest.arrays, honest.metrics, generator=generator(0, BAD, "fault"))
    flat, fake = x.reshape(len(x), -1), garbage["x"].reshape(len(x), -1)
    assert np.abs(fake.mean(0) - flat.mean(0)).max() < 0.5 * flat.std(0).max()  # a plausible scale...
    assert np.allclose(fake.std(0), flat.std(0), rtol=0.3, atol=1e-3)

    def top_share(rows):  # share of the variance in the 5 leading principal directions
        values = np.linalg.eigvalsh(np.cov(rows.T.astype(np.float64)))[::-1]
        return values[:5].sum() / values.sum()

    assert top_share(fake) < 0.8 * top_share(flat)  # ...but none of the pixels' correlations
    flipped, _ = corrupt("label-flip", honest.arrays, honest.metrics, generator=generator(0, BAD, "fault"))
    assert not np.array_equal(flipped["y"].argmax(1), y.argmax(1))
    assert np.array_equal(np.sort(flipped["y"], axis=1), np.sort(y, axis=1))  # the same weights, other classes
    assert np.array_equal(x, honest.arrays["x"])  # the honest upload is untouched


def test_replay_resends_the_previous_partys_upload_byte_for_byte(quickstart):
    settings, uploads, _ = quickstart
    arrays, metrics = replayed_upload(settings, BAD, PARTIES)
    assert np.array_equal(arrays["x"], uploads[BAD - 1].arrays["x"]) and metrics["party"] == BAD
    assert metrics["D"] == uploads[BAD - 1].metrics["D"]
    replaying = prepare_upload(settings.replace(fault=f"replay:{BAD}"), BAD, PARTIES)
    assert np.array_equal(replaying.arrays["y"], uploads[BAD - 1].arrays["y"])


def test_class_derangement_moves_every_class():
    for seed in range(20):
        perm = derangement(10, generator(seed, "test"))
        assert sorted(perm) == list(range(10)) and not (perm == np.arange(10)).any()
    y = torch.eye(4)
    assert torch.equal(flip_classes(y, generator(1, "t")).sum(0), torch.ones(4))


def test_update_faults_scale_or_negate_the_update_only():
    reference = {"w": torch.ones(3), "count": torch.tensor(5)}
    trained = {"w": torch.tensor([2.0, 1.0, 0.0]), "count": torch.tensor(7)}
    scaled = falsify_update("scale", trained, reference, 10.0)
    assert torch.equal(scaled["w"], torch.tensor([11.0, 1.0, -9.0])) and scaled["count"] == 7
    flipped = falsify_update("sign-flip", trained, reference, 10.0)
    assert torch.equal(flipped["w"], torch.tensor([0.0, 1.0, 2.0]))


def test_train_local_sends_the_falsified_update_only_when_listed():
    from fedsmix.models import new_classifier
    from fedsmix.party import load_partition, train_local

    settings = load_settings({"preset": "configs/quickstart.yaml", "local-epochs": 1})
    part = load_partition(settings, 1, 10)
    start = {k: v.clone() for k, v in new_classifier(settings, part.sample_shape, 10).state_dict().items()}
    honest = train_local(settings, part, start).state()
    bad = train_local(settings.replace(fault="sign-flip:1"), part, start).state()
    other = train_local(settings.replace(fault="sign-flip:2"), part, start).state()
    key = "net.1.weight"
    assert torch.equal(other[key], honest[key])
    assert torch.allclose(bad[key] - start[key], -(honest[key] - start[key]), atol=1e-6)


# -------------------------------------------------------------------------------- plausibility checks
def test_no_honest_quick_start_party_is_quarantined(quickstart):
    settings, _, evidence = quickstart
    assert plausibility.quarantine(evidence, settings) == []
    assert all(0.5 < e.energy / e.expected < 2 for e in evidence)  # the report predicts the energy


def test_a_handful_of_honest_rows_is_judged_by_what_a_handful_can_show(one_thread):
    """300 honest digits parties of 3 or 4 rows each (size skew at its extreme): the energy the report predicts for so
    few rows is right on average (the large-sample formula reads 0.71x here and put some below its 1/2 limit), and
    no upload's own checks, nor the cross-party ones, quarantine any of them."""
    settings = load_settings({"preset": "configs/quickstart.yaml", "partitioner": "iid"})
    uploads = [prepare_upload(settings, p, 300) for p in range(300)]
    evidence = examine_all(settings, uploads)
    assert {e.rows for e in evidence} == {3, 4}
    ratios = [e.energy / e.expected for e in evidence]
    large_sample = [e.energy / plausibility.expected_energy(u.metrics, "singularized")
                    for e, u in zip(evidence, uploads)]
    assert 0.9 < np.mean(ratios) < 1.1 and np.mean(large_sample) < 0.8 and min(large_sample) < 0.5
    assert plausibility.quarantine(evidence, settings) == []


@pytest.mark.parametrize(("rows", "rate", "hits"), [(5, 0.82, 0), (54, 0.82, 30), (54, 0.82, 9), (500, 0.3, 120)])
def test_the_label_check_bounds_an_honest_partys_chance_of_so_few_hits(rows, rate, hits):
    """Chernoff's bound is never below the exact binomial tail (an honest party is never called less likely than it
    is); five rows that all miss stay possible at 10,000 parties, a 54-row upload at chance level does not."""
    from scipy.stats import binom

    bound = plausibility.fewer_hits_chance(hits, rows, rate * rows)
    assert bound >= binom.cdf(hits, rows, rate) * (1 - 1e-9)
    assert (bound < plausibility.FALSE_ALARM / 10_000) == (rows == 54 and hits == 9)


@pytest.mark.parametrize(
    ("kind", "scale", "check"),
    [("scale", 100.0, "domain"), ("scale", 1e4, "domain"), ("scale", 2.0, "domain"), ("scale", 0.5, "energy"),
     ("garbage", 0.0, "labels-vs-inputs"), ("label-flip", 0.0, "labels-vs-inputs"),
     ("label-target", 0.0, "label-mix")],  # 19 validation rows suffice: the class it emptied has no sample left
)
def test_one_dishonest_party_is_named(quickstart, kind, scale, check):
    _, uploads, _ = quickstart
    arrays, metrics = corrupt(kind, uploads[BAD].arrays, uploads[BAD].metrics, scale, generator(0, BAD, "fault"))
    verdicts = with_bad(quickstart, arrays, metrics)
    assert [(v["party"], v["check"]) for v in verdicts] == [(BAD, check)], verdicts


def test_a_label_manipulation_nobody_named_costs_at_most_a_point_through_the_real_apps(one_thread, tmp_path):
    """One party of ten permutes the classes of half its rows (`label-noise`, not one of the faults the checks
    were built for) through the real ServerApp and ClientApp: caught or not, the union loses at most one point,
    and every honest party is used."""
    from commands import inprocess

    base = {"preset": "configs/quickstart.yaml", "strategies": "mixup-union", "runs-dir": str(tmp_path)}
    clean = inprocess.run({**base, "run-name": "clean"}, PARTIES)["strategies"]["mixup-union"]
    noisy = inprocess.run({**base, "run-name": "noise", "fault": f"label-noise:{BAD}", "fault-strength": 0.5},
                          PARTIES)["strategies"]["mixup-union"]
    assert {q["party"] for q in noisy["quarantined"]} <= {BAD}
    assert noisy["parties-used"] >= PARTIES - 1 and noisy["accuracy"] >= clean["accuracy"] - 0.01


@pytest.mark.parametrize("kind", ["relabel-target", "relabel-flip"])
def test_a_consistent_liar_tells_one_lie_everywhere_and_its_own_word_cannot_contradict_it(quickstart, kind):
    """A consistent liar relabels its data before anything else: its training rows, its validation split, the counts
    it reports and its upload's label mix all carry the same relabelling, so `label-mix` (the party against its own
    word) has nothing to hold it to; the honest parties' data are untouched."""
    settings, uploads, evidence = quickstart
    lying = settings.replace(fault=f"{kind}:{BAD}")
    honest_train, honest_val = load_partition(settings, BAD, PARTIES), load_partition(settings, BAD, PARTIES,
                                                                                      "validation")
    train, val = load_partition(lying, BAD, PARTIES), load_partition(lying, BAD, PARTIES, "validation")
    classes = honest_train.num_classes
    mapping = {}  # honest label -> told label, over both splits: one function of the label
    for told, true in ((train.labels, honest_train.labels), (val.labels, honest_val.labels)):
        assert torch.equal(train.x, honest_train.x) if told is train.labels else torch.equal(val.x, honest_val.x)
        for t, h in zip(told.tolist(), true.tolist()):
            assert mapping.setdefault(h, t) == t, "one honest class told as two"
    assert any(h != t for h, t in mapping.items())
    if kind == "relabel-flip":
        assert all(h != t for h, t in mapping.items()) and len(set(mapping.values())) == len(mapping)
    else:
        common = int(np.argmax(np.bincount(torch.cat([honest_train.labels, honest_val.labels]).numpy(),
                                           minlength=classes)))
        assert {h: t for h, t in mapping.items() if h != t} == {common: (common + 1) % classes}
    assert validation_counts(lying, BAD, PARTIES) == np.bincount(val.labels.numpy(), minlength=classes).tolist()
    liar = prepare_upload(lying, BAD, PARTIES)
    held = np.bincount(train.labels.numpy(), minlength=classes) > 0  # its upload's label mass: the told classes
    assert np.array_equal(liar.arrays["y"].sum(0) > 1e-6, held)
    faulty = list(evidence)
    faulty[BAD] = plausibility.examine(BAD, liar.arrays["x"], liar.arrays["y"], liar.metrics, lying)
    assert plausibility.label_mix(faulty[BAD], 1e-3 / PARTIES).chance > 1e-2  # its word agrees with its upload
    other = load_partition(lying, BAD + 1, PARTIES)
    assert torch.equal(other.labels, load_partition(settings, BAD + 1, PARTIES).labels)


@pytest.mark.parametrize("kind", ["relabel-target", "relabel-flip"])
def test_the_server_sees_a_consistent_liar_as_an_honest_party_whose_images_bear_those_labels(quickstart, kind,
                                                                                            monkeypatch):
    """The limit every server-side rule faces: what a consistent liar sends (its upload's bytes, its report, the
    counts of its validation split it votes with) is, byte for byte, what an honest party sends whose data set labels
    the same images so. No check or rule of the server can tell the two apart; what one can bound is the cost of the
    told labels to the union model (`class-prior uniform`, docs/robustness.md "A consistent liar and the class
    prior")."""
    from fedsmix import data as datalib
    from fedsmix import party as party_module

    settings, uploads, _ = quickstart
    assert not settings.train_subset  # the deal below is over the whole training split
    lying = settings.replace(fault=f"{kind}:{BAD}")
    liar = prepare_upload(lying, BAD, PARTIES)
    assert liar.arrays["y"].tobytes() != uploads[BAD].arrays["y"].tobytes()  # the lie is in what it sends
    train, val = load_partition(lying, BAD, PARTIES), load_partition(lying, BAD, PARTIES, "validation")
    original = datalib.load_dataset(settings, "train")
    told = original.labels.copy()
    told[train.rows], told[val.rows] = train.labels.numpy(), val.labels.numpy()
    assert (told != original.labels).any()
    load, deal = datalib.load_dataset, party_module.partition_indices

    def labelled_so(run_settings, split):  # the honest party's data set: the same images, the told labels
        raw = load(run_settings, split)
        return datalib.RawSplit(raw.images, told, raw.spec) if split == "train" else raw

    monkeypatch.setattr(datalib, "load_dataset", labelled_so)
    # the simulator deals the same rows to the party as before (a real party's data is simply what it holds)
    monkeypatch.setattr(party_module, "partition_indices", lambda _labels, *rest: deal(original.labels, *rest))
    honest = prepare_upload(settings, BAD, PARTIES)
    assert sorted(honest.arrays) == sorted(liar.arrays)
    for name in liar.arrays:
        assert honest.arrays[name].dtype == liar.arrays[name].dtype
        assert honest.arrays[name].tobytes() == liar.arrays[name].tobytes(), name
    report = {k: v for k, v in liar.metrics.items() if k != "encode-seconds"}
    assert {k: v for k, v in honest.metrics.items() if k != "encode-seconds"} == report
    assert report["validation-counts"] == np.bincount(val.labels.numpy(), minlength=train.num_classes).tolist()
    assert torch.equal(load_partition(settings, BAD, PARTIES, "validation").labels, val.labels)  # what it votes on


def test_a_uniform_class_prior_moves_the_prior_term_and_nothing_else(quickstart):
    """class-prior uniform: every class's label mass rescaled alike, so a Gaussian discriminant's logits move by
    exactly log(1/C) - log(pi_c) (its class means, covariance and noise debiasing unchanged), and the setting
    reaches the trainers through `fit`."""
    from fedsmix import trainers

    settings, uploads, _ = quickstart
    uploads = uploads[:4]  # four Dirichlet(0.5) parties: a skewed union (the ten together are nearly balanced)
    union = Union(np.concatenate([u.arrays["x"] for u in uploads]), np.concatenate([u.arrays["y"] for u in uploads]),
                  np.concatenate([np.full(len(u.arrays["y"]), p) for p, u in enumerate(uploads)]))
    even = trainers.balanced(union)
    assert even.y is union.y and even.x is union.x  # the rows and their labels are the union's
    mass = even.training_labels().astype(np.float64).sum(0)
    assert np.allclose(mass, mass.mean(), rtol=1e-5) and math.isclose(mass.sum(), len(union), rel_tol=1e-5)
    prior = union.y.astype(np.float64).sum(0) / len(union)
    assert prior.max() / prior.min() > 1.2  # a union whose prior is not already uniform
    base = settings.replace(trainer="lda", head_penalties=(1.0,), robust_training="off")
    shape, classes = tuple(union.x.shape[1:]), union.y.shape[1]
    plain = trainers.fit(base, union, shape, classes, "cpu", ["lda@1"]).models["lda@1"]
    uniform = trainers.fit(base.replace(class_prior="uniform"), union, shape, classes, "cpu", ["lda@1"]).models["lda@1"]
    x = torch.from_numpy(union.x[:50])
    with torch.no_grad():
        moved = (uniform(x) - plain(x)).double()
    expected = torch.from_numpy(np.log(1.0 / classes) - np.log(prior))
    assert torch.allclose(moved, expected.expand_as(moved), atol=1e-3)
    ridge = trainers.fit(base.replace(trainer="ridge"), union, shape, classes, "cpu", ["ridge@1"]).models["ridge@1"]
    by_labels = trainers.fit(base.replace(trainer="ridge"), Union(union.x, even.training_labels(), union.parties),
                             shape, classes, "cpu", ["ridge@1"]).models["ridge@1"]  # ridge on the reweighted labels
    scaled = trainers.fit(base.replace(trainer="ridge", class_prior="uniform"), union, shape, classes, "cpu",
                          ["ridge@1"]).models["ridge@1"]
    with torch.no_grad():
        assert torch.allclose(scaled(x), by_labels(x), atol=1e-4) and not torch.allclose(scaled(x), ridge(x), atol=1e-2)


def test_a_replayed_upload_is_caught_and_the_first_arrival_kept(quickstart):
    settings, uploads, _ = quickstart
    arrays, metrics = replayed_upload(settings, BAD, PARTIES)
    verdicts = with_bad(quickstart, arrays, metrics)
    assert [(v["party"], v["check"]) for v in verdicts] == [(BAD, "replay")]
    assert f"party {BAD - 1}'s upload" in verdicts[0]["reason"]
    nudged = {"x": arrays["x"] * np.float32(1 + 1e-4), "y": arrays["y"]}  # a near copy, not a byte copy
    assert [v["check"] for v in with_bad(quickstart, nudged, metrics)] == ["replay"]


def test_a_party_that_scales_its_report_too_leaves_the_data_domain(quickstart):
    """x100 in the inputs and in every reported norm: consistent with itself, not with what digits can be."""
    _, uploads, _ = quickstart
    honest = uploads[BAD]
    arrays, _ = corrupt("scale", honest.arrays, honest.metrics, 100.0)
    metrics = {**honest.metrics, "V": honest.metrics["V"] * 1e4, "D": honest.metrics["D"] * 100,
               "radius": honest.metrics["radius"] * 100}
    verdicts = with_bad(quickstart, arrays, metrics)
    assert [(v["party"], v["check"]) for v in verdicts] == [(BAD, "domain")], verdicts
    assert "no two samples of digits (pixels) are farther apart" in verdicts[0]["reason"]


def test_honest_parties_that_differ_in_acquisition_are_not_quarantined(one_thread):
    """Feature skew at full strength: one party's images far darker and flatter than the others' (its spread a fifth
    of the parties' median, where a rule against the other parties' scale quarantined it), all honest."""
    settings = load_settings({"preset": "configs/quickstart.yaml", "feature-skew": 1.0})
    uploads = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
    evidence = examine_all(settings, uploads)
    spread = [math.sqrt(e.energy) for e in evidence]
    assert min(spread) < np.median(spread) / 4
    assert plausibility.quarantine(evidence, settings) == []
    assert all(0 <= e.outside <= plausibility.domain_allowance(u.metrics, settings) for e, u in zip(evidence, uploads))


def test_a_party_whose_labels_name_other_classes_is_named_by_its_peers(one_thread):
    """A party that permutes its classes (label-flip), on the MNIST slice at tau 1: a ridge head on mixed rows does
    not contradict it here, the other parties' class means do; an honest party of the same classes is never named
    with it (the permuted party pulls their means), nor a party under its own acquisition. (The CIFAR-10 slice's
    parties hold too few rows of any class for the check to judge five of them: it abstains there.)"""
    dataset = "mnist"
    settings = load_settings({"preset": "configs/quickstart.yaml", "dataset": dataset})
    uploads = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
    evidence = examine_all(settings, uploads)
    assert plausibility.quarantine(evidence, settings) == []
    arrays, metrics = corrupt("label-flip", uploads[BAD].arrays, uploads[BAD].metrics, 0.0,
                              generator(0, BAD, "fault"))
    evidence[BAD] = plausibility.examine(BAD, arrays["x"], arrays["y"], metrics, settings)
    assert plausibility.disagreements(evidence) == []  # the ridge head of labels-vs-inputs sees nothing wrong
    assert plausibility.mixed_labels(evidence) == []  # its validation split (a few dozen rows) cannot contradict it
    verdicts = plausibility.quarantine(evidence, settings)
    assert [(v["party"], v["check"]) for v in verdicts] == [(BAD, "labels-vs-peers")], verdicts
    evidence[BAD].validation_counts = None  # a party that hides its split's counts is named for that first
    assert [v["check"] for v in plausibility.quarantine(evidence, settings)] == ["label-mix"]
    scores = {p: a.score for p, a in plausibility.alignment(evidence).items()}
    assert scores[BAD] < 0.2 < plausibility.PEER_SIGNAL < np.median(list(scores.values()))
    shifted = load_settings({"preset": "configs/quickstart.yaml", "dataset": dataset, "feature-skew": 1.0})
    honest = examine_all(shifted, [prepare_upload(shifted, p, PARTIES) for p in range(PARTIES)])
    assert plausibility.misaligned(honest) == []


@pytest.mark.parametrize("tau", [1.0, 1e-3, 1e-6])
def test_an_uploads_label_mix_is_held_against_its_own_validation_split(one_thread, tau):
    """label-mix, on the MNIST slice (4 Dirichlet parties keeping a quarter of their rows for validation): no honest
    party is named at any tau (the noise does not touch the label mass); a party that relabels its commonest class
    is named at every tau, and so is one that reports a split of the wrong size (an empty split would silence the
    check). Half a class relabelled is not named here: 281 validation rows cannot tell it from chance."""
    parties, bad = 4, 0
    settings = load_settings({"preset": "configs/quickstart.yaml", "dataset": "mnist", "tau": tau,
                              "validation-fraction": 0.25})
    uploads = [prepare_upload(settings, p, parties) for p in range(parties)]
    evidence = examine_all(settings, uploads)
    assert plausibility.mixed_labels(evidence) == []
    assert min(plausibility.label_mix(e, plausibility.FALSE_ALARM).chance for e in evidence) > 1e-2

    def named(metrics, arrays=uploads[bad].arrays):
        faulty = list(evidence)
        faulty[bad] = plausibility.examine(bad, arrays["x"], arrays["y"], metrics, settings)
        return plausibility.mixed_labels(faulty)

    for strength, caught in ((0.5, False), (1.0, True)):
        arrays, metrics = corrupt("label-target", uploads[bad].arrays, uploads[bad].metrics, 0.0,
                                  generator(0, bad, "fault"), strength)
        verdicts = named(metrics, arrays)
        assert [(v["party"], v["check"]) for v in verdicts] == ([(bad, "label-mix")] if caught else []), verdicts
    assert "of its own validation split" in verdicts[0]["reason"]
    counts = list(uploads[bad].metrics["validation-counts"])
    [verdict] = named({**uploads[bad].metrics, "validation-counts": [0] * len(counts)})
    assert verdict["party"] == bad and "split of 0 rows" in verdict["reason"] and str(sum(counts)) in verdict["reason"]


def test_under_a_screen_the_validation_split_must_still_be_the_size_its_rows_give(one_thread):
    """A screen drops encodings by their content, and each party reports the share it dropped: the rows it encoded
    follow from the upload and that share, so its validation split's size is still fixed. Honest screened parties
    pass `label-mix`; one that reports an empty split (which would silence the check) is named."""
    parties, bad = 4, 1
    settings = load_settings({"preset": "configs/quickstart.yaml", "dataset": "mnist", "tau": 1.0,
                              "validation-fraction": 0.25, "screen": "snr", "screen-threshold": 3.0})
    uploads = [prepare_upload(settings, p, parties) for p in range(parties)]
    assert all(u.metrics["screened-fraction"] > 0.01 for u in uploads)  # the screen dropped rows of every party
    evidence = examine_all(settings, uploads)
    assert plausibility.mixed_labels(evidence) == []
    empty = {**uploads[bad].metrics, "validation-counts": [0] * len(uploads[bad].metrics["validation-counts"])}
    evidence[bad] = plausibility.examine(bad, uploads[bad].arrays["x"], uploads[bad].arrays["y"], empty, settings)
    [verdict] = plausibility.mixed_labels(evidence)
    assert verdict["party"] == bad and "split of 0 rows" in verdict["reason"]


@pytest.mark.parametrize("tau", [1.0, 1e-3])
def test_random_rows_vary_less_in_norm_than_the_mixing_weights_make_honest_ones(one_thread, tau):
    """norm-spread, on the MNIST slice: every honest upload's rows vary in squared norm about as much as the mixing
    weights make them (at least a third of the floor its report gives); garbage (random rows of the upload's own
    mean and spread) varies far less and is named, also at tau 1e-3 where the label checks abstain; with fixed
    weights the check has no floor and abstains."""
    settings = load_settings({"preset": "configs/quickstart.yaml", "dataset": "mnist", "tau": tau})
    uploads = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
    evidence = examine_all(settings, uploads)
    ratios = [e.energy_var / e.spread_floor for e in evidence]
    assert all(e.problem is None for e in evidence) and min(ratios) > 0.6, ratios
    arrays, metrics = corrupt("garbage", uploads[BAD].arrays, uploads[BAD].metrics, 0.0, generator(0, BAD, "fault"))
    garbage = plausibility.examine(BAD, arrays["x"], arrays["y"], metrics, settings)
    assert garbage.problem is not None and garbage.problem.check == "norm-spread", garbage.problem
    assert garbage.energy_var < garbage.spread_floor / 10
    fixed = settings.replace(mixing_weights="fixed")
    assert plausibility.spread_floor(metrics, fixed) is None


@pytest.mark.parametrize(("population", "drawn", "holders", "seen"),
                         [(1000, 100, 300, 10), (1000, 100, 300, 55), (200, 20, 10, 6), (5000, 500, 2500, 200)])
def test_the_label_mix_bound_is_never_below_the_exact_chance(population, drawn, holders, seen):
    """Chernoff's bound that label-mix applies to a validation split (draws without replacement) is never below the
    exact hypergeometric tail: an honest party is never called less likely than it is."""
    from scipy.stats import hypergeom

    expected = holders / population
    tail = hypergeom.cdf(seen, population, holders, drawn) if seen / drawn < expected else \
        hypergeom.sf(seen - 1, population, holders, drawn)
    assert plausibility.tail_chance(seen / drawn, drawn, expected) >= tail * (1 - 1e-9)


def test_an_upload_that_breaks_the_encoder_or_its_report_is_named(quickstart):
    settings, uploads, _ = quickstart
    honest = uploads[BAD]
    y = honest.arrays["y"].copy()
    y[0] = 0.0
    y[0, :4] = 0.25  # four classes: singularized mixup mixes two
    bad = plausibility.examine(BAD, honest.arrays["x"], y, honest.metrics, settings)
    assert (bad.problem.check, "1 of") == ("labels", bad.problem.reason[:4])
    for key, value, words in (("alpha", 0.6, "alpha"), ("radius", 1.0, "Theorem 4.2"), ("c", 0.1, "D^2/(2V)")):
        lying = {**honest.metrics, key: value}
        lie = plausibility.examine(BAD, honest.arrays["x"], honest.arrays["y"], lying, settings)
        assert lie.problem.check == "report" and words in lie.problem.reason, (key, lie.problem)


def test_tiny_tau_hides_the_labels_and_the_label_checks_abstain(monkeypatch):
    """At tau = 1e-6 the sphere noise dominates every row: no linear head sees the labels, so neither label
    check can tell garbage from an honest upload, and neither may guess; garbage's rows of nearly equal norm give it
    away to norm-spread instead, which reads no labels."""
    settings = load_settings({"preset": "configs/quickstart.yaml", "tau": 1e-6, "partitioner": "iid"})
    uploads = [prepare_upload(settings, p, 5) for p in range(5)]
    evidence = examine_all(settings, uploads)
    scores = plausibility.agreement(evidence)
    assert np.median([(a.expected - a.chance) / a.rows for a in scores.values()]) < plausibility.SIGNAL
    assert np.median([a.score for a in plausibility.alignment(evidence).values()]) < plausibility.PEER_SIGNAL
    garbage, _ = corrupt("garbage", uploads[1].arrays, uploads[1].metrics, generator=generator(0, 1, "fault"))
    evidence[1] = plausibility.examine(1, garbage["x"], garbage["y"], uploads[1].metrics, settings)
    assert [(v["party"], v["check"]) for v in plausibility.quarantine(evidence, settings)] == [(1, "norm-spread")]
    monkeypatch.delitem(plausibility.UPLOAD_CHECKS, "norm-spread")  # without it the label checks would not name it
    evidence[1] = plausibility.examine(1, garbage["x"], garbage["y"], uploads[1].metrics, settings)
    assert plausibility.quarantine(evidence, settings) == []


def test_a_quarantined_party_is_printed_with_its_check():
    results = {"settings": {"dataset": "digits"}, "num-parties": 3, "strategies": {"mixup-union": {
        "accuracy": 0.9, "parties-used": 2, "dropped": [], "rejected": [],
        "quarantined": [{"party": 2, "node": 17, "check": "energy", "reason": "9.9e+03x what its report predicts"}],
    }}}
    printed = io.StringIO()
    render(results, Console(file=printed, width=250))
    row = [line for line in printed.getvalue().splitlines() if "quarantined" in line and "energy" in line]
    assert row and "9.9e+03x" in row[0] and " 2 " in row[0] and "17" in row[0], printed.getvalue()


# ------------------------------------------------------------------------------- robust training
def test_trimmed_loss_drops_the_largest_losses():
    logits = torch.tensor([[5.0, 0.0], [5.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
    targets = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])  # the last row is badly fit
    full, trimmed = soft_cross_entropy(logits, targets), soft_cross_entropy(logits, targets, trim=0.25)
    assert trimmed < 0.01 < full
    assert torch.isclose(trimmed, soft_cross_entropy(logits[:3], targets[:3]))


def test_clipping_pulls_only_the_far_rows_in():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 1, 4, 4)).astype(np.float32)
    x[:10] *= 100  # one party's inflated rows
    union = Union(x, np.eye(2, dtype=np.float32)[np.arange(200) % 2], np.repeat(np.arange(2), 100))
    view = clipped(union)
    rows = view.x[np.arange(200)]
    center = view.x.center.reshape(-1).astype(np.float64)
    assert np.abs(center).max() < 1  # the coordinate-wise median: not dragged off by the inflated rows
    distances = np.linalg.norm(rows.reshape(200, -1) - center, axis=1)
    bound = view.x.bound
    assert distances.max() <= bound * (1 + 1e-5) and bound < 15
    far = np.linalg.norm(x.reshape(200, -1) - center, axis=1) > bound
    assert far[:10].all() and far[10:].sum() < 5
    assert np.allclose(rows[~far], x[~far], atol=1e-5)  # ordinary rows are untouched


# ----------------------------------------------------------------------------- robust aggregation
def test_the_strategy_keeps_fedprox_on_the_client_and_flowers_aggregator_on_the_server():
    from flwr.serverapp.strategy import FedMedian, FedProx

    from strategies.fedprox import ReportingFedProx, aggregator_options, strategy_class

    cls = strategy_class("fedmedian")
    assert cls.__mro__[1:4] == (ReportingFedProx, FedProx, FedMedian)
    assert cls.aggregate_train is not FedProx.aggregate_train
    assert cls.configure_train is ReportingFedProx.configure_train
    settings = load_settings({"aggregation": "multikrum", "malicious-parties": 2})
    assert aggregator_options(settings, 10) == {"num_malicious_nodes": 2, "num_nodes_to_select": 8}
    assert strategy_class("fedavg") is ReportingFedProx


@pytest.mark.parametrize("aggregation", ["fedmedian", "fedtrimmedavg", "krum", "multikrum", "bulyan"])
def test_robust_aggregators_ignore_one_scaled_update(aggregation):
    from strategies.fedprox import aggregate_states

    settings = load_settings({"aggregation": aggregation})
    rng = np.random.default_rng(0)
    previous = {"w": torch.zeros(5, 3), "count": torch.tensor(3)}
    honest = [{"w": torch.from_numpy(rng.normal(1.0, 0.1, (5, 3)).astype(np.float32)), "count": torch.tensor(4)}
              for _ in range(9)]
    bad = {"w": 100 * honest[0]["w"], "count": torch.tensor(4)}
    replies = [(state, 50) for state in honest[:3] + [bad] + honest[3:]]
    robust = aggregate_states(settings, replies, previous)
    plain = aggregate_states(settings.replace(aggregation="fedavg"), replies, previous)  # the example-weighted mean
    assert float(plain["w"].mean()) > 10
    assert math.isclose(float(robust["w"].mean()), 1.0, abs_tol=0.15), aggregation
    assert robust["w"].dtype == torch.float32 and robust["count"].dtype == previous["count"].dtype


def test_robust_training_reaches_every_candidate_of_the_central_trainer(monkeypatch):
    """clip: the linear heads are fitted on the clipped rows; trim: the MLP's loop gets the trim fraction."""
    from fedsmix import trainers

    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 1, 4, 4)).astype(np.float32)
    x[:30] *= 1000
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 300)]
    union = Union(x, y, np.repeat(np.arange(3), 100))
    settings = load_settings({"trainer": "ridge", "head-penalties": "0.1", "validation-fraction": 0,
                              "tuning-budget": 1, "robust-training": "off"})
    plain = trainers.fit(settings, union, (1, 4, 4), 3, "cpu", ["ridge@0.1"]).models["ridge@0.1"]
    robust = trainers.fit(settings.replace(robust_training="clip"), union, (1, 4, 4), 3, "cpu", ["ridge@0.1"])
    by_hand = trainers.fit(settings, trainers.clipped(union), (1, 4, 4), 3, "cpu", ["ridge@0.1"]).models["ridge@0.1"]
    weight = robust.models["ridge@0.1"].linear.weight
    assert torch.allclose(weight, by_hand.linear.weight) and not torch.allclose(weight, plain.linear.weight)
    seen = {}

    def fake_train(model, x, y, cfg, generator, **kwargs):
        seen["trim"] = cfg.trim
        return trainers.TrainReport()

    monkeypatch.setattr(trainers.mlp, "train", fake_train)
    trainers.fit(settings.replace(trainer="mlp", robust_training="trim", robust_trim=0.2), union, (1, 4, 4), 3,
                "cpu", ["mlp"])
    assert seen["trim"] == 0.2
    trainers.fit(load_settings({"trainer": "mlp"}), union, (1, 4, 4), 3, "cpu", ["mlp"])
    assert seen["trim"] == 0.0  # trim is off by default (clip is on)
