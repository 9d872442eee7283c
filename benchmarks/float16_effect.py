"""float16 vs float32 uploads: test accuracy, bytes, and what the in-run attackers recover.

Same seed, same parties (MNIST, 2 parties of a 6,000-image subset, tau = 1): the float16 run
uploads the float32 encodings rounded, so any difference is the rounding's. The in-run adversary
(oracle-replayed W and radius, checked against the stored upload) attacks 200 victims per party.

    .venv/bin/python benchmarks/float16_effect.py
"""

from __future__ import annotations

from common import DATA_DIR, PROJECT, write

from commands.simulate import simulate


def main() -> None:
    out = {}
    for dtype in ("float32", "float16"):
        results = simulate({
            "preset": "configs/quickstart.yaml", "dataset": "mnist", "model": "cnn", "train-subset": 6000,
            "strategies": "mixup-union", "epochs": 4, "tau": 1.0, "upload-dtype": dtype,
            "adversary": "linear,mmse", "attack-victims": 200,
            "data-dir": DATA_DIR, "runs-dir": str(PROJECT / "benchmarks" / "runs"), "run-name": "float16-effect",
        }, num_parties=2)
        mix = results["strategies"]["mixup-union"]
        pooled = mix["adversary"]["pooled"]
        out[dtype] = {
            "accuracy": mix["accuracy"],
            "bytes-up-per-party": mix["mean-bytes-up-per-party"],
            "trivial-snr-db": pooled["trivial"]["snr_mean"],
            "attacks": {
                name: {
                    "snr-db": a["score"]["snr_mean"],
                    "gain-snr-db": a["gain"]["snr_db"],
                    "ssim": a["score"]["ssim_mean"],
                }
                for name, a in pooled["attacks"].items()
            },
        }
        print(dtype, out[dtype], flush=True)
    out["difference (float16 - float32)"] = {
        "accuracy": out["float16"]["accuracy"] - out["float32"]["accuracy"],
        **{
            f"{name} snr-db": out["float16"]["attacks"][name]["snr-db"] - out["float32"]["attacks"][name]["snr-db"]
            for name in out["float32"]["attacks"]
        },
    }
    write("float16_effect", {"command": "benchmarks/float16_effect.py", **out})


if __name__ == "__main__":
    main()
