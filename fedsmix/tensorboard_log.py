"""TensorBoard event files beside progress.jsonl: a `Progress` sink that turns a run's events into scalars.

The ServerApp attaches one per run (run setting `tensorboard`, on by default) and closes it when the run
ends, failed or not. It writes into the run directory itself, so `tensorboard --logdir runs/` lists every
run by its directory name, and a grid's runs (runs/grid/<name>/cells/<cell>/<run>) side by side. The
strategies know nothing of it: every value comes from the events they already emit.

Tags (step: the epoch, the round or the party; 0 for a value a strategy has once):

    <strategy>/loss                  central training loss, every epoch
    <strategy>/<phase>/loss          another central phase's loss
    <strategy>/accuracy              test accuracy: the epochs that measured it (eval-every), FedAvg/FedProx rounds
    <strategy>/<phase>/accuracy      FedAvg rounds inside a strategy (mixup-union/mixcon-split/accuracy), or of
                                     one tuned setting (fedavg/setting-2-of-6/accuracy)
    <strategy>/.../validation-accuracy  a tuned FedAvg/FedProx round: the voters' pooled validation accuracy
    <strategy>/local-loss            FedAvg/FedProx: the parties' mean local training loss, per round
    <strategy>/parties-answered      FedAvg/FedProx: the parties whose update was aggregated, per round
    <strategy>/party-accuracy        local-only: each party's own model (step: the party)
    <strategy>/party-loss            local-only: each party's last local training loss (step: the party)
    <strategy>/returned-accuracy     the parties' mean accuracy with the model returned to them
    <strategy>/final-accuracy        the strategy's accuracy, as in results.json
    <strategy>/wall-seconds          the strategy's wall time (its adversary's attacks included)
    <strategy>/bytes-up-per-party    mean bytes a party sent, from the real messages
    <strategy>/bytes-down-per-party  mean bytes a party received
    adversary/<strategy>/<attack>/gain-snr-db   leakage: the attack's SNR gain over the blind guess, dB
    adversary/<strategy>/<attack>/snr-db        the attack's SNR, dB

The writer flushes after every event that wrote a scalar (and every 10 s on its own). An error (no
`tensorboard` package, a full disk) stops it: `Progress` detaches it and emits one `sink-failed` event.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from fedsmix.progress import Progress

MAIN_PHASE = "central training"
FLUSH_SECONDS = 10


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) else float(value)


def _slug(text: str) -> str:
    return "-".join(str(text).replace("/", " of ").split())


def scalars(event: dict[str, Any]) -> list[tuple[str, float, int]]:
    """The (tag, value, step) scalars of one event; none for most kinds."""
    kind, strategy = event.get("kind"), event.get("strategy") or "run"
    out: list[tuple[str, Any, Any]] = []
    if kind == "epoch":
        phase = event.get("phase") or MAIN_PHASE
        prefix = strategy if phase == MAIN_PHASE else f"{strategy}/{_slug(phase)}"
        out += [(f"{prefix}/loss", event.get("loss"), event.get("epoch")),
                (f"{prefix}/accuracy", event.get("accuracy"), event.get("epoch"))]
    elif kind == "round":
        prefix = f"{strategy}/{_slug(event['phase'])}" if event.get("phase") else strategy
        step = event.get("round")
        out += [(f"{prefix}/accuracy", event.get("accuracy"), step),
                (f"{prefix}/validation-accuracy", event.get("validation-accuracy"), step),
                (f"{prefix}/local-loss", event.get("train-loss"), step),
                (f"{prefix}/parties-answered", event.get("answered"), step)]
    elif kind == "party":
        out += [(f"{strategy}/party-accuracy", event.get("accuracy"), event.get("party")),
                (f"{strategy}/party-loss", event.get("train-loss"), event.get("party"))]
    elif kind == "returned":
        out.append((f"{strategy}/returned-accuracy", event.get("mean"), 0))
    elif kind in ("strategy-end", "strategy-failed"):
        out += [(f"{strategy}/final-accuracy", event.get("accuracy"), 0),
                (f"{strategy}/wall-seconds", event.get("seconds"), 0),
                (f"{strategy}/bytes-up-per-party", event.get("bytes-up-per-party"), 0),
                (f"{strategy}/bytes-down-per-party", event.get("bytes-down-per-party"), 0)]
    elif kind == "attack":
        where = f"adversary/{event['strategy']}" if event.get("strategy") else "adversary"
        attack = _slug(event.get("attack") or "attack")
        out += [(f"{where}/{attack}/gain-snr-db", event.get("gain"), 0),
                (f"{where}/{attack}/snr-db", event.get("snr"), 0)]
    return [(tag, value, int(step)) for tag, value, step in ((t, _number(v), s) for t, v, s in out)
            if value is not None and isinstance(step, int) and not isinstance(step, bool)]


class TensorBoardSink:
    """`sink(event)`: the event's scalars into `<log_dir>/events.out.tfevents.*` (made on the first scalar)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path | str, progress: Progress | None = None):
        self.log_dir, self.progress = Path(log_dir), progress
        self._writer = None
        self._stopped = False
        self._lock = threading.Lock()  # the watchdog thread emits too

    def __call__(self, event: dict[str, Any]) -> None:
        found = scalars(event)
        if not found or self._stopped:
            return
        with self._lock:
            try:
                if self._writer is None:
                    from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

                    self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=FLUSH_SECONDS)
                for tag, value, step in found:
                    self._writer.add_scalar(tag, value, step)
                self._writer.flush()
            except Exception:
                self._stop()
                raise  # Progress detaches the sink and emits `sink-failed`

    def _stop(self) -> Exception | None:
        self._stopped = True
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        except Exception as err:
            return err
        return None

    def close(self) -> None:
        """Flush and close the event file; an error becomes one `sink-failed` event, never an exception."""
        if self.progress is not None:
            self.progress.detach(self)
        with self._lock:
            if self._stopped:
                return
            err = self._stop()
        if err is not None and self.progress is not None:
            self.progress.emit("sink-failed", sink=self.name, error=f"{type(err).__name__}: {err}")


def attach(progress: Progress, log_dir: Path | str) -> TensorBoardSink:
    """A TensorBoard sink on `progress` (and its bound copies), writing into `log_dir`."""
    sink = TensorBoardSink(log_dir, progress)
    progress.attach(sink)
    return sink
