"""Validated uploads on disk: one .npy per array, a manifest with sha256, memory-mapped reads.

The server never holds the union in RAM: training reads batches straight from the files
through `Union`, so thirty CIFAR-10 parties cost one copy on disk and a page cache.

Saving an upload appends its entry to a journal (`manifest.jsonl`, one line, flushed to disk): the work per
upload does not grow with the parties stored before it. `flush()` writes the whole manifest (`manifest.json`)
once, after a phase; opening a store reads the manifest and then the journal's later entries, so an interrupted
run loses no stored upload. A journal line cut short by a crash is ignored (its party is asked again).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsmix.runs import atomic_save_npy, atomic_write_json, sha256_file


@dataclass
class StoredUpload:
    party: int
    x_path: Path
    y_path: Path
    rows: int


class UploadStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifest_path = self.root / "manifest.json"
        self.journal_path = self.root / "manifest.jsonl"
        self.manifest: dict[str, dict] = (
            json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else {}
        )
        if self.journal_path.exists():
            for line in self.journal_path.read_text().splitlines():
                try:
                    party, entry = json.loads(line)
                except ValueError:  # a line cut short by a crash: that party's files are not trusted
                    continue
                if entry is None:
                    self.manifest.pop(party, None)
                else:
                    self.manifest[party] = entry

    def save(self, party: int, x: np.ndarray, y: np.ndarray, metrics: dict) -> StoredUpload:
        if str(party) in self.manifest:
            raise ValueError(f"party {party}: an upload is already stored for this run")
        x_path, y_path = self.root / f"party-{party:03d}.x.npy", self.root / f"party-{party:03d}.y.npy"
        entry = {
            "x": {
                "file": x_path.name,
                "sha256": atomic_save_npy(x_path, x),
                "shape": list(x.shape),
                "dtype": str(x.dtype),
            },
            "y": {
                "file": y_path.name,
                "sha256": atomic_save_npy(y_path, y),
                "shape": list(y.shape),
                "dtype": str(y.dtype),
            },
            "metrics": metrics,
        }
        self.manifest[str(party)] = entry
        self._journal(str(party), entry)
        return StoredUpload(party, x_path, y_path, len(x))

    def _journal(self, party: str, entry: dict | None) -> None:
        """One line per change (None: the party's upload was discarded), on disk before the call returns."""
        with open(self.journal_path, "a") as journal:
            journal.write(json.dumps([party, entry]) + "\n")
            journal.flush()
            os.fsync(journal.fileno())

    def flush(self) -> None:
        """The whole manifest in manifest.json (atomic), and the journal it now contains emptied."""
        atomic_write_json(self.manifest_path, self.manifest)
        self.journal_path.unlink(missing_ok=True)

    def verify(self) -> list[int]:
        """Parties whose files no longer match the manifest's sha256."""
        bad = []
        for party, entry in self.manifest.items():
            for key in ("x", "y"):
                path = self.root / entry[key]["file"]
                if not path.exists() or sha256_file(path) != entry[key]["sha256"]:
                    bad.append(int(party))
                    break
        return sorted(set(bad))

    def discard(self, party: int) -> None:
        """Forget a party's upload (its files failed verification): the manifest first, then the files."""
        entry = self.manifest.pop(str(party))
        self._journal(str(party), None)
        for key in ("x", "y"):
            (self.root / entry[key]["file"]).unlink(missing_ok=True)

    def union_key(self, parties: list[int]) -> str:
        """Names exactly these uploads (their sha256): a checkpoint of training on them carries it."""
        digests = [
            f"{p}:{self.manifest[str(p)]['x']['sha256']}:{self.manifest[str(p)]['y']['sha256']}" for p in parties
        ]
        return hashlib.sha256(";".join(digests).encode()).hexdigest()

    def parties(self) -> list[int]:
        return sorted(int(p) for p in self.manifest)

    def union(self, parties: list[int] | None = None) -> tuple[Union, np.ndarray]:
        """Memory-mapped inputs of the chosen parties, and their labels (small) in RAM."""
        parties = self.parties() if parties is None else parties
        xs = [np.load(self.root / self.manifest[str(p)]["x"]["file"], mmap_mode="r") for p in parties]
        ys = [np.load(self.root / self.manifest[str(p)]["y"]["file"]) for p in parties]
        return Union(xs), np.concatenate(ys).astype(np.float32)


class Union:
    """Row-indexable concatenation of several (memory-mapped) arrays, without copying them."""

    def __init__(self, parts: list[np.ndarray]):
        if not parts:
            raise ValueError("no uploads to train on")
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])
        self.shape = (int(self.offsets[-1]),) + tuple(parts[0].shape[1:])

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        index = np.atleast_1d(np.asarray(index, dtype=np.int64))
        which = np.searchsorted(self.offsets, index, side="right") - 1
        out = np.empty((len(index),) + self.shape[1:], dtype=np.float32)
        for part in np.unique(which):
            mask = which == part
            local = index[mask] - self.offsets[part]
            order = np.argsort(local)  # sorted reads are kinder to the page cache
            rows = np.asarray(self.parts[part][local[order]], dtype=np.float32)
            block = np.empty_like(rows)
            block[order] = rows
            out[mask] = block
        return out
