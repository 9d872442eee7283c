"""What deploy/Dockerfile installs into the SuperExec image: pyproject.toml's dependencies, with
Flower's `simulation` extra dropped (no Ray in the containers) and, when asked, torch and
torchvision replaced by other requirements (e.g. a CPU build).

    python deploy/image_requirements.py pyproject.toml [--torch "torch==2.14.1+cpu torchvision==0.29.1"]

prints one requirement a line. The Dockerfile runs it inside the image (standard library only,
Python 3.11), and deploy/containers.py runs it on the host to download the same wheels.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

TORCH_PACKAGES = ("torch", "torchvision")


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement.strip())[0].lower().replace("_", "-")


def requirements(pyproject: Path, torch: str = "") -> list[str]:
    """The image's requirements; `torch` (space-separated requirements) replaces torch and torchvision."""
    dependencies = tomllib.loads(Path(pyproject).read_text())["project"]["dependencies"]
    out = []
    for requirement in dependencies:
        name = _name(requirement)
        if torch and name in TORCH_PACKAGES:
            continue
        out.append(re.sub(r"\[[^\]]*\]", "", requirement) if name == "flwr" else requirement)
    return out + torch.split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--torch", default="", help="requirements that replace torch and torchvision")
    args = parser.parse_args(argv)
    print("\n".join(requirements(args.pyproject, args.torch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
