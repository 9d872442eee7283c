"""What every command parses alike: `--set key=value` pairs, and the paths handed to Flower's apps."""

from __future__ import annotations

import json
from pathlib import Path

from fedsmix.config import PROJECT_ROOT, SettingsError


def parse_value(text: str):
    """A command-line value: JSON when it parses (numbers, true/false, lists), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_sets(pairs: list[str], what: str = "--set") -> dict:
    """key=value pairs, values through `parse_value`."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SettingsError(f"{what} expects key=value, got {pair!r}")
        out[key.strip()] = parse_value(value)
    return out


def absolute_paths(values: dict) -> dict:
    """The ServerApp and ClientApps run from Flower's app folder: hand them absolute paths."""
    from fedsmix.data import default_data_dir

    values = dict(values)
    data_dir = default_data_dir(str(values.get("data-dir", "")))
    if data_dir is not None:
        values["data-dir"] = str(data_dir.resolve())
    values["runs-dir"] = str(Path(values.get("runs-dir") or PROJECT_ROOT / "runs").expanduser().resolve())
    if values.get("resume") and values["resume"] != "latest":
        values["resume"] = str(Path(values["resume"]).expanduser().resolve())
    if values.get("feature-cache-dir"):
        values["feature-cache-dir"] = str(Path(values["feature-cache-dir"]).expanduser().resolve())
    return values
