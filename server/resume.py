"""Resume an interrupted run in its own run directory (`resume=<run dir>` or `resume=latest`).

What a resumed run keeps: the results of strategies that finished, the validated uploads whose
files still match the manifest's sha256 (their parties are not asked again), and the central
training checkpoint (training continues from its last epoch). What it refuses: settings that
would change the result (another seed, tau, epochs...), named key by key.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from fedsmix.config import Settings, SettingsError, dump_settings
from fedsmix.runs import link_latest

# Keys that may change between the interrupted run and its resumption: they steer the run,
# not what it computes (which strategies still run, where files go, how long to wait, faults).
MAY_CHANGE = frozenset(
    {
        "preset", "resume", "fault", "reply-timeout", "start-timeout", "strategies", "runs-dir", "run-name", "device",
        "data-dir", "feature-cache-dir", "download", "min-parties", "checkpoint-every", "eval-every",
        "tensorboard",
    }
)


def resolve(settings: Settings) -> Path:
    """The run directory to resume: a path, or a name inside runs-dir ('latest' included)."""
    given = Path(settings.resume).expanduser()
    candidates = [given] if given.is_absolute() else [Path.cwd() / given, Path(settings.runs_dir).expanduser() / given]
    for path in candidates:
        if (path / "results.json").is_file():
            return path.resolve()
    raise SettingsError(
        f"resume: no run directory with a results.json at {' or '.join(str(p) for p in candidates)}; "
        "give a run directory (runs/<time>-<name>) or 'latest'"
    )


def changed_settings(stored: dict, settings: Settings) -> list[str]:
    now = dump_settings(settings)
    return sorted(k for k in set(stored) | set(now) if k not in MAY_CHANGE and stored.get(k) != now.get(k))


def reopen(settings: Settings) -> tuple[Path, dict, set[str]]:
    """Run dir, its results so far (with a note of this resumption) and the strategies already done."""
    run_dir = resolve(settings)
    results = json.loads((run_dir / "results.json").read_text())
    changed = changed_settings(results.get("settings", {}), settings)
    if changed:
        stored = results.get("settings", {})
        now = dump_settings(settings)
        detail = ", ".join(f"{k}: {stored.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise SettingsError(f"resume: {run_dir} was run with other settings ({detail}); resume with the same ones")
    done = {name for name, res in results.get("strategies", {}).items() if "error" not in res}
    for name in list(results.get("strategies", {})):
        if name not in done:
            results["strategies"].pop(name)  # its error is history: it runs again
    results.setdefault("resumed", []).append(
        {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kept": sorted(done), "fault": settings.fault}
    )
    results["settings"] = dump_settings(settings)
    runs_root = Path(settings.runs_dir).expanduser().resolve()
    if run_dir.parent == runs_root:
        link_latest(runs_root, run_dir)
    return run_dir, results, done
