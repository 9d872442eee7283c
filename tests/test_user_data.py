"""Your own data: `dataset` as a path to an .npz or an ImageFolder; what is inferred, what is refused (naming
the file and the problem, before anything is written), and both kinds end to end in a two-party simulation."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedsmix import data as datalib
from fedsmix.config import SettingsError, load_settings
from fedsmix.data import DatasetError


@pytest.fixture(scope="module")
def mnist_slice(data_dir):
    with np.load(f"{data_dir}/mnist.npz") as d:
        return tuple(d[key][:n].copy() for key, n in (("x_train", 1000), ("y_train", 1000), ("x_test", 300),
                                                       ("y_test", 300)))


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def write_folder(root, splits: dict, mode: str = "L", ext: str = "png"):
    """splits: name -> (images N x H x W [x C], labels); class folders named c<label>."""
    for split, (images, labels) in splits.items():
        for i, (image, label) in enumerate(zip(images, labels)):
            path = root / split / f"c{label}" / f"{i}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).convert(mode).save(path)
    return str(root)


@pytest.fixture(scope="module")
def user_npz(tmp_path_factory, mnist_slice):
    x, y, xt, yt = mnist_slice
    return write_npz(tmp_path_factory.mktemp("npz") / "scans.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory, mnist_slice):
    """Digits 0-4 of the MNIST slice as RGB PNGs (so the folder's images have three channels)."""
    x, y, xt, yt = mnist_slice
    keep, keep_t = y < 5, yt < 5
    return write_folder(tmp_path_factory.mktemp("folder") / "photos",
                        {"train": (x[keep][:400], y[keep][:400]), "test": (xt[keep_t][:100], yt[keep_t][:100])},
                        mode="RGB")


# ----------------------------------------------------------------------------------------- inferred
def test_npz_is_inferred_and_reported(user_npz, mnist_slice):
    x, y, xt, yt = mnist_slice
    settings = load_settings({"dataset": user_npz})
    info = datalib.describe_dataset(settings)
    assert (info["layout"], info["channels"], info["image-size"], info["num-classes"]) == ("npz", 1, 28, 10)
    assert (info["train"], info["test"], info["pixel-scale"]) == (1000, 300, 255.0)
    assert info["mean"][0] == pytest.approx(x.mean() / 255, abs=1e-6)
    assert info["std"][0] == pytest.approx((x / 255).std(), abs=1e-6)
    train = datalib.load_dataset(settings, "train")
    assert train.images.shape == (1000, 1, 28, 28) and np.array_equal(train.labels, y)
    assert datalib.dataset_spec(settings).sample_shape == (1, 28, 28)
    assert datalib.dataset_key(settings).startswith("scans-")  # a file-name-safe key (feature cache)


def test_x_y_alone_are_cut_per_class_the_same_way_every_time(tmp_path, mnist_slice):
    x, y, _, _ = mnist_slice
    path = write_npz(tmp_path / "xy.npz", x=x, y=y)
    first = datalib.read_npz_dataset(tmp_path / "xy.npz")
    again = datalib.load_dataset(load_settings({"dataset": path}), "test")
    assert len(first.train) + len(first.test) == 1000 and np.array_equal(first.test.images, again.images)
    for c in range(10):  # 80 % of every class for training (rounded), the rest for testing
        assert (first.train.labels == c).sum() == round(0.8 * (y == c).sum())
    rows = {tuple(r.ravel()) for r in first.train.images[:50]}
    assert not rows & {tuple(r.ravel()) for r in first.test.images}  # disjoint


def test_image_folder_is_inferred_and_decoded_exactly(user_folder, mnist_slice):
    x, y, _, _ = mnist_slice
    settings = load_settings({"dataset": user_folder})
    info = datalib.describe_dataset(settings)
    assert (info["layout"], info["channels"], info["image-size"], info["num-classes"]) == ("image-folder", 3, 28, 5)
    assert info["classes"] == ["c0", "c1", "c2", "c3", "c4"] and (info["train"], info["test"]) == (400, 100)
    train = datalib.load_dataset(settings, "train")
    first = sorted(range(400), key=lambda i: (y[y < 5][i], str(i)))[0]  # c0/0.png: the first image of class 0
    assert np.array_equal(train.images[0, 0], x[y < 5][first]) and train.labels[0] == 0
    assert np.array_equal(train.images[0, 0], train.images[0, 2])  # grey pixels saved as RGB


def test_sixteen_bit_greyscale_keeps_its_range(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 65536, size=(8, 16, 16), dtype=np.uint16)
    for split in ("train", "test"):
        for i in range(8):
            path = tmp_path / "scans" / split / f"class{i % 2}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(path)  # a 16-bit PNG (mode I;16)
    dataset = datalib.read_image_folder(tmp_path / "scans")
    assert dataset.spec.pixel_scale == 65535.0 and dataset.spec.channels == 1
    assert np.array_equal(dataset.train.images[:, 0], images[[0, 2, 4, 6, 1, 3, 5, 7]])


def test_a_preset_may_give_the_statistics(tmp_path, user_npz):
    preset = tmp_path / "mine.yaml"
    preset.write_text(f"dataset: {user_npz}\ndataset-mean: [0.5]\ndataset-std: [0.25]\n")
    settings = load_settings({"preset": str(preset)})
    assert datalib.dataset_spec(settings).mean == (0.5,) and datalib.dataset_spec(settings).std == (0.25,)
    raw = datalib.load_dataset(settings, "test")
    assert raw.spec.mean == (0.5,)  # the partitions are normalised with them
    assert datalib.describe_dataset(settings)["statistics"].startswith("given by the settings")
    with pytest.raises(DatasetError, match="dataset-mean / dataset-std: 3 values .* 1 channel"):
        datalib.dataset_spec(settings.replace(dataset_mean=(0.5,) * 3, dataset_std=(0.2,) * 3))
    with pytest.raises(SettingsError, match="dataset-mean / dataset-std give the statistics of your own data set"):
        load_settings({"dataset": "mnist", "dataset-mean": "0.1", "dataset-std": "0.3"})
    with pytest.raises(SettingsError, match="dataset-std: every value must be > 0"):
        load_settings({"dataset": user_npz, "dataset-mean": "0.1", "dataset-std": "0"})


def test_a_relative_path_becomes_absolute(monkeypatch, tmp_path, user_npz):
    import shutil

    shutil.copy(user_npz, tmp_path / "here.npz")
    monkeypatch.chdir(tmp_path)
    assert load_settings({"dataset": "here.npz"}).dataset == str(tmp_path / "here.npz")


def test_decoded_once_per_process_not_once_per_party(user_folder):
    from fedsmix.party import load_partition

    settings = load_settings({"dataset": user_folder, "partitioner": "iid"})
    datalib._read_user_dataset.cache_clear()
    for party in range(3):
        load_partition(settings, party, 3)
    datalib.load_dataset(settings, "test")
    info = datalib._read_user_dataset.cache_info()
    assert (info.misses, info.hits) == (1, info.hits) and info.hits >= 3


# ----------------------------------------------------------------------------------------- refused
@pytest.mark.parametrize("key, value, message", [
    ("dataset", "no/such/scans.npz", "neither a registered data set"),
    ("dataset", "README.md", "must be an .npz archive"),
    ("dataset", "configs", "missing train/, test/"),
])
def test_bad_paths_fail_in_the_settings_naming_the_key(key, value, message):
    with pytest.raises(SettingsError) as err:
        load_settings({key: value})
    assert str(err.value).startswith(f"settings: {key}:") and message in str(err.value)


def _npz_cases(x, y, xt, yt):
    return {
        "missing arrays": (dict(x_train=x, y_train=y, x_test=xt), "missing arrays y_test"),
        "no arrays at all": (dict(images=x), "missing arrays x_train, y_train, x_test, y_test"),
        "labels out of range": (dict(x_train=x, y_train=y, x_test=xt, y_test=np.where(yt == 3, 12, yt)),
                                "test label 12 is out of range 0..9"),
        "negative labels": (dict(x_train=x, y_train=np.where(y == 3, -1, y.astype(np.int64)), x_test=xt, y_test=yt),
                            "train label -1 is out of range"),
        "mismatched lengths": (dict(x_train=x, y_train=y[:-5], x_test=xt, y_test=yt),
                               "y_train: 995 labels for 1000 images (mismatched lengths)"),
        "an empty class": (dict(x_train=x, y_train=np.where(y == 4, 5, y), x_test=xt, y_test=np.where(yt == 4, 5, yt)),
                           "class 4 has no training samples (an empty class"),
        "fractional labels": (dict(x_train=x, y_train=y + 0.5, x_test=xt, y_test=yt), "whole numbers"),
        "train and test differ": (dict(x_train=x, y_train=y, x_test=xt[:, :20, :20], y_test=yt),
                                  "both splits need the same size"),
        "not square": (dict(x_train=x[:, :, :20], y_train=y, x_test=xt[:, :, :20], y_test=yt), "square images"),
        "NaN pixels": (dict(x_train=np.where(x > 250, np.nan, x / 255.0), y_train=y, x_test=xt / 255.0, y_test=yt),
                       "NaN or infinite"),
        "pixels too large": (dict(x_train=x * 1000.0, y_train=y, x_test=xt * 1000.0, y_test=yt), "reach 255000"),
    }


NPZ_CASES = ["missing arrays", "no arrays at all", "labels out of range", "negative labels", "mismatched lengths",
             "an empty class", "fractional labels", "train and test differ", "not square", "NaN pixels",
             "pixels too large"]


@pytest.mark.parametrize("case", NPZ_CASES)
def test_each_bad_npz_is_refused_naming_the_file(tmp_path, mnist_slice, case):
    arrays, message = _npz_cases(*mnist_slice)[case]
    path = write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DatasetError) as err:
        datalib.describe_dataset(load_settings({"dataset": path}))
    assert str(err.value).startswith(path) and message in str(err.value), str(err.value)


def test_a_file_that_is_no_npz_archive_is_refused(tmp_path):
    (tmp_path / "broken.npz").write_bytes(b"this is not a zip archive")
    with pytest.raises(DatasetError, match=f"{tmp_path}/broken.npz: not a readable .npz archive"):
        datalib.describe_dataset(load_settings({"dataset": str(tmp_path / "broken.npz")}))


def _spoil(root, case: str):
    """One thing wrong with an otherwise good folder; returns the file the message must name."""
    if case == "images of different sizes":
        path = root / "train" / "c1" / "big.png"
        Image.fromarray(np.zeros((32, 32), np.uint8)).save(path)
        return path, "image is 32x32 but"
    if case == "an empty class":
        path = root / "train" / "c9"
        path.mkdir()
        return path, "class folder holds no images (an empty class)"
    if case == "a non-image file":
        path = root / "train" / "c0" / "notes.txt"
        path.write_text("scanned on Monday")
        return path, "not an image file (extension .txt"
    if case == "a corrupt image":
        path = root / "test" / "c2" / "broken.png"
        path.write_bytes(b"\x89PNG garbage")
        return path, "not a readable image"
    if case == "a stray file":
        path = root / "train" / "labels.csv"
        path.write_text("a,b")
        return path, "every image belongs in a class sub-folder"
    if case == "an unknown test class":
        path = root / "test" / "c7"
        path.mkdir()
        Image.fromarray(np.zeros((28, 28), np.uint8)).save(path / "0.png")
        return path, "class folder has no counterpart in"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["images of different sizes", "an empty class", "a non-image file",
                                  "a corrupt image", "a stray file", "an unknown test class"])
def test_each_bad_image_folder_is_refused_naming_the_file(tmp_path, mnist_slice, case):
    x, y, xt, yt = mnist_slice
    keep, keep_t = y < 3, yt < 3
    root = tmp_path / "scans"
    write_folder(root, {"train": (x[keep][:30], y[keep][:30]), "test": (xt[keep_t][:9], yt[keep_t][:9])})
    culprit, message = _spoil(root, case)
    with pytest.raises(DatasetError) as err:
        datalib.describe_dataset(load_settings({"dataset": str(root)}))
    assert str(err.value).startswith(str(culprit)) and message in str(err.value), str(err.value)


def test_nothing_is_written_for_a_bad_dataset(tmp_path, mnist_slice, capsys):
    """The command line, the ServerApp and the in-process transport refuse before a run directory exists."""
    from commands import inprocess
    from commands.cli import main as cli
    from server.app import run_experiment

    x, y, xt, yt = mnist_slice
    path = write_npz(tmp_path / "bad.npz", x_train=x, y_train=y, x_test=xt, y_test=yt + 1)  # label 10 of 0..9
    runs = tmp_path / "runs"
    assert cli(["run", "--set", f"dataset={path}", "--set", f"runs-dir={runs}"]) == 2
    assert "test label 10 is out of range 0..9" in capsys.readouterr().err
    settings = load_settings({"dataset": path, "runs-dir": str(runs)})
    with pytest.raises(DatasetError):
        run_experiment(grid=None, settings=settings)  # fails before it touches the grid
    with pytest.raises(DatasetError):
        inprocess.run(settings, 2)
    assert not runs.exists()


# ------------------------------------------------------------------------------------- end to end
@pytest.mark.sim
def test_user_npz_and_image_folder_end_to_end_in_a_two_party_simulation(user_npz, user_folder, runs_dir):
    """Both through the real ServerApp and ClientApps, one after the other on the same two SuperNodes."""
    from commands.simulate import simulate_each

    base = {"preset": "configs/quickstart.yaml", "runs-dir": runs_dir, "strategies": "mixup-union,local-only",
            "trainer": "mlp", "epochs": 10, "partitioner": "iid"}
    runs = [load_settings({**base, "dataset": user_npz}), load_settings({**base, "dataset": user_folder})]
    npz, folder = simulate_each(runs, num_parties=2)
    for results, layout, classes, channels in ((npz, "npz", 10, 1), (folder, "image-folder", 5, 3)):
        assert "error" not in results, results.get("error")
        assert (results["dataset"]["layout"], results["dataset"]["num-classes"]) == (layout, classes)
        assert results["dataset"]["channels"] == channels
        mix, local = results["strategies"]["mixup-union"], results["strategies"]["local-only"]
        assert mix["parties-used"] == 2 and local["parties-used"] == 2
        assert mix["accuracy"] > 2 / classes and local["accuracy"] > 2 / classes  # well above chance
        # every training image encoded once, but the validation splits the parties keep (10 %, rounded up each)
        train = results["dataset"]["train"]
        assert 0.1 * train <= train - mix["union-size"] <= 0.1 * train + 2


def test_a_folder_with_three_problems_reports_all_three(tmp_path, mnist_slice):
    """One report for everything wrong, not the first problem alone (fix, rerun, find the next, ...)."""
    x, y, xt, yt = mnist_slice
    keep, keep_t = y < 3, yt < 3
    root = tmp_path / "scans"
    write_folder(root, {"train": (x[keep][:30], y[keep][:30]), "test": (xt[keep_t][:9], yt[keep_t][:9])})
    spoiled = [_spoil(root, case) for case in ("a stray file", "a non-image file", "images of different sizes")]
    with pytest.raises(DatasetError) as err:
        datalib.describe_dataset(load_settings({"dataset": str(root)}))
    report = str(err.value)
    assert all(f"{culprit}: " in report and message in report for culprit, message in spoiled), report
    assert report.endswith(f"(3 problems in {root})")
