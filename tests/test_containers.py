"""The compose demo in real containers (deploy/containers.py): Podman's Docker API and Debian's
docker-compose run docker-compose.yml and docker-compose.tls.yml with images built offline from
deploy/Dockerfile on a debootstrapped Debian base. Needs root; installs podman and debootstrap
when missing. The images are built once for both stacks and stay cached in Podman's storage; the
two stacks (separate compose projects and volumes) then run at the same time.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from deploy import containers
from deploy.containers import Podman, Stack, demo, ensure_tools, prepare_images
from deploy.image_requirements import requirements
from deploy.smoke import FAULT_RUN, KILL_ROUND, DeploymentError

REPO = Path(__file__).resolve().parent.parent
PRIORITY = 5  # nice -5 for the container file's work


def _print(title: str, data: dict) -> None:
    print(f"\n{title}: {json.dumps(data, default=str)}")


# ------------------------------------------------------------------------------ fast, no Podman
def test_image_requirements_drop_ray_and_can_swap_torch():
    pinned = requirements(REPO / "pyproject.toml")
    assert "flwr==1.42.*" in pinned and not any("simulation" in r for r in pinned)
    assert "torch==2.14.1" in pinned and "torchvision==0.29.1" in pinned
    swapped = requirements(REPO / "pyproject.toml", "torch==2.13.0+cpu torchvision==0.28.0")
    assert [r for r in swapped if r.startswith("torch")] == [
        "torchmetrics>=1.4",
        "torchsummary==1.5.1",
        "torch==2.13.0+cpu",
        "torchvision==0.28.0",
    ]
    assert len(swapped) == len(pinned)


def test_a_third_party_overlay_copies_party_one(tmp_path):
    stack = Stack(Podman(tmp_path), torch="", parties=3, workdir=tmp_path)  # starts nothing: `compose config` only
    services = stack.services
    assert {"supernode-2", "superexec-clientapp-2"} <= set(services)
    command = services["supernode-2"]["command"]
    assert "partition-id=2 num-partitions=3 data-dir='/data'" in command
    assert all("num-partitions=3" in " ".join(services[f"supernode-{i}"]["command"]) for i in range(3))
    assert "supernode-2:9094" in services["superexec-clientapp-2"]["command"]
    assert "party-2-data:/data:ro" in services["superexec-clientapp-2"]["volumes"]
    assert stack.config["volumes"]["party-2-data"]["name"] == "fedsmix-ct-party-2-data"  # never a user's volumes
    assert services["superexec-clientapp-2"]["build"]["args"]["BASE_IMAGE"] == containers.BASE_IMAGE
    assert services["supernode-2"]["image"] == f"{containers.STANDIN}/supernode:1.42.0"
    assert services["superlink"]["ports"][0]["published"] in (stack.port, str(stack.port))


def test_torchvision_is_pinned_to_the_release_that_admits_the_chosen_torch(tmp_path, monkeypatch):
    import zipfile

    for version, needs in (("0.28.0", "torch (==2.13.0)"), ("0.29.1", "torch (>=2.14.0)")):
        with zipfile.ZipFile(tmp_path / f"torchvision-{version}-cp311-cp311-manylinux_2_28_x86_64.whl", "w") as wheel:
            wheel.writestr(f"torchvision-{version}.dist-info/METADATA", f"Name: torchvision\nRequires-Dist: {needs}\n")
    monkeypatch.setattr(containers, "WHEELS", tmp_path)
    assert containers._torchvision_for("2.13.0+cpu") == "0.28.0"
    assert containers._torchvision_for("2.14.1") == "0.29.1"
    assert containers._torchvision_for("2.12.0") is None


def test_compose_limits_parse_to_what_podman_reports():
    assert containers._bytes("512M") == 512 * 2**20 and containers._bytes("4G") == 4 * 2**30
    assert containers._bytes("1073741824") == 2**30


# ----------------------------------------------------------------------------- slow, Podman
@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the container test needs root (rootful Podman); CI runs as root")
    ensure_tools()
    # This file is the suite's critical path: its cold image build runs while the other workers share the same two
    # cores (the stacks run afterwards, alone: marker `containers`). It and everything it starts (the Podman
    # service, builds, containers) run at a higher priority (root may lower the nice value), and the worker returns
    # to normal afterwards.
    os.nice(-PRIORITY)
    try:
        with Podman(tmp_path_factory.mktemp("podman")) as service:
            yield service
    finally:
        os.nice(PRIORITY)
    assert not service.service_alive()
    sockets = subprocess.run(["pgrep", "-f", str(service.socket)], capture_output=True, text=True).stdout.split()
    assert sockets == [], f"podman service for {service.socket} still running: {sockets}"


@pytest.fixture(scope="module")
def images(podman):
    info = prepare_images(podman)
    info["storage-bytes"] = podman.storage_bytes()
    _print("images", info)
    return info


@pytest.fixture(scope="module")
def stacks(podman, images, tmp_path_factory) -> dict[str, Future]:
    """deploy.containers.demo for both stacks at once (up, run, their checks, down), each in a
    thread; a stack's test reads its own future, so one stack's failure is reported in its test."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return {
            name: pool.submit(
                demo,
                podman,
                images["torch"],
                tls=name == "tls",
                workdir=tmp_path_factory.mktemp(f"stack-{name}"),
                log=lambda message, name=name: print(f"[{name}] {message}", flush=True),
            )
            for name in ("plain", "tls")
        }


@pytest.mark.slow
@pytest.mark.sim
@pytest.mark.timeout(2400)
def test_the_images_build_offline_on_the_debian_base(images):
    """The cold build (a debootstrapped base, the wheels, the stand-ins and the SuperExec image): `make test` runs
    it with the rest of the suite, so that the demos below, run after it and alone, find their images built."""
    assert set(images["image-bytes"]) == {containers.BASE_IMAGE, containers.SUPEREXEC_IMAGE,
                                          *(f"{containers.STANDIN}/{t}:{containers.FLWR_VERSION}"
                                            for t in containers.STANDIN_TARGETS)}
    assert all(size > 0 for size in images["image-bytes"].values())
    assert images["wheels-bytes"] > 0


def _demo(stacks: dict[str, Future], name: str) -> dict:
    summary = stacks[name].result()
    _print(f"{name} stack", {k: v for k, v in summary.items() if k != "results"})
    assert summary["status"] == "finished:completed"
    assert summary["problems"] == []
    assert summary["leftovers"] == []
    # check_demo read results.json and the upload store from the runs volume while it existed;
    # `docker-compose down -v` has removed it since
    assert summary["results"]["run-dir"].startswith(summary["runs-volume"] + "/")
    assert not Path(summary["runs-volume"]).exists()
    return summary


@pytest.mark.slow
@pytest.mark.sim
@pytest.mark.containers
@pytest.mark.timeout(2400)
def test_plain_stack_runs_the_demo_and_survives_a_killed_supernode(stacks):
    summary = _demo(stacks, "plain")
    strategies = summary["results"]["strategies"]
    assert set(strategies["mixup-union"]["parties"]) == {"0", "1", "2"}
    prox = strategies["fedprox"]
    assert [p["round"] for p in prox["curve"]] == list(range(FAULT_RUN["rounds"] + 1))
    first = prox["dropped"][0]
    assert {d["party"] for d in prox["dropped"]} == {2} and first["round"] == KILL_ROUND
    assert "Node Unavailable" in first["reason"]
    dropped_at = dt.datetime.strptime(first["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert dropped_at.timestamp() >= int(summary["killed-at"])


@pytest.mark.slow
@pytest.mark.sim
@pytest.mark.containers
@pytest.mark.timeout(2400)
def test_tls_stack_runs_the_demo_and_refuses_an_unregistered_supernode(stacks):
    summary = _demo(stacks, "tls")
    assert summary["dropped"] in (None, [])
    assert summary["runs-volume"] != stacks["plain"].result()["runs-volume"]  # two projects, two volumes
    connection = (Path(summary["workdir"]) / "flwr-home" / "config.toml").read_text()
    assert "root-certificates" in connection and "insecure" not in connection  # what `flwr run` used: the CA


@pytest.mark.slow
@pytest.mark.sim
@pytest.mark.containers
@pytest.mark.timeout(2400)
def test_a_stack_that_fails_to_come_up_leaves_nothing_behind(podman, images, tmp_path):
    stack = Stack(podman, images["torch"], workdir=tmp_path, up_timeout=3)
    with pytest.raises((DeploymentError, subprocess.TimeoutExpired)):
        with stack:
            pass
    assert stack.leftovers() == []
    assert stack.containers() == {}
