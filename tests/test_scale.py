"""Scale (fast, CPU): resources reach Flower's federation config, the device falls back to CPU,
float16 uploads round-trip within half an ulp, and the server holds one upload at a time."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.config import parse_config_args
from flwr.simulation.app import _run_simulation_settings
from flwr.supercore.utils import simulation_config_from_json

from commands import cli, launch
from commands.federation import FLOWER_KEYS, backend_config, federation_config, flower_part
from fedsmix import device
from fedsmix.config import SettingsError, load_settings
from server.context import RunContext
from server.store import UploadStore
from server.validation import validate_upload
from strategies.mixup_union import collect_uploads, expectation

pytestmark = pytest.mark.usefixtures("task_identity")



@pytest.fixture
def gpu_preset(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text(
        "dataset: digits\n"
        "federation:\n"
        "  num-supernodes: 30\n"
        "  client-resources-num-cpus: 2\n"
        "  client-resources-num-gpus: 0.25\n"
        "  init-args-num-gpus: 1\n"
    )
    return str(path)


def flower_backend(federation_arg: str) -> dict:
    """What Flower 1.42 makes of a `--federation-config` string: its own parser, then its own mapping."""
    parsed = {k.replace("-", "_"): v for k, v in parse_config_args([federation_arg]).items()}
    _, backend, config, _, _ = _run_simulation_settings(simulation_config_from_json(parsed))
    assert backend == "ray"
    return config


def test_preset_and_flags_reach_flowers_backend_config(gpu_preset, monkeypatch):
    captured = {}

    def fake_flwr_run(run_config, num_supernodes, federation_config=None, environment=None, **kwargs):
        captured.update(parties=num_supernodes, federation=federation_config, environment=environment)
        return launch.FlowerRun(1, "finished:completed", 0, "")

    monkeypatch.setattr(launch, "flwr_run", fake_flwr_run)
    code = cli.main(
        [
            "run",
            "--preset",
            gpu_preset,
            "--federation",
            "client-resources-num-gpus=0.5",
            "--federation",
            "ray-address=10.0.0.1:6379",
        ]
    )
    assert code == 0
    assert captured["parties"] == 30  # from the preset's block: no --parties given
    assert captured["environment"] == {"RAY_ADDRESS": "10.0.0.1:6379"}  # ours, not Flower's key
    argument = launch.config_arg({**captured["federation"], "num-supernodes": captured["parties"]})
    config = flower_backend(argument)
    assert config["client_resources"] == {"num_cpus": 2, "num_gpus": 0.5}  # the flag beat the preset's 0.25
    assert config["init_args"] == {"num_gpus": 1}


def test_in_process_simulation_maps_resources_as_flower_does(gpu_preset):
    federation = federation_config(gpu_preset)
    ours = backend_config(federation)
    theirs = flower_backend(launch.config_arg(flower_part(federation)))
    assert ours == theirs
    assert backend_config({"ray-address": "auto"})["init_args"] == {"address": "auto"}


def test_federation_keys_are_flowers(gpu_preset):
    from flwr.proto.federation_config_pb2 import SimulationConfig

    assert {k.replace("-", "_") for k in FLOWER_KEYS} == {f.name for f in SimulationConfig.DESCRIPTOR.fields}
    with pytest.raises(SettingsError, match="unknown key.*client-resources-num-gpu.*allowed"):
        federation_config(gpu_preset, {"client-resources-num-gpu": 1})
    with pytest.raises(SettingsError, match="client-resources-num-cpus = 0.5: expected a non-negative int"):
        federation_config("", {"client-resources-num-cpus": 0.5})
    # the preset's federation block is not a run setting
    assert load_settings(preset=gpu_preset).dataset == "digits"


def test_device_falls_back_to_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.select_device("auto") == "cpu"
    assert device.select_device("cpu") == "cpu"
    with pytest.raises(RuntimeError, match="device: 'cuda' was requested"):
        device.select_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.select_device("auto") == "cuda"
    assert device.select_device("cpu") == "cpu"


def test_float16_uploads_round_trip_within_half_an_ulp(tmp_path, client_reply):
    """The real encode reply, validated and stored by the server, read back through the union."""
    unions = {}
    for dtype in ("float32", "float16"):
        settings = load_settings({"preset": "configs/quickstart.yaml", "upload-dtype": dtype})
        reply = client_reply(settings)
        assert reply.content["upload"]["x"].dtype == dtype
        upload = validate_upload(reply.content, "node 7", expectation_for(settings), set())
        store = UploadStore(tmp_path / dtype)
        store.save(upload.party, upload.x, upload.y, upload.metrics)
        unions[dtype] = (store.union()[0][np.arange(upload.x.shape[0])], upload.nbytes)
    exact, full_bytes = unions["float32"]
    half, half_bytes = unions["float16"]
    assert half.dtype == np.float32 and half.shape == exact.shape
    # round to nearest with a 10-bit mantissa: |error| <= 2^-11 |x| (plus half the subnormal step)
    assert (np.abs(half - exact) <= 2.0**-11 * np.abs(exact) + 2.0**-25).all()
    assert np.abs(half - exact).max() > 0  # it did round
    assert half_bytes < 0.6 * full_bytes  # x halves; the soft labels stay float32


def test_float16_refuses_values_it_cannot_hold(client_reply):
    settings = load_settings(
        {"preset": "configs/quickstart.yaml", "upload-dtype": "float16", "radius-mode": "fixed", "radius": 1e7}
    )
    with pytest.raises(ValueError, match="upload-dtype float16: encoded values reach .* beyond float16's 65504"):
        client_reply(settings)  # inside Flower, the party's error reply: it is dropped, not uploading Inf


def expectation_for(settings):
    return expectation(RunContext(settings=settings, grid=None, run_dir=None, device="cpu"))


def upload_reply(party: int, rows: int) -> Message:
    """A plausible upload of encoder `none`: random digits-sized images inside the data's valid range, one-hot
    labels, and the V, D and c of those rows."""
    from fedsmix import data as datalib
    from server.plausibility import validation_rows

    ins = Message(RecordDict({}), dst_node_id=100 + party, message_type="query.encode")
    lo, hi = (float(b) for b in datalib.valid_range(datalib.spec("digits")))
    x = (lo + (hi - lo) * np.random.default_rng(party).random((rows, 1, 8, 8))).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[np.arange(rows) % 10]
    upload = ArrayRecord({"x": Array(x), "y": Array(y)})
    V = float(((x.reshape(rows, -1) - x.reshape(rows, -1).mean(0)) ** 2).sum(1).mean())
    kept = min(validation_rows(rows, load_settings({}).validation_fraction))  # its split, classes as cyclic
    report = {"party": party, "num-examples": rows, "alpha": 0.7, "tau": 1.0, "radius": 0.0, "V": V,
              "D": (2 * V) ** 0.5, "c": 1.0, "validation-counts": [kept // 10 + (c < kept % 10) for c in range(10)]}
    return Message(RecordDict({"upload": upload, "metrics": MetricRecord(report)}), reply_to=ins)


def peak_while_collecting(tmp_path, parties: int, rows: int, checks: bool) -> float:
    settings = load_settings({"preset": "configs/quickstart.yaml", "encoder": "none", "plausibility": checks})
    ctx = RunContext(settings=settings, grid=None, run_dir=tmp_path, device="cpu")
    store = UploadStore(tmp_path / f"uploads-{parties}-{checks}")
    replies = (upload_reply(party, rows) for party in range(parties))  # on demand, as Flower's pull hands them over
    tracemalloc.start()
    try:
        used, rejected, dropped, quarantined = collect_uploads(ctx, replies, store, [100 + p for p in range(parties)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(used) == list(range(parties)) and not rejected and not dropped and not quarantined
    x, _ = store.union()
    assert isinstance(x.parts[0], np.memmap) and len(x) == parties * rows  # training reads from disk
    return peak


def test_the_server_holds_one_upload_at_a_time(tmp_path):
    """Replies are validated, stored and dropped as they arrive: peak memory does not grow with their number.
    The plausibility checks keep a small summary of each (32 bytes a row and a 500-row sample)."""
    from server.plausibility import FIT_ROWS, SKETCH_DIM

    rows = 16_384
    one_upload = rows * (64 + 10) * 4  # about 4.6 MiB
    two, eight = (peak_while_collecting(tmp_path, n, rows, checks=False) for n in (2, 8))
    assert eight < two + one_upload, f"2 uploads: peak {two / 2**20:.1f} MiB; 8 uploads: {eight / 2**20:.1f} MiB"
    summary = rows * SKETCH_DIM * 2 + FIT_ROWS * (64 + 10) * 4  # float16 sketch, float32 sample
    two, eight = (peak_while_collecting(tmp_path, n, rows, checks=True) for n in (2, 8))
    assert eight < two + one_upload + 6 * 1.2 * summary, f"with checks: {two / 2**20:.1f} vs {eight / 2**20:.1f} MiB"
    assert 6 * summary < 0.25 * 6 * one_upload  # the summaries are a fraction of the uploads they stand for


def test_encoding_does_not_depend_on_the_thread_count():
    """The encoder fills cache-sized blocks on a thread pool; each block has its own seeded stream."""
    from fedsmix.encoders.singularized import BLOCK_VALUES, singularized_mixup
    from fedsmix.seeding import generator

    x = torch.randn(3000, 3, 8, 8)
    y = torch.nn.functional.one_hot(torch.arange(3000) % 10, 10).float()
    assert len(x) > 2 * BLOCK_VALUES // x[0].numel()  # several blocks
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = singularized_mixup(x, y, 0.7, 5.0, generator(0, "threads"), keep_noise=True)
        torch.set_num_threads(4)
        pooled = singularized_mixup(x, y, 0.7, 5.0, generator(0, "threads"), keep_noise=True)
        lean = singularized_mixup(x, y, 0.7, 5.0, generator(0, "threads"))  # per-thread scratch noise
        assert torch.get_num_threads() == 4  # restored after the pool
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(serial.x, pooled.x) and torch.equal(serial.noise, pooled.noise) and torch.equal(lean.x, pooled.x)
    assert torch.allclose(pooled.noise.flatten(1).norm(dim=1), torch.full((3000,), 5.0), rtol=1e-4)


def test_the_upload_store_appends_one_journal_line_per_upload_and_loses_none(tmp_path):
    """Saving does not rewrite the manifest (work per upload independent of the parties before it); a store
    reopened before `flush` (an interrupted run) has every upload, a line cut short by a crash is ignored."""
    import json

    from server.store import UploadStore

    store = UploadStore(tmp_path)
    x, y = np.zeros((4, 3), np.float32), np.full((4, 2), 0.5, np.float32)
    for party in range(5):
        store.save(party, x + party, y, {"party": party})
    assert not (tmp_path / "manifest.json").exists()
    assert len((tmp_path / "manifest.jsonl").read_text().splitlines()) == 5
    store.discard(3)
    with open(tmp_path / "manifest.jsonl", "a") as journal:
        journal.write('["9", {"x": ')  # a crash in the middle of a line
    reopened = UploadStore(tmp_path)
    assert reopened.parties() == [0, 1, 2, 4] and reopened.verify() == []
    reopened.flush()
    assert sorted(json.loads((tmp_path / "manifest.json").read_text())) == ["0", "1", "2", "4"]
    assert not (tmp_path / "manifest.jsonl").exists() and UploadStore(tmp_path).parties() == [0, 1, 2, 4]


def test_the_console_hides_flowers_and_rays_lines_that_do_not_concern_the_run():
    """The lines `flwr run --stream` printed in a quick-start run (Flower 1.42, Ray 2.55): the four that contradict
    fedsmix or ask nothing of its user are hidden; every fedsmix line, and Flower's own status lines, stay."""
    from commands.launch import NOISE

    hidden = [
        "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
        "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:\n",
        "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> "
        "--num-supernodes <N>\n",
        "Successfully installed fedsmix to /work/main/.flwr/apps/fedsmix.fedsmix.0.1.0.5e503470.\n",
        ".venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of "
        "Ray, Ray will no longer override accelerator visible devices env var if num_gpus=0 or num_gpus=None\n",
        "  warnings.warn(\n",
    ]
    kept = [
        "Successfully started run 15975193734998327444\n",
        "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (3 simulated SuperNodes)\n",
        "fedsmix parties connected and loaded: 3 of 3\n",
        "\x1b[36m(ClientAppActor pid=13335)\x1b[0m fedsmix [local-only] party 0 local training epoch 1/30: "
        "loss 1.7302\n",
        "fedsmix run finished after 25s\n",
    ]
    assert all(NOISE.search(line) for line in hidden)
    assert not any(NOISE.search(line) for line in kept)


def test_the_selection_and_the_return_reach_a_seeded_sample_of_the_parties(data_dir, runs_dir, one_thread):
    """6 parties, 2 voters and 3 returns: only the voters' rows are held out and only they score the candidates;
    the model goes back to 3 parties, sampled from the seed (the same sample each time), and results say so."""
    from commands import inprocess
    from fedsmix.trainers import sample_parties

    overrides = {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir,
                 "strategies": "mixup-union", "trainer": "ridge", "head-penalties": "0.1,10", "epochs": 1,
                 "vote-parties": 2, "return-parties": 3, "seed": 3}
    mix = inprocess.run(overrides, 6)["strategies"]["mixup-union"]
    voters = sample_parties(range(6), 2, 3, "vote")
    back = sample_parties(range(6), 3, 3, "return")
    assert len(voters) == 2 and len(back) == 3 and back == sample_parties(range(6), 3, 3, "return")
    assert set(mix["returned"]["per-party-accuracy"]) == {str(p) for p in back}
    assert (mix["returned"]["sampled"], mix["returned"]["of"]) == (3, 6) and mix["selection"]["voters"] == 2
    assert mix["returned"]["test-rows"] == 360  # digits' whole test split: under return-test-rows' 2,000
    down = mix["bytes-down-per-node"]  # candidates went to the voters only: they received the most bytes
    heaviest = sorted(down, key=down.get)[-2:]
    assert sorted(inprocess.FIRST_NODE_ID + p for p in voters) == sorted(int(n) for n in heaviest)
    assert sample_parties(range(6), 0, 3, "vote") == list(range(6)) == sample_parties(range(6), 9, 3, "vote")


def test_a_returned_model_is_scored_on_a_seeded_sample_of_the_test_split():
    """`return-test-rows`: the same rows for every party (a seeded draw), a subset of the server's test split."""
    from fedsmix.config import Settings
    from fedsmix.space import load_test, returned_test

    settings = Settings(dataset="digits", return_test_rows=100, seed=4)
    x, labels = returned_test(settings)
    again, _ = returned_test(settings)
    full, full_labels = load_test(settings)
    assert len(x) == len(labels) == 100 and torch.equal(x, again)
    nearest = torch.cdist(x.flatten(1).double(), full.flatten(1).double()).argmin(dim=1)
    assert torch.equal(full[nearest], x) and torch.equal(full_labels[nearest], labels)  # rows of the test split
    assert len(returned_test(settings.replace(return_test_rows=0))[1]) == len(full_labels) == 360
    assert not torch.equal(returned_test(settings.replace(seed=5))[0], x)
