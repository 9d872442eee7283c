"""The compose deployment in real containers, offline: Podman's Docker API and docker-compose.

docker-compose.yml (plus docker-compose.tls.yml) is the file a Docker user runs; here it runs
against `podman system service`, with stand-ins for the images no registry can serve:

  localhost/fedsmix-debian:bookworm   Debian made by `debootstrap --variant=minbase`, imported with
                                      `podman import`; Python 3.11 in a venv at /python/venv
  localhost/fedsmix-standin/superlink, .../supernode:1.42.0
                                      deploy/Dockerfile's targets `superlink`, `supernode` on it
                                      (compose: FEDSMIX_FLWR_IMAGES=localhost/fedsmix-standin)
  fedsmix-superexec:0.1.0             deploy/Dockerfile's target `superexec`, built by
                                      `docker-compose build` with FEDSMIX_BASE_IMAGE set to the base

Every wheel comes from deploy/wheels/, filled on the host with `pip download` (the host's pip
configuration: PyPI or local mirrors), and the images build with `--no-index`. torch: a CPU wheel
when pip can find one (the pinned version's `+cpu` build, else the newest CPU wheel in pip's
find-links folders), otherwise pyproject.toml's pin (PyPI's CUDA build, about 4 GB more).

    python -m deploy.containers            # build, up, a run with a SuperNode killed mid-FedProx, down
    python -m deploy.containers --tls      # TLS, SuperNode authentication, an unregistered SuperNode refused

Needs root (rootful Podman), apt-get for the tools when they are missing, and about 4 GB of disk.
Podman's default ulimits fail in this kind of VM ("error setting rlimit type 7"): a containers.conf
of our own (CONTAINERS_CONF) sets `default_ulimits = []`, /etc stays untouched. Podman runs health
checks from systemd timers; without systemd, `HealthDriver` runs each container's own check. Every
container, volume and network of the project and the Podman service (by PID) go at the end, also
when a step fails; images stay as the cache of the next build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from commands.launch import flower_env, free_port
from deploy.image_requirements import requirements
from deploy.smoke import (
    COMPOSE,
    KILL_AT,
    REPO,
    SERVERAPP_SERVICE,
    TLS_OVERLAY,
    DeploymentError,
    SuperLinkClient,
    answers_plain_http,
    check_demo,
    demo_run,
    kill_problems,
    run_summary,
    with_parties,
)

PROJECT = "fedsmix-ct"  # compose project of the plain stack; the TLS stack's is PROJECT-tls
FLWR_VERSION = "1.42.0"
BASE_IMAGE = "localhost/fedsmix-debian:bookworm"
STANDIN = "localhost/fedsmix-standin"  # FEDSMIX_FLWR_IMAGES: stand-ins for flwr/superlink, flwr/supernode
STANDIN_TARGETS = ("superlink", "supernode")
SUPEREXEC_IMAGE = "fedsmix-superexec:0.1.0"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
WHEELS = REPO / "deploy" / "wheels"
DEBIAN = {
    "suite": "bookworm",
    "variant": "minbase",
    "include": "python3,python3-venv,ca-certificates,passwd",
    "mirror": os.environ.get("FEDSMIX_DEBIAN_MIRROR", "http://deb.debian.org/debian"),
}
TOOLS = ("podman", "debootstrap", "docker-compose")
FLOWER_UID = 49999  # the flwr/* images run as uid 49999 ("app"); so do the stand-ins
RUNS_VOLUME = "server-runs"
IMAGES_LOCK = Path("/var/tmp/fedsmix-images.lock")  # Podman's image store is the machine's: one build at a time


def _run(argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    check = kwargs.pop("check_rc", True)
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    out = subprocess.run([str(a) for a in argv], **kwargs)
    if out.returncode != 0 and check:
        raise DeploymentError(f"{' '.join(map(str, argv[:4]))} ... failed ({out.returncode}): {_tail(out)}")
    return out


def _tail(out: subprocess.CompletedProcess, chars: int = 3000) -> str:
    return ((out.stdout or "") + (out.stderr or "")).strip()[-chars:]


# ---------------------------------------------------------------------------------- tools
def ensure_tools(log: Callable[[str], None] = print) -> None:
    """The system packages (podman, debootstrap, docker-compose): deploy/system-packages.sh installs what is
    missing with apt-get, or fails naming the packages and the command that installs them."""
    if all(shutil.which(tool) for tool in TOOLS):
        return
    out = _run(["sh", str(REPO / "deploy" / "system-packages.sh")], check_rc=False, timeout=1500)
    if out.returncode != 0:
        raise DeploymentError(_tail(out))
    log(out.stdout.strip())


class Podman:
    """The podman CLI with our containers.conf, and `podman system service` started (and stopped,
    by PID) for docker-compose."""

    def __init__(self, workdir: Path, log: Callable[[str], None] = print):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "containers.conf"
        conf.write_text(
            "[containers]\n# Podman's default nofile/nproc ulimits fail in this VM (rlimit type 7)\n"
            "default_ulimits = []\n"
        )
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.socket = self.workdir / "podman.sock"
        self.service: subprocess.Popen | None = None
        self.log = log

    def __call__(self, *args, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        return _run(["podman", *args], env=self.env, timeout=timeout, check_rc=check, **kwargs)

    def json(self, *args) -> list | dict:
        return json.loads(self(*args).stdout or "null")

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 60) -> Podman:
        log = open(self.workdir / "podman-service.log", "ab")
        self.service = subprocess.Popen(
            ["podman", "system", "service", "--time", "0", self.host],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.service.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise DeploymentError(f"podman system service did not answer on {self.socket}")
            time.sleep(0.2)
        self.log(f"podman system service (pid {self.service.pid}) on {self.socket}")
        return self

    def ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(5)
                sock.connect(str(self.socket))
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
                return b"OK" in sock.recv(4096)
        except OSError:
            return False

    def stop(self, grace: float = 15) -> None:
        """Stop the service this object started, by PID (its session, should it have children)."""
        if self.service is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.service.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.service.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log(f"podman system service (pid {self.service.pid}) stopped")

    def cpu_seconds(self) -> float:
        """CPU time of the service and what it has reaped (Buildah's RUN steps under docker-compose build)."""
        if self.service is None or self.service.poll() is not None:
            return 0.0
        fields = Path(f"/proc/{self.service.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def service_alive(self) -> bool:
        return self.service is not None and self.service.poll() is None

    def __enter__(self) -> Podman:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def image_label(self, image: str, label: str) -> str | None:
        out = self("image", "inspect", "--format", "{{json .Labels}}", image, check=False)
        if out.returncode != 0:
            return None
        return (json.loads(out.stdout or "null") or {}).get(label)

    def storage_bytes(self) -> int:
        root = self("info", "--format", "{{.Store.GraphRoot}}").stdout.strip()
        out = _run(["du", "-sb", root], check_rc=False)  # a container's overlay may vanish meanwhile
        return int(out.stdout.split()[0])


# ---------------------------------------------------------------------------------- images
def base_image(podman: Podman, log: Callable[[str], None] = print) -> str:
    """localhost/fedsmix-debian:bookworm, made once per recipe (a label holds its digest)."""
    recipe = hashlib.sha256(json.dumps(DEBIAN, sort_keys=True).encode()).hexdigest()[:16]
    if podman.image_label(BASE_IMAGE, "fedsmix.recipe") == recipe:
        return BASE_IMAGE
    with tempfile.TemporaryDirectory(prefix="fedsmix-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        log(f"debootstrap {DEBIAN['suite']} ({DEBIAN['include']}) from {DEBIAN['mirror']}")
        _run(
            [
                "debootstrap",
                f"--variant={DEBIAN['variant']}",
                f"--include={DEBIAN['include']}",
                DEBIAN["suite"],
                root,
                DEBIAN["mirror"],
            ],
            timeout=900,
        )
        # The flwr/* images keep Python packages in a venv at /python/venv; so does the stand-in.
        _run(["chroot", root, "/usr/bin/python3", "-m", "venv", "/python/venv"], timeout=300)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / cache).glob("*"):
                if path.is_file():
                    path.unlink()
        changes = [
            "ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            f"LABEL fedsmix.recipe={recipe}",
            'CMD ["/bin/bash"]',
        ]
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            podman("import", *(a for c in changes for a in ("--change", c)), "-", BASE_IMAGE, stdin=tar.stdout)
        finally:
            tar.stdout.close()
            tar.wait()
    return BASE_IMAGE


def _find_links() -> list[Path]:
    """Folders in pip's find-links (its configuration and PIP_FIND_LINKS)."""
    out = _run([sys.executable, "-m", "pip", "config", "list"], check_rc=False)
    folders = []
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += [Path(v) for v in value.strip().strip("'\"").split() if not v.startswith("http")]
    return [f for f in folders if f.is_dir()]


def _pinned(name: str) -> str | None:
    pins = [r for r in requirements(REPO / "pyproject.toml") if re.match(rf"{name}\s*==", r)]
    return pins[0].split("==", 1)[1].strip() if pins else None


def choose_torch(log: Callable[[str], None] = print) -> str:
    """Requirements that replace torch and torchvision in the image ('' keeps pyproject's pins).

    FEDSMIX_TORCH wins. Else a CPU build: the pinned version's `+cpu` wheel where pip finds one
    (PyTorch's CPU index configured), else the newest `+cpu` wheel in pip's find-links folders with
    the torchvision release that requires it; else the pins (PyPI's CUDA build)."""
    if "FEDSMIX_TORCH" in os.environ:
        return os.environ["FEDSMIX_TORCH"]
    torch, vision = _pinned("torch"), _pinned("torchvision")
    with tempfile.TemporaryDirectory() as tmp:
        probe = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp]
        if torch and _run([*probe, f"torch=={torch}+cpu"], check_rc=False, timeout=600).returncode == 0:
            return f"torch=={torch}+cpu torchvision=={vision}"
    wheels = sorted(
        (w for folder in _find_links() for w in folder.glob("torch-*+cpu-cp311-*.whl")),
        key=lambda w: tuple(int(x) for x in re.findall(r"\d+", w.name.split("-")[1].split("+")[0])),
    )
    if wheels:
        version = wheels[-1].name.split("-")[1]
        log(f"torch: no CPU build of torch=={torch} found; using {wheels[-1]}")
        return f"torch=={version} torchvision"
    log(f"torch: no CPU wheel found; the image takes torch=={torch} from PyPI (the CUDA build, ~4 GB more)")
    return ""


def download_wheels(torch: str, log: Callable[[str], None] = print) -> str:
    """Fill deploy/wheels with every wheel the images install; returns the torch requirements with
    torchvision pinned to the downloaded release. Skipped when the same list was downloaded before."""
    wanted = [f"flwr=={FLWR_VERSION}", *requirements(REPO / "pyproject.toml", torch)]
    stamp = WHEELS / ".requirements"
    if not (stamp.exists() and stamp.read_text() == "\n".join(wanted)):
        log(f"pip download: {len(wanted)} requirements into {WHEELS}")
        listing = WHEELS / ".requirements.in"
        listing.write_text("\n".join(wanted) + "\n")
        _run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", WHEELS, "-r", listing],
            timeout=1800,
        )
        stamp.write_text("\n".join(wanted))
    if torch and re.search(r"(^|\s)torchvision(\s|$)", torch):  # pin the release that fits this torch
        vision = _torchvision_for(re.search(r"torch==(\S+)", torch)[1])
        if vision:
            torch = re.sub(r"(^|\s)torchvision(\s|$)", rf"\1torchvision=={vision}\2", torch)
    return torch


def _torchvision_for(torch_version: str) -> str | None:
    """The newest torchvision in deploy/wheels whose torch requirement admits `torch_version`."""
    import zipfile

    from packaging.requirements import Requirement
    from packaging.version import Version

    def version(wheel: Path) -> Version:
        return Version(wheel.name.split("-")[1])

    for wheel in sorted(WHEELS.glob("torchvision-*.whl"), key=version, reverse=True):
        with zipfile.ZipFile(wheel) as archive:
            meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            lines = archive.read(meta).decode().splitlines()
        needs = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist: torch")]
        needs = [r for r in needs if r.name == "torch" and r.marker is None]
        if all(r.specifier.contains(torch_version, prereleases=True) for r in needs):
            return str(version(wheel))
    return None


def compose_env(
    podman: Podman, torch: str, port: int | None = None, certs: Path | None = None, volumes: str | None = None
) -> dict[str, str]:
    """Environment for docker-compose: Podman's socket, the local base and stand-ins, offline builds;
    `volumes` names the volumes (`<volumes>-server-runs`, ...) instead of the file's `fedsmix`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}  # Debian's python
    env.update(
        DOCKER_HOST=podman.host,
        COMPOSE_DOCKER_CLI_BUILD="0",  # build through the API (Podman's Buildah), not a docker CLI
        DOCKER_BUILDKIT="0",
        FEDSMIX_BASE_IMAGE=BASE_IMAGE,
        FEDSMIX_FLWR_IMAGES=STANDIN,
        FEDSMIX_PIP_ARGS="--no-index",
        FEDSMIX_TORCH_INDEX="",
        FEDSMIX_TORCH=torch,
    )
    if port is not None:
        env["FEDSMIX_SUPERLINK_PORT"] = str(port)
    if certs is not None:
        env["FEDSMIX_CERTS"] = str(certs)
    if volumes is not None:
        env["FEDSMIX_VOLUME_PREFIX"] = volumes
    return env


def build_images(podman: Podman, torch: str, log: Callable[[str], None] = print) -> dict[str, float]:
    """The stand-ins (podman build) and the SuperExec image (docker-compose build), all from
    deploy/Dockerfile on the Debian base; seconds per image. `--format docker` is what Podman's
    Docker API builds, so both share Buildah's layer cache (the `flower` stage is built once)."""
    seconds = {}
    args = {"BASE_IMAGE": BASE_IMAGE, "PIP_ARGS": "--no-index", "TORCH_INDEX": "", "TORCH": torch}
    build_args = [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
    for target in STANDIN_TARGETS:
        t0 = time.monotonic()
        tag = f"{STANDIN}/{target}:{FLWR_VERSION}"
        podman(
            "build",
            "--format",
            "docker",
            "-f",
            DOCKERFILE,
            "--target",
            target,
            *build_args,
            "-t",
            tag,
            REPO,
            timeout=1800,
        )
        seconds[tag] = round(time.monotonic() - t0, 1)
        log(f"built {tag} in {seconds[tag]} s")
    t0 = time.monotonic()
    _run(
        ["docker-compose", "-p", PROJECT, "-f", COMPOSE, "build", SERVERAPP_SERVICE],
        env=compose_env(podman, torch),
        cwd=REPO,
        timeout=1800,
    )
    seconds[SUPEREXEC_IMAGE] = round(time.monotonic() - t0, 1)
    log(f"built {SUPEREXEC_IMAGE} in {seconds[SUPEREXEC_IMAGE]} s")
    return seconds


def image_sizes(podman: Podman) -> dict[str, int]:
    names = [BASE_IMAGE, *(f"{STANDIN}/{t}:{FLWR_VERSION}" for t in STANDIN_TARGETS), SUPEREXEC_IMAGE]
    return {name: int(podman("image", "inspect", "--format", "{{.Size}}", name).stdout.strip()) for name in names}


def _cpu(podman: Podman) -> float:
    """CPU seconds of this process's reaped children (debootstrap, pip, podman build) and of the
    Podman service's work: unlike wall time, independent of what else runs on the machine."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime + podman.cpu_seconds()


def prepare_images(podman: Podman, log: Callable[[str], None] = print) -> dict:
    """Base image, wheels and the three images; what it took (seconds, CPU seconds, bytes). Two
    processes at once (`python -m deploy.containers` and `--tls` in two shells) take turns: the
    second finds the first one's images and wheels and builds nothing."""
    import fcntl

    t0, c0 = time.monotonic(), _cpu(podman)
    with open(IMAGES_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        base = base_image(podman, log)
        t_base, c_base = time.monotonic(), _cpu(podman)
        torch = download_wheels(choose_torch(log), log)
        t_wheels, c_wheels = time.monotonic(), _cpu(podman)
        builds = build_images(podman, torch, log)
    return {
        "base-image": base,
        "torch": torch,  # '' : pyproject.toml's pins
        "seconds": {
            "waited-for-another-build": waited,
            "base-image": round(t_base - t0, 1),
            "wheels": round(t_wheels - t_base, 1),
            "builds": builds,
            "total": round(time.monotonic() - t0, 1),
        },
        "cpu-seconds": {
            "base-image": round(c_base - c0, 1),
            "wheels": round(c_wheels - c_base, 1),
            "builds": round(_cpu(podman) - c_wheels, 1),
        },
        "load-average": [round(x, 1) for x in os.getloadavg()],
        "wheels-bytes": sum(p.stat().st_size for p in WHEELS.glob("*.whl")),
        "image-bytes": image_sizes(podman),
    }


# ----------------------------------------------------------------------------------- health
class HealthDriver(threading.Thread):
    """Podman schedules health checks with systemd timers; without systemd nothing runs them and
    every container stays "starting". This runs each project container's own check (`podman
    healthcheck run`, the compose file's test inside the container) every `interval` seconds
    while it is not healthy, as the timer would."""

    def __init__(self, podman: Podman, project: str, interval: float = 2.0):
        super().__init__(daemon=True)
        self.podman, self.project, self.interval = podman, project, interval
        self.done = threading.Event()

    @staticmethod
    def needed() -> bool:
        return not Path("/run/systemd/private").exists()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            out = self.podman(
                "ps",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--format",
                "{{.Names}} {{.Status}}",
                check=False,
                timeout=60,
            )
            for line in out.stdout.splitlines():
                name, _, status = line.partition(" ")
                if "(starting)" in status or "(unhealthy)" in status:
                    self.podman("healthcheck", "run", name, check=False, timeout=60)

    def __enter__(self) -> HealthDriver:
        if self.needed():
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.is_alive():
            self.join(timeout=120)


# ------------------------------------------------------------------------------------ stack
def _bytes(size: str) -> int:
    number, unit = re.fullmatch(r"([\d.]+)\s*([kmgKMG]?)[bB]?", str(size)).groups()
    return int(float(number) * 1024 ** " KMG".index(unit.upper() or " "))


class Stack(SuperLinkClient):
    """The compose project on Podman: up (waiting for health checks and SuperNodes), the flwr CLI
    on the published port, checks, down. `parties` beyond the file's two come from an overlay that
    copies the last party's services and volume (the edit docs/deployment.md describes)."""

    def __init__(
        self,
        podman: Podman,
        torch: str,
        tls: bool = False,
        parties: int = 2,
        workdir: Path | None = None,
        log: Callable[[str], None] = print,
        up_timeout: float = 300,
        project: str = PROJECT,
    ):
        from deploy.make_certs import make_deployment_certs

        self.podman, self.tls, self.parties, self.log = podman, tls, parties, log
        self.project = project  # also the volumes' prefix: never a user's `fedsmix-*` volumes
        self.up_timeout = up_timeout
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fedsmix-stack-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.files = [COMPOSE, *([TLS_OVERLAY] if tls else [])]
        self.certs = None
        if tls:
            self.certs = make_deployment_certs(self.workdir / "certs", parties)
            _chown(self.certs, FLOWER_UID)  # the containers run as uid 49999
        self.env = compose_env(podman, torch, self.port, self.certs, volumes=project)
        if parties != 2:
            self.files.append(self._party_overlay())
        self.config = yaml.safe_load(self.compose("config").stdout)
        self.services = self.config["services"]
        self.killed: set[str] = set()

    # -- compose
    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        files = [a for f in self.files for a in ("-f", str(f))]
        argv = ["docker-compose", "--compatibility", "-p", self.project, *files, *args]
        return _run(argv, env=self.env, cwd=REPO, timeout=timeout, check_rc=check)

    def _party_overlay(self) -> Path:
        if self.tls:
            raise DeploymentError("the TLS stack runs the files' two parties (certificates are made for them)")
        raw = yaml.safe_load(COMPOSE.read_text())["services"]  # variables stay: compose substitutes them
        grown = with_parties(raw, self.parties)
        services = {n: s for n, s in grown.items() if n not in raw}
        services.update({n: {"command": grown[n]["command"]} for n in raw if n.startswith("supernode-")})
        volumes = {
            f"party-{i}-data": {"name": f"${{FEDSMIX_VOLUME_PREFIX:-fedsmix}}-party-{i}-data"}
            for i in range(2, self.parties)
        }
        overlay = self.workdir / f"parties-{self.parties}.yml"
        overlay.write_text(yaml.safe_dump({"services": services, "volumes": volumes}, sort_keys=False))
        return overlay

    def oneshots(self) -> set[str]:
        return {
            d
            for s in self.services.values()
            for d, c in (s.get("depends_on") or {}).items()
            if c.get("condition") == "service_completed_successfully"
        }

    def long_running(self) -> list[str]:
        return [n for n in self.services if n not in self.oneshots()]

    def containers(self) -> dict[str, dict]:
        """service -> `podman ps` entry, for this project's containers (running or not)."""
        rows = (
            self.podman.json(
                "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}", "--format", "json"
            )
            or []
        )
        return {row["Labels"]["com.docker.compose.service"]: row for row in rows}

    def container(self, service: str) -> str:
        return self.containers()[service]["Names"][0]

    def inspect(self, service: str) -> dict:
        return self.podman.json("inspect", self.container(service))[0]

    def health(self, service: str) -> str:
        return ((self.inspect(service)["State"].get("Health") or {}).get("Status")) or "none"

    def cpu_seconds(self) -> float:
        """CPU time the project's running containers have used (their cgroups' accounting)."""
        total = 0.0
        for row in self.containers().values():
            path = self.podman.json("inspect", row["Id"])[0]["State"].get("CgroupPath") or ""
            v1, v2 = Path(f"/sys/fs/cgroup/cpuacct{path}/cpuacct.usage"), Path(f"/sys/fs/cgroup{path}/cpu.stat")
            if path and v1.exists():
                total += int(v1.read_text()) / 1e9
            elif path and v2.exists():
                total += int(re.search(r"usage_usec (\d+)", v2.read_text())[1]) / 1e6
        return round(total, 1)

    # -- lifecycle
    def start(self, timeout: float | None = None) -> Stack:
        timeout = timeout or self.up_timeout
        t0 = time.monotonic()
        with HealthDriver(self.podman, self.project):
            self.compose("up", "-d", "--no-build", timeout=timeout)
            deadline = time.monotonic() + timeout
            while waiting := [n for n in self.long_running() if self.health(n) != "healthy"]:
                if time.monotonic() > deadline:
                    raise DeploymentError(f"not healthy after {timeout:.0f}s: {waiting}\n{self.logs(*waiting)}")
                time.sleep(1.0)
        self.wait_online(self.parties)
        self.up_seconds = round(time.monotonic() - t0, 1)
        self.log(
            f"stack up in {self.up_seconds} s: {len(self.containers())} containers, "
            f"{self.parties} parties, {'TLS' if self.tls else 'insecure'}, SuperLink on 127.0.0.1:{self.port}"
        )
        return self

    def logs(self, *services: str, lines: int = 30) -> str:
        return _tail(self.compose("logs", "--no-color", "--tail", str(lines), *services, check=False), 6000)

    def kill(self, service: str) -> None:
        """`docker-compose kill` (SIGKILL), as an operator or a crash would."""
        self.compose("kill", service)
        self.killed.add(service)
        self.log(f"killed {service}")

    def stop(self) -> list[str]:
        """`docker-compose down -v`, then whatever of the project is left removed by force; returns
        what was left over (an empty list when compose removed everything)."""
        self.compose("down", "-v", "--remove-orphans", "-t", "5", check=False)
        leftovers = self.leftovers()
        for name in leftovers:
            kind, _, ident = name.partition(" ")
            self.podman(kind, "rm", "-f", ident, check=False)
        return leftovers

    def leftovers(self) -> list[str]:
        names = [f"container {c['Names'][0]}" for c in self.containers().values()]
        volumes = {v.get("name") for v in (self.config.get("volumes") or {}).values()}
        names += [
            f"volume {v}" for v in self.podman("volume", "ls", "--format", "{{.Name}}").stdout.split() if v in volumes
        ]
        names += [
            f"network {n}"
            for n in self.podman("network", "ls", "--format", "{{.Name}}").stdout.split()
            if n == f"{self.project}_default"
        ]
        return names

    # -- the flwr CLI on the host
    def cli_env(self) -> dict[str, str]:
        ca = str(self.certs / "ca.crt") if self.tls else None
        return self.with_connection(flower_env(self.workdir / "flwr-home"), f"127.0.0.1:{self.port}", ca)

    def volume_path(self, volume: str) -> Path:
        name = self.config["volumes"][volume].get("name", f"{self.project}_{volume}")
        return Path(self.podman("volume", "inspect", "--format", "{{.Mountpoint}}", name).stdout.strip())

    def results(self, config: dict) -> dict:
        """results.json of the newest run, read from the runs volume on this machine; `run-dir`
        becomes the folder here."""
        runs = self.volume_path(RUNS_VOLUME)
        path = runs / "latest" / "results.json"
        if not path.exists():
            raise DeploymentError(f"no results at {path} (the volume {RUNS_VOLUME})\n{self.logs(SERVERAPP_SERVICE)}")
        results = json.loads(path.read_text())
        inside = Path(results["run-dir"]).relative_to(config["runs-dir"])
        return {**results, "run-dir": str(runs / inside)}


def _chown(folder: Path, uid: int) -> None:
    for path in [folder, *folder.iterdir()]:
        os.chown(path, uid, uid)


# ----------------------------------------------------------------------------------- checks
def health_checks(stack: Stack) -> list[str]:
    """Every running service reported healthy, and its own check passes now (`podman healthcheck run`)."""
    problems = []
    for name in stack.long_running():
        if name in stack.killed:
            continue
        for _ in range(3):  # as podman's own retries: a check that cannot start in its 5 s on a loaded machine
            rerun = stack.podman("healthcheck", "run", stack.container(name), check=False, timeout=60)
            if rerun.returncode == 0 or "exceeded timeout" not in _tail(rerun, 300):
                break
        status = stack.health(name)
        if status != "healthy" or rerun.returncode != 0:
            problems.append(f"{name}: health {status}, check now: {_tail(rerun, 300) or rerun.returncode}")
    url = f"{'https' if stack.tls else 'http'}://127.0.0.1:{stack.port}/health"
    try:  # the SuperLink reported healthy answers on the published port
        context = None
        if stack.tls:
            import ssl

            context = ssl.create_default_context(cafile=str(stack.certs / "ca.crt"))
        urllib.request.urlopen(url, timeout=10, context=context)
    except OSError as err:
        problems.append(f"{url}: {err}")
    if stack.tls and answers_plain_http(stack.port):
        problems.append("the SuperLink answered plain HTTP on its published port")
    return problems


def limit_checks(stack: Stack) -> list[str]:
    """`--compatibility` turned deploy.resources.limits into the containers' CPU and memory limits."""
    problems = []
    for name in stack.long_running():
        limits = ((stack.services[name].get("deploy") or {}).get("resources") or {}).get("limits") or {}
        host = stack.inspect(name)["HostConfig"]
        want = {"NanoCpus": int(float(limits.get("cpus", 0)) * 1e9), "Memory": _bytes(limits.get("memory", "0"))}
        got = {key: host.get(key) for key in want}
        if not limits or got != want:
            problems.append(f"{name}: limits {limits} -> podman inspect {got}, expected {want}")
    return problems


def mount_checks(stack: Stack) -> list[str]:
    """Party i's data volume is mounted read-only at /data only where party i's ClientApps run."""
    problems = []
    for name in stack.long_running():
        mounts = {m.get("Name"): m for m in stack.inspect(name)["Mounts"] if m.get("Type") == "volume"}
        for i in range(stack.parties):
            volume = stack.config["volumes"][f"party-{i}-data"]["name"]
            if name == f"superexec-clientapp-{i}":
                m = mounts.get(volume)
                if m is None or m["Destination"] != "/data" or m["RW"]:
                    problems.append(f"{name}: {volume} mounted as {m}")
            elif volume in mounts:
                problems.append(f"{name} mounts {volume}, party {i}'s data")
    return problems


def unregistered_supernode(stack: Stack, timeout: float = 180) -> list[str]:
    """A SuperNode container with a key nobody registered is refused and exits."""
    from deploy.make_certs import authentication_key

    spec = stack.services["supernode-0"]
    keys = stack.workdir / "unregistered"
    keys.mkdir(exist_ok=True)
    authentication_key(keys / "auth-key", comment="unregistered")
    _chown(keys, FLOWER_UID)
    command = [str(a) for a in spec["command"]]
    key_path = command[command.index("--auth-supernode-private-key") + 1]
    mounts = [f"{v['source']}:{v['target']}:ro" if isinstance(v, dict) else v for v in spec["volumes"]]
    mounts = [v for v in mounts if v.split(":")[1] != key_path] + [f"{keys / 'auth-key'}:{key_path}:ro"]
    name = f"{stack.project}_unregistered-supernode"
    stack.podman("rm", "-f", name, check=False)
    stack.podman(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        f"{stack.project}_default",
        "--label",
        f"com.docker.compose.project={stack.project}",
        "--label",
        "com.docker.compose.service=unregistered",
        *(a for m in mounts for a in ("-v", m)),
        spec["image"],
        *command,
    )
    try:
        code = stack.podman("wait", name, timeout=timeout).stdout.strip()
    except subprocess.TimeoutExpired:
        code = None
    logs = _tail(stack.podman("logs", name, check=False), 4000)
    stack.podman("rm", "-f", name, check=False)
    stack.unregistered_log = logs
    if code is None:
        return [f"an unregistered SuperNode was still running after {timeout:.0f}s:\n{logs}"]
    if code == "0" or "Failed to activate" not in logs:
        return [f"an unregistered SuperNode exited with {code}:\n{logs}"]
    return []


# ------------------------------------------------------------------------------------- demo
def demo(
    podman: Podman, torch: str, tls: bool = False, workdir: Path | None = None, log: Callable[[str], None] = print
) -> dict:
    """Bring the stack up, run, check, tear down. In the clear: three parties, the demo's
    strategies with party 2's SuperNode container killed when FedProx's round 2 starts. Over TLS:
    the file's two parties, the demo run, and an unregistered SuperNode refused. The two stacks
    are separate compose projects with volumes of their own: they can run at the same time."""
    t0 = time.monotonic()
    parties = 2 if tls else 3
    project = f"{PROJECT}-tls" if tls else PROJECT
    stack = Stack(podman, torch, tls=tls, parties=parties, workdir=workdir, log=log, project=project)
    config, victim = demo_run(tls, parties)
    with stack:
        kill, killed = stack.kill_when(victim, KILL_AT) if victim else (None, {})
        stream = open(stack.workdir / "flwr-run.log", "w")  # the stream, each line with its time

        def on_line(line: str) -> None:
            stream.write(f"{time.strftime('%H:%M:%S')} {line}")
            stream.flush()
            if kill:
                kill(line)

        try:
            run = stack.flwr_run(config, timeout=900, on_line=on_line)
        finally:
            stream.close()
        if not run.ok:
            raise DeploymentError(f"run {run.run_id}: {run.status} {run.details}\n{run.output[-3000:]}\n{stack.logs()}")
        results = stack.results(config)
        runs_volume = stack.volume_path(RUNS_VOLUME)
        problems = check_demo(results, parties, runs_volume, frozenset({parties - 1}) if victim else frozenset())
        running = victim is not None and stack.containers()[victim]["State"] == "running"  # restart policy?
        problems += kill_problems(victim, killed, running)
        problems += health_checks(stack) + limit_checks(stack) + mount_checks(stack)
        if tls:
            problems += unregistered_supernode(stack)
            oneshot = stack.containers()["register-supernodes"]
            registered = _tail(stack.podman("logs", oneshot["Names"][0], check=False))
            if oneshot["ExitCode"] != 0 or registered.count("register-supernodes: supernode-") != parties:
                problems.append(f"register-supernodes exited {oneshot['ExitCode']}: {registered}")
        cpu = stack.cpu_seconds()  # the killed SuperNode's share is gone with its cgroup
        load = os.getloadavg()
    leftovers = stack.leftovers()
    return {
        **run_summary(tls, parties, run, results),
        "dropped": results["strategies"].get("fedprox", {}).get("dropped"),
        "killed-at": killed.get("at") if killed else None,
        "up-seconds": stack.up_seconds,
        "wall-seconds": round(time.monotonic() - t0, 1),
        "container-cpu-seconds": cpu,
        "load-average": [round(x, 1) for x in load],
        "runs-volume": str(runs_volume),
        "workdir": str(stack.workdir),  # logs, certificates, the flwr CLI's FLWR_HOME
        "leftovers": leftovers,
        "problems": problems,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tls", action="store_true", help="add docker-compose.tls.yml")
    parser.add_argument("--workdir", type=Path, help="keep the Podman socket, certificates and homes here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedsmix-containers-"))
    try:
        ensure_tools()
        with Podman(workdir) as podman:
            images = prepare_images(podman)
            summary = demo(podman, images["torch"], tls=args.tls, workdir=workdir / "stack")
    except DeploymentError as err:
        print(f"containers: FAILED: {err}", file=sys.stderr)
        return 1
    summary.pop("results")
    print(json.dumps({"images": images, **summary}, indent=2))
    return 0 if not summary["problems"] and not summary["leftovers"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
