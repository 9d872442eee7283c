"""Progress of a run: one line per event on stdout, the same event as one JSON line in a file.

The ServerApp (and the direct engine, the attack sweep) make one `Progress` per run, writing
`<run dir>/progress.jsonl`; a strategy gets a copy bound to its name (`bind(strategy=...)`). Flower
streams the ServerApp's stdout (`flwr run --stream`), and `fedsmix show --follow` tails the
file from a second terminal; both render an event with `describe`.

Not a flood: epoch lines at most one per `interval` seconds (always the first and the last epoch, and
every epoch that measured test accuracy); the rest are one line per party, round, tau or step. A
watchdog (`watch()`) fills silences: while a step runs, it emits an `alive` event when nothing has
been emitted for 2 x interval seconds (at least 5 s), naming the last event and how long ago.

Sinks (`attach(sink)`) get every event as a dict, epochs the throttle kept off the lines included (the
TensorBoard writer, fedsmix/tensorboard_log.py); a sink that raises is detached and named by one
`sink-failed` event: a sink never makes a run fail.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

FILE = "progress.jsonl"
PREFIX = "fedsmix"


def clock(seconds: float | None) -> str:
    """12s, 3m05s, 1h02m."""
    if seconds is None:
        return "?"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _pct(value: Any) -> str:
    return f"{100 * value:.2f}%" if isinstance(value, int | float) else "-"


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def describe(event: dict[str, Any]) -> str:
    """The one-line text of an event (stdout, `fedsmix show`)."""
    e = event
    kind = e.get("kind", "?")
    g = (lambda key: "-" if e.get(key) is None else e[key])  # noqa: E731 (a missing field reads "-")
    where = f"[{e['strategy']}] " if e.get("strategy") else ""
    if kind == "run-start":
        text = (f"run {g('run-dir')}: strategies {','.join(e.get('strategies') or [])}, dataset {g('dataset')}"
                + (f", {e['parties']} parties" if e.get("parties") else ""))
    elif kind == "dataset":
        text = (f"dataset {g('name')}" + (f" ({e['layout']} {e['path']})" if e.get("path") else "")
                + f": {g('channels')} channel(s), {g('image-size')}x{g('image-size')} px, {g('num-classes')} classes")
        if e.get("path"):
            text += (f", {g('train')} train / {g('test')} test images; mean "
                     f"{', '.join(f'{v:.4f}' for v in e.get('mean') or [])}, std "
                     f"{', '.join(f'{v:.4f}' for v in e.get('std') or [])} ({g('statistics')})")
    elif kind == "parties":
        text = f"parties connected and loaded: {g('answered')} of {g('of')}"
    elif kind == "strategy-start":
        text = f"start ({g('index')} of {g('total')})"
    elif kind == "upload":
        text = f"upload from party {g('party')}: {g('done')} of {g('of')} parties done" + (
            f" ({e['rows']} rows, encoded in {clock(e.get('encode-seconds'))})" if e.get("rows") else ""
        )
    elif kind == "upload-rejected":
        text = f"upload from party {g('party')} rejected ({g('field')}): {g('reason')}"
    elif kind == "vote-refused":
        text = f"votes of party {g('party')} not counted ({g('field')}): {g('reason')}"
    elif kind == "dropped":
        text = f"party {g('party')} (node {g('node')}) dropped: {g('reason')}"
    elif kind == "epoch":
        text = (f"{g('phase')} epoch {g('epoch')}/{g('epochs')}: loss {_num(e.get('loss'), '.4f')}, "
                f"elapsed {clock(e.get('elapsed'))}, ETA {clock(e.get('eta'))}")
        if e.get("accuracy") is not None:
            text += f", test accuracy {_pct(e['accuracy'])}"
    elif kind == "selection-start":
        text = (f"trainer selection: {g('candidates')} candidates trained on {g('train-rows')} rows, for the parties "
                "to score on their own validation splits")
    elif kind == "public-unavailable":
        skipped = ", ".join(e.get("skipped") or [])
        text = (f"trainer candidates {skipped} skipped (they need the server's public set, which is optional: "
                f"{g('reason')}); the other candidates run")
    elif kind == "selection":
        scores = {n: v for n, v in (e.get("scores") or {}).items() if isinstance(v, int | float) and v == v}
        best = sorted(scores.items(), key=lambda kv: -kv[1])[:3]
        text = (f"trainer selection: {len(e.get('scores') or {})} candidates scored by {g('voters')} parties, "
                f"chose {g('chosen')} (best: " + ", ".join(f"{n} {_pct(v)}" for n, v in best) + ")")
    elif kind == "party":
        text = f"party {g('party')} done: {g('done')} of {g('of')}, test accuracy {_pct(e.get('accuracy'))}"
    elif kind == "round":
        answered = f"{g('answered')} of {g('sampled')} parties answered" if e.get("round") else "initial model"
        scored = f", validation {_pct(e['validation-accuracy'])}" if e.get("validation-accuracy") is not None else ""
        text = (f"{g('phase') + ' ' if e.get('phase') else ''}round {g('round')}/{g('rounds')}: {answered}, "
                f"test accuracy {_pct(e.get('accuracy'))}{scored}, elapsed {clock(e.get('elapsed'))}, "
                f"ETA {clock(e.get('eta'))}")
    elif kind == "answers":
        text = f"{g('phase')}: {g('answered')} of {g('of')} parties answered"
    elif kind == "returned":
        text = (f"model returned to {g('parties')} parties" + (f" (a sample of {e['of']})" if e.get("of") else "")
                + f": mean test accuracy {_pct(e.get('mean'))}")
    elif kind == "attack-start":
        text = f"attacks {','.join(e.get('attacks') or [])} on {g('parties')} parties' uploads, {g('victims')} victims"
    elif kind == "attack":
        text = (f"attack {g('attack')}: SNR {_num(e.get('snr'), '.2f')} dB, gain {_num(e.get('gain'), '+.2f')} dB "
                "over the trivial guess")
    elif kind == "tau":
        text = (f"tau {_num(e.get('tau'), 'g')} ({g('index')} of {g('of')}): r {_num(e.get('radius'), '.4g')}, "
                + ", ".join(f"{n} {_num(v, '.2f')} dB" for n, v in (e.get("snr") or {}).items())
                + f"; elapsed {clock(e.get('elapsed'))}, ETA {clock(e.get('eta'))}")
    elif kind == "strategy-end":
        text = f"done in {clock(e.get('seconds'))}: test accuracy {_pct(e.get('accuracy'))}"
    elif kind == "strategy-failed":
        text = f"failed after {clock(e.get('seconds'))}: {g('error')}"
    elif kind == "alive":
        text = f"still working; last: {g('step')} ({clock(e.get('since'))} ago)"
    elif kind == "sink-failed":
        text = f"{g('sink')} stopped after an error (the run goes on): {g('error')}"
    elif kind == "run-interrupted":
        text = f"run interrupted: {g('reason')}"
    elif kind == "run-end":
        text = f"run finished after {clock(e.get('clock'))}"
        if e.get("failures"):
            text += f"; failures: {'; '.join(e['failures'])}"
    else:
        fields = {k: v for k, v in e.items() if k not in ("kind", "time", "clock", "strategy")}
        text = f"{kind} " + " ".join(f"{k}={v}" for k, v in fields.items())
    return f"{PREFIX} {where}{text}"


class Progress:
    """Emit events: print one line, append one JSON line (when a path is given)."""

    def __init__(self, path: Path | str | None = None, echo: bool = True, interval: float = 10.0,
                 stream: TextIO | None = None, _shared: dict | None = None, **fields: Any):
        self.path = Path(path) if path is not None else None
        self.echo, self.interval, self.fields = echo, float(interval), fields
        self._stream = stream
        # state shared by every bound copy: one lock, one clock, the last event (for the watchdog)
        self._shared = _shared if _shared is not None else {
            "lock": threading.Lock(), "t0": time.monotonic(), "last": None, "last-time": time.monotonic(),
            "sinks": [],
        }
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def bind(self, **fields: Any) -> Progress:
        """A copy that adds `fields` (strategy=...) to every event."""
        return Progress(self.path, self.echo, self.interval, self._stream, self._shared, **{**self.fields, **fields})

    @property
    def clock(self) -> float:
        return time.monotonic() - self._shared["t0"]

    def attach(self, sink: Callable[[dict[str, Any]], None]) -> None:
        """Hand every later event of this Progress and of its bound copies to `sink(event)` as well."""
        self._shared["sinks"].append(sink)

    def detach(self, sink: Callable[[dict[str, Any]], None]) -> None:
        if sink in self._shared["sinks"]:
            self._shared["sinks"].remove(sink)

    def _event(self, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        # `clock`: seconds since the run began (the same clock for every event of the run); a step's own
        # time is its `elapsed`
        return {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "clock": round(self.clock, 3),
                "kind": kind, **self.fields, **fields}

    def _to_sinks(self, event: dict[str, Any]) -> None:
        for sink in list(self._shared["sinks"]):
            try:
                sink(event)
            except Exception as err:  # the sink stops, the run goes on
                self.detach(sink)
                self.emit("sink-failed", sink=getattr(sink, "name", type(sink).__name__),
                          error=f"{type(err).__name__}: {err}")

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = self._event(kind, fields)
        line = describe(event)
        with self._shared["lock"]:
            if self.echo:
                print(line, file=self._stream or sys.stdout, flush=True)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(event, default=str) + "\n")
            if kind != "alive":
                where = f"{PREFIX} [{event['strategy']}] " if event.get("strategy") else f"{PREFIX} "
                self._shared["last"], self._shared["last-time"] = line.removeprefix(where), time.monotonic()
        self._to_sinks(event)
        return event

    # ------------------------------------------------------------------------ epochs, ETA
    def epochs(self, total: int, phase: str = "training", **fields: Any) -> Callable[..., None]:
        """An epoch reporter `report(epoch, loss, accuracy=None)`: loss, elapsed, ETA; throttled to one
        line per `interval` seconds (the first and last epoch, and epochs with an accuracy, always)."""
        t0, state = time.monotonic(), {"first": None, "printed": None, "t-first": None, "t-one": None}

        def report(epoch: int, loss: float, accuracy: float | None = None) -> None:
            now = time.monotonic()
            if state["first"] is None:  # a resumed run starts past epoch 0
                state["first"], state["t-first"], state["t-one"] = epoch, now, now - t0
            # the reporter may be made long before its first epoch starts (a selection runs first): time
            # per epoch from the epochs after the first, the first one's from the reporter's creation
            since = epoch - state["first"]
            per_epoch = (now - state["t-first"]) / since if since > 0 else state["t-one"]
            elapsed = now - state["t-first"] + per_epoch
            due = (state["printed"] is None or epoch >= total or accuracy is not None
                   or now - state["printed"] >= self.interval)
            eta = per_epoch * (total - epoch)
            event = dict(phase=phase, epoch=epoch, epochs=total, loss=float(loss), elapsed=round(elapsed, 3),
                         eta=round(eta, 3), **({"accuracy": accuracy} if accuracy is not None else {}), **fields)
            if not due:  # no line, no JSON line; the sinks still get every epoch
                if self._shared["sinks"]:
                    self._to_sinks(self._event("epoch", event))
                return
            state["printed"] = now
            self.emit("epoch", **event)

        return report

    # ---------------------------------------------------------------------------- watchdog
    @contextmanager
    def watch(self, silence: float | None = None) -> Iterator[Progress]:
        """While the block runs, emit `alive` after `silence` seconds without an event (default: 2 x interval,
        at least 5 s)."""
        silence = max(2 * self.interval, 5.0) if silence is None else silence
        stop = threading.Event()

        def watchdog() -> None:
            while not stop.wait(min(1.0, silence / 2)):
                quiet = time.monotonic() - self._shared["last-time"]
                if quiet >= silence:
                    self.emit("alive", step=self._shared["last"] or "starting", since=round(quiet, 1))
                    self._shared["last-time"] = time.monotonic()

        thread = threading.Thread(target=watchdog, name="fedsmix-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=2)


SILENT = Progress(None, echo=False)


def read_events(path: Path | str) -> list[dict[str, Any]]:
    """Every complete event in a progress file (a line being written is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the writer's last line, not finished yet
    return events


def follow(path: Path | str, out: Callable[[str], None] = print, poll: float = 0.5,
           timeout: float | None = None, from_start: bool = True) -> int:
    """Tail a progress file: print each event's line as it is appended; stop at `run-end` (or `timeout`
    seconds without a new event). Waits for the file to appear. Returns the number of events printed."""
    path, printed, offset, buffer = Path(path), 0, 0, ""
    last = time.monotonic()
    if not from_start and path.is_file():
        offset = path.stat().st_size
    while True:
        if path.is_file():
            with open(path, encoding="utf-8") as handle:
                handle.seek(offset)
                chunk = handle.read()
                offset = handle.tell()
            buffer += chunk
            *lines, buffer = buffer.split("\n")
            for line in lines:
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out(describe(event))
                printed += 1
                last = time.monotonic()
                if event.get("kind") == "run-end":
                    return printed
        if timeout is not None and time.monotonic() - last > timeout:
            return printed
        time.sleep(poll)
