import tomllib

import pytest

from fedsmix.config import KEYS, PROJECT_ROOT, Settings, SettingsError, load_settings, settings_from_flower


def test_defaults_match_pyproject_run_config():
    """Flower only accepts overrides for keys declared in pyproject: keep both in step."""
    declared = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert set(declared) == set(KEYS)
    defaults = Settings().to_run_config()
    for key, value in declared.items():
        assert defaults[key] == value, key


def test_preset_then_overrides_precedence():
    from_preset = load_settings(preset="configs/quickstart.yaml")
    assert from_preset.dataset == "digits" and from_preset.tau == 1.0
    overridden = load_settings({"preset": "configs/quickstart.yaml", "tau": 1e-3})
    assert overridden.tau == 1e-3 and overridden.dataset == "digits"


def test_flower_defaults_do_not_beat_the_preset():
    """pyproject defaults arrive fused into run_config; only real overrides win over the preset."""
    run_config = Settings().to_run_config() | {"preset": "configs/quickstart.yaml"}
    settings = settings_from_flower(run_config, {"preset": "configs/quickstart.yaml", "epochs": 3})
    assert settings.tau == 1.0  # from the preset, although pyproject says 1e-6
    assert settings.epochs == 3


@pytest.mark.parametrize(
    "overrides, key, hint",
    [
        ({"tua": 1e-3}, "tua", "did you mean 'tau'?"),
        ({"xyzzy": 1}, "xyzzy", "allowed keys: preset, run-name"),
        ({"tau": 0}, "tau", "greater than 0"),
        ({"tau": -1}, "tau", "greater than 0"),
        ({"alpha": 0.5}, "alpha", "greater than 0.5"),
        ({"alpha": 1.0}, "alpha", "less than 1"),
        ({"min-parties": 1}, "min-parties", "greater than or equal to 2"),
        ({"strategies": "mixup-union,fedsgd"}, "strategies", "allowed: mixup-union"),
        ({"dataset": "imagenet"}, "dataset", "digits"),
        ({"epochs": "many"}, "epochs", "integer"),
        ({"radius-mode": "fixed"}, "radius", "radius > 0"),
    ],
)
def test_bad_settings_name_the_key(overrides, key, hint):
    with pytest.raises(SettingsError) as err:
        load_settings(overrides)
    assert key in str(err.value) and hint in str(err.value)


def test_a_misspelled_key_gets_a_suggestion_and_no_list():
    with pytest.raises(SettingsError) as err:
        load_settings({"epoch": 3})
    assert "unknown key(s) 'epoch' (did you mean 'epochs'" in str(err.value)  # the nearest first
    assert "allowed keys" not in str(err.value)


def test_our_own_checks_read_without_pydantics_prefix():
    with pytest.raises(SettingsError) as err:
        load_settings({"strategies": "mixup-union,fedsgd"})
    assert "Value error" not in str(err.value) and "strategies: unknown strategy 'fedsgd'" in str(err.value)


def test_missing_preset_lists_the_available_ones():
    with pytest.raises(SettingsError, match="quickstart.yaml"):
        load_settings({"preset": "configs/nope.yaml"})


def test_json_round_trip_is_exact():
    settings = load_settings({"preset": "configs/quickstart.yaml", "adversary": "linear,mmse"})
    assert Settings.from_json(settings.to_json()) == settings
    assert settings.adversary == ("linear", "mmse")


@pytest.mark.parametrize("parties", ["0", "1", "-3"])
def test_too_few_parties_are_refused_before_anything_starts(parties, tmp_path, capsys):
    """`--parties 0` used to run the default 10, `--parties 1` to wait a minute for a second party."""
    from commands.cli import main as cli

    runs = tmp_path / "runs"
    assert cli(["run", "--parties", parties, "--set", f"runs-dir={runs}"]) == 2
    assert f"--parties: {parties} parties; min-parties is 2" in capsys.readouterr().err
    assert not runs.exists()


def test_a_registered_data_set_that_is_missing_is_refused_before_anything_starts(tmp_path, capsys):
    """`--set dataset=mnist` where no data dir holds it: one message saying where it looked, exit 2, no run
    directory (it used to surface as a traceback from inside the simulation, after Ray had started)."""
    from commands.cli import main as cli

    runs = tmp_path / "runs"
    code = cli(["run", "--parties", "2", "--set", "dataset=mnist", "--set", f"data-dir={tmp_path / 'empty'}",
                "--set", f"runs-dir={runs}"])
    err = capsys.readouterr().err
    assert code == 2 and "dataset: dataset 'mnist' (test) not found. Tried: " in err and "mnist.npz" in err
    assert not runs.exists()


def test_a_bad_path_is_named_once(tmp_path, monkeypatch):
    """A relative path tried from the project directory itself is one path, and the value is not repeated."""
    monkeypatch.chdir(PROJECT_ROOT)
    with pytest.raises(SettingsError) as err:
        load_settings({"dataset": "./no-such-data"})
    message = str(err.value)
    assert message.count(str(PROJECT_ROOT / "no-such-data")) == 1 and message.count("'./no-such-data'") == 1
