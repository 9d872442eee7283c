"""What leaves a party: the real reply of the ClientApp's encode handler, inspected."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, MetricRecord

from fedsmix.config import load_settings
from fedsmix.party import load_partition

pytestmark = pytest.mark.usefixtures("task_identity")

AGREED_METRICS = {
    "party",
    "num-examples",
    "tau",
    "alpha",
    "radius",
    "m-f",
    "D",
    "V",
    "c",
    "snr-bound",
    "snr-empirical",
    "encode-seconds",
    "calibration-variance",  # V_eff of the chosen calibration (V for the scalar one)
    "screened-fraction",  # the share of encodings the party's post-processing screen dropped
    "validation-counts",  # the class counts of its validation split (label-mix; the upload's labels carry them too)
}


def test_upload_holds_only_encoded_inputs_soft_labels_and_agreed_scalars(client_reply):
    settings = load_settings({"preset": "configs/quickstart.yaml"})
    reply = client_reply(settings)
    assert not reply.has_error()
    content = reply.content
    assert set(content.keys()) == {"upload", "metrics"}
    assert isinstance(content["upload"], ArrayRecord) and isinstance(content["metrics"], MetricRecord)
    assert set(content["upload"].keys()) == {"x", "y"}
    assert set(content["metrics"].keys()) == AGREED_METRICS  # no index, permutation or seed
    x = content["upload"]["x"].numpy().reshape(len(content["upload"]["x"].numpy()), -1)
    raw = load_partition(settings, 0, 3).x.reshape(len(x), -1).numpy()
    # no uploaded row equals (or nearly equals) any raw training sample of the party
    distances = np.sqrt(((x[:, None, :] - raw[None, :, :]) ** 2).sum(-1))
    assert distances.min() > 1e-3 * np.linalg.norm(raw, axis=1).mean()
    # labels are mixtures: where the partner's class differs, no class gets more than alpha
    y = content["upload"]["y"].numpy()
    two_classes = (y > 1e-6).sum(axis=1) == 2
    assert two_classes.any() and (y[two_classes].max(axis=1) <= settings.alpha + 1e-6).all()


def test_no_upload_row_is_a_raw_sample_even_without_noise(client_reply):
    settings = load_settings({"preset": "configs/quickstart.yaml", "radius-mode": "fixed", "radius": 1e-9})
    x = client_reply(settings, party=1).content["upload"]["x"].numpy()
    raw = load_partition(settings, 1, 3).x.numpy()
    flat_x, flat_raw = x.reshape(len(x), -1), raw.reshape(len(raw), -1)
    distances = np.sqrt(((flat_x[:, None, :] - flat_raw[None, :, :]) ** 2).sum(-1))
    assert distances.min() > 1e-3  # the derangement never mixes a sample with itself
