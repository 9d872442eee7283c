"""GPU check (run on a CUDA machine): a 10-party Ray simulation with GPU fractions.

Every ClientApp actor gets `num-gpus` of the GPU (0.25: four parties share it at a time), the
central trainer runs on CUDA with bf16 autocast, and the same experiment on the CPU gives the
ratio. Writes JSON to the path given (default gpu_check.json).

    python benchmarks/gpu_check.py [out.json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from commands.simulate import simulate  # noqa: E402
from fedsmix.config import load_settings  # noqa: E402
from fedsmix.trainers import train_classifier  # noqa: E402


def simulation(device: str, num_gpus: float) -> dict:
    runs = tempfile.mkdtemp()
    overrides = {
        "preset": "configs/quickstart.yaml",
        "strategies": "mixup-union,local-only,fedprox",
        "rounds": 3,
        "device": device,
        "runs-dir": runs,
    }
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": num_gpus}, "init_args": {"include_dashboard": False}}
    t0 = time.perf_counter()
    results = simulate(overrides, num_parties=10, backend_config=backend)
    results["wall-seconds-total"] = time.perf_counter() - t0
    return results


def central_trainer_ratio() -> dict:
    """The central trainer on a CIFAR-10-sized union (random pixels: timing only), CUDA vs CPU."""
    settings = load_settings({"dataset": "cifar10", "epochs": 2, "batch-size": 128})
    x, y = torch.randn(20000, 3, 32, 32), torch.softmax(torch.randn(20000, 10), 1)
    out = {}
    for device in ("cuda", "cpu"):
        _, report = train_classifier(settings, x, y, (3, 32, 32), 10, device)
        out[device] = report.seconds
    out["cpu/cuda"] = out["cpu"] / out["cuda"]
    return out


def main() -> None:
    out_path = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_check.json")
    info = {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "nvidia-smi": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(info), flush=True)
    report = {"machine": info, "central-trainer": central_trainer_ratio()}
    print("central trainer:", report["central-trainer"], flush=True)
    for label, device, gpus in (("gpu-0.25", "auto", 0.25), ("cpu", "cpu", 0.0)):
        res = simulation(device, gpus)
        report[label] = {
            "device": res["device"],
            "wall-seconds-total": res["wall-seconds-total"],
            **{
                name: {
                    k: v
                    for k, v in r.items()
                    if k
                    in (
                        "accuracy",
                        "party0-accuracy",
                        "parties-used",
                        "parties-on-cuda",
                        "wall-seconds",
                        "train-metrics",
                        "error",
                    )
                }
                for name, r in res["strategies"].items()
            },
        }
        print(label, json.dumps(report[label])[:2000], flush=True)
    out_path.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
