"""Cut the small real slices the fast tests read (tests/data/slices/) from the full data sets.

    python tests/data/make_slices.py                  # from the tool's data dir (data-dir rules: $FEDSMIX_DATA_DIR,
                                                      # ../shared/data beside the project, ~/.cache/fedsmix/data)
    python tests/data/make_slices.py --from DIR       # from another folder holding the full archives
    python tests/data/make_slices.py --check          # cut again in memory and compare with the committed bytes

Each slice has the full archive's file name, keys, dtypes (uint8) and layout, so tests/data/slices is itself a valid
`data-dir` for the tool:

- mnist.npz, cifar10.npz: the first rows of each split, in the official order (the first test labels stay the ones
  the README names);
- tinyimagenet32.npz: the first PER_CLASS images of each of the 200 classes, in the archive's order, with its
  class names (`wnids`, `words`); the loader cuts it 80/20 like the full archive.

The sources must be the published archives (their sha256 below, as ../shared/data/README.md lists them): the
same input gives the same bytes every time (fixed zip entry times, fixed compression level).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "slices"

TRAIN_TEST = {"mnist.npz": (3000, 1000), "cifar10.npz": (1000, 250)}  # rows kept of x_train / x_test
PER_CLASS = 5  # tinyimagenet32.npz: images kept per class (200 classes, 50 each in the full archive)

SOURCES = {  # sha256 of the full archives (../shared/data/README.md)
    "mnist.npz": "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64",
    "cifar10.npz": "a44cc18e4ad961b5158c7da062a6232fb65938b615bf013046199b823b75c43d",
    "tinyimagenet32.npz": "881cc23b814882c1e0f50ef0f8e13ab103e8cb276ac7806d08a03c6ef0fc6f1e",
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cut(name: str, archive) -> dict[str, np.ndarray]:
    if name in TRAIN_TEST:
        n_train, n_test = TRAIN_TEST[name]
        return {"x_train": archive["x_train"][:n_train], "y_train": archive["y_train"][:n_train],
                "x_test": archive["x_test"][:n_test], "y_test": archive["y_test"][:n_test]}
    labels = archive["y"]
    rows = np.sort(np.concatenate([np.flatnonzero(labels == c)[:PER_CLASS] for c in np.unique(labels)]))
    return {"x": archive["x"][rows], "y": labels[rows], "wnids": archive["wnids"], "words": archive["words"]}


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """numpy.savez_compressed's layout (one .npy per key, deflated), with fixed entry times: reproducible bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for key, array in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.ascontiguousarray(array), allow_pickle=False)
            zf.writestr(info, npy.getvalue(), compresslevel=9)
    return buffer.getvalue()


def default_source() -> Path:
    sys.path.insert(0, str(HERE.parent.parent))
    from fedsmix.data import default_data_dir

    return default_data_dir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, help="folder with the full archives (default: the "
                        "tool's data dir)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the slices go (default {OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a committed slice differs")
    args = parser.parse_args(argv)
    source = args.source or default_source()
    missing = [name for name in SOURCES if not (source / name).is_file()]
    if missing:
        print(f"{source}: missing {', '.join(missing)} (the full archives; README.md, section Data, says where "
              "to get them)", file=sys.stderr)
        return 2
    for name, expected in SOURCES.items():
        if sha256(source / name) != expected:
            print(f"{source / name}: not the published archive (sha256 differs from {expected})", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    status = 0
    for name in SOURCES:
        with np.load(source / name) as archive:
            data = npz_bytes(cut(name, archive))
        target = args.out / name
        if args.check:
            same = target.is_file() and target.read_bytes() == data
            print(f"{target}: {'same bytes' if same else 'DIFFERS'}")
            status |= not same
            continue
        tmp = target.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(target)
        print(f"{target}: {len(data) / 1e6:.2f} MB, sha256 {hashlib.sha256(data).hexdigest()}")
    return status


if __name__ == "__main__":
    sys.exit(main())
