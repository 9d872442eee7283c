"""Deployment: the compose files, their flags against the installed Flower, and the smoke test on
Flower's real deployment runtime (native SuperLink, SuperNodes, SuperExecs): in the clear with
three parties and a SuperNode killed mid-FedProx, over TLS with SuperNode authentication, and a
run that falls below min-parties.

No Docker engine runs here: `docker-compose config` validates the files (Debian's docker-compose,
which deploy/system-packages.sh installs) and deploy/smoke.py runs the services' own command lines natively.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from commands.launch import config_arg
from deploy import make_certs
from deploy.smoke import (
    COMPOSE,
    DEMO_RUN_CONFIG,
    FAULT_RUN,
    KILL_AT,
    KILL_ROUND,
    REPO,
    TLS_OVERLAY,
    Deployment,
    DeploymentError,
    connection_toml,
    load_services,
    party_indices,
    smoke,
    with_parties,
)

STACKS = {"insecure": [COMPOSE], "tls": [COMPOSE, TLS_OVERLAY]}


def compose_config(files: list[Path]) -> dict:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed: `make test` installs it (deploy/system-packages.sh)")
    args = [arg for path in files for arg in ("-f", str(path))]
    env = {  # Debian's python runs it; FEDSMIX_* unset: the files as a Docker user reads them
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("FEDSMIX_")
    }
    out = subprocess.run(["docker-compose", *args, "config"], cwd=REPO, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


# ------------------------------------------------------------------------- compose, fast
@pytest.mark.parametrize("stack", STACKS)
def test_compose_files_validate_and_the_smoke_test_reads_them_as_compose_does(stack):
    resolved = compose_config(STACKS[stack])["services"]
    ours = load_services(STACKS[stack])
    assert set(ours) == set(resolved)
    for name, spec in resolved.items():
        assert [str(a) for a in ours[name].get("command", [])] == [str(a) for a in spec.get("command", [])], name
        assert ours[name].get("healthcheck", {}).get("test") == spec.get("healthcheck", {}).get("test"), name
        assert ours[name].get("depends_on", {}) == {k: v["condition"] for k, v in spec.get("depends_on", {}).items()}, (
            name
        )
        targets = {v.split(":")[1] for v in spec.get("volumes", [])}
        assert set(ours[name].get("volumes", {})) == targets, name


@pytest.mark.parametrize("stack", STACKS)
def test_every_party_has_its_own_node_config_and_data_volume(stack):
    config = compose_config(STACKS[stack])
    services = config["services"]
    parties = party_indices(services)
    assert parties == [0, 1]
    for i in parties:
        node_config = services[f"supernode-{i}"]["command"][
            services[f"supernode-{i}"]["command"].index("--node-config") + 1
        ]
        assert f"partition-id={i} num-partitions={len(parties)}" in node_config and "data-dir='/data'" in node_config
        apps = services[f"superexec-clientapp-{i}"]
        assert apps["command"][apps["command"].index("--runtime-api-address") + 1] == f"supernode-{i}:9094"
        assert f"party-{i}-data:/data:ro" in apps["volumes"]
        holders = [
            n for n, spec in services.items() if any(v.startswith(f"party-{i}-data:") for v in spec.get("volumes", []))
        ]
        assert holders == [f"superexec-clientapp-{i}"]  # no other container sees party i's data
    assert "server-runs:/app/runs:rw" in services["superexec-serverapp"]["volumes"]
    assert config["volumes"]["server-runs"]["name"] == "fedsmix-server-runs"
    assert services["superlink"]["image"] == "flwr/superlink:1.42.0"
    assert {s["image"] for n, s in services.items() if n.startswith("supernode-")} == {"flwr/supernode:1.42.0"}
    build = services["superexec-serverapp"]["build"]
    assert build["target"] == "superexec" and build["args"]["BASE_IMAGE"] == "flwr/superexec:1.42.0"
    assert build["args"]["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"  # CPU wheels by default
    assert services["superlink"]["ports"][0]["published"] in (8000, "8000")
    dockerfile = (REPO / build["dockerfile"]).read_text()
    assert re.search(r"^ARG BASE_IMAGE=flwr/superexec:1\.42\.0$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS flower$", dockerfile, re.M)
    if "register-supernodes" in services:  # the TLS overlay repeats the build: the same image either way
        assert services["register-supernodes"]["build"] == build
    for name, spec in services.items():
        if name == "register-supernodes":
            assert spec["restart"] == "no"
            continue
        assert spec["healthcheck"]["test"][0] == "CMD-SHELL", name  # podman 4.3 splits [CMD, ...] at spaces
        limits = spec["deploy"]["resources"]["limits"]
        assert float(limits["cpus"]) > 0 and limits["memory"], name


def _flower_parser(binary: str):
    """The argparse parsers of the installed Flower CLIs (what `flower-* <flags>` parses)."""
    if binary == "flower-superlink":
        from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink

        return _parse_args_run_superlink()
    if binary == "flower-supernode":
        from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

        return _parse_args_run_supernode()
    from flwr.supercore.cli.flower_superexec import _parse_args

    return _parse_args()


@pytest.mark.parametrize("stack", STACKS)
def test_service_flags_are_current_flags_of_the_installed_flower(stack, tmp_path):
    """Each command line parses with Flower 1.42's own parser and uses no deprecated or hidden flag."""
    deployment = Deployment(STACKS[stack], parties=2, workdir=tmp_path)
    checked = set()
    for name, service in deployment.native.items():
        binary = Path(service.argv[0]).name
        if not binary.startswith("flower-"):
            continue
        parser = _flower_parser(binary)
        parser.exit = lambda status=0, message=None, name=name, binary=binary: pytest.fail(
            f"{name}: {binary} rejects its flags: {message}"
        )
        parser.parse_args(service.argv[1:])
        options = {opt: action for action in parser._actions for opt in action.option_strings}
        for flag in (a for a in service.argv[1:] if a.startswith("--")):
            help_text = options[flag].help or ""
            assert help_text != "==SUPPRESS==" and "eprecated" not in help_text, f"{name}: {flag}: {help_text}"
        checked.add(binary)
    assert checked == {"flower-superlink", "flower-supernode", "flower-superexec"}
    superlink = deployment.services["superlink"]["command"]
    assert (
        superlink[superlink.index("--port") + 1] == "8000"
        and superlink[superlink.index("--isolation") + 1] == "process"
    )
    assert all("--isolation" in s["command"] for n, s in deployment.services.items() if n.startswith("supernode-"))


def test_adding_a_party_clones_the_last_party(tmp_path):
    services = with_parties(load_services([COMPOSE, TLS_OVERLAY]), 3)
    assert party_indices(services) == [0, 1, 2]
    command = services["supernode-2"]["command"]
    assert "partition-id=2 num-partitions=3 data-dir='/data'" in command
    assert command[command.index("--auth-supernode-private-key") + 1] == "/certs/supernode-2.auth-key"
    assert command[command.index("--ssl-certfile") + 1] == "/certs/supernode-2.pem"
    assert services["superexec-clientapp-2"]["volumes"]["/data"] == "party-2-data"
    assert "supernode-2:9094" in services["superexec-clientapp-2"]["command"]
    assert all("num-partitions=3" in " ".join(services[f"supernode-{i}"]["command"]) for i in range(3))
    assert party_indices(with_parties(load_services([COMPOSE]), 1)) == [0]


def test_native_translation_maps_ports_hosts_and_mounts(tmp_path):
    deployment = Deployment([COMPOSE], parties=2, workdir=tmp_path)
    link = deployment.translator.port("superlink", 8000)
    superlink = deployment.native["superlink"].argv
    assert superlink[superlink.index("--host") + 1] == "127.0.0.1" and superlink[superlink.index("--port") + 1] == str(
        link
    )
    node0 = deployment.native["supernode-0"].argv
    assert node0[node0.index("--superlink") + 1] == f"127.0.0.1:{link}"
    assert f"data-dir='{tmp_path / 'volumes' / 'party-0-data'}'" in node0[node0.index("--node-config") + 1]
    apps0 = deployment.native["superexec-clientapp-0"].argv
    assert (
        apps0[apps0.index("--runtime-api-address") + 1]
        == f"127.0.0.1:{deployment.translator.port('supernode-0', 9094)}"
    )
    assert f"localhost:{link}/health" in deployment.native["superlink"].health[-1]
    ports = list(deployment.translator.ports.values())
    assert len(ports) == len(set(ports)) == 1 + 1 + 2 * 2  # superlink, ServerApp SuperExec, two per party
    assert deployment.run_config(DEMO_RUN_CONFIG)["runs-dir"] == str(tmp_path / "volumes" / "server-runs")


# ------------------------------------------------------------------------------ certificates
def test_certificate_script_makes_one_chain_per_service_and_supernode_keys(tmp_path):
    assert make_certs.main([str(tmp_path), "--supernodes", "3"]) == 0
    nodes = [f"supernode-{i}" for i in range(3)]
    expected = {"ca.crt", "supernodes.pub", "superlink.pem", "superlink.key"}
    expected |= {f"{n}{suffix}" for n in nodes for suffix in (".pem", ".key", ".auth-key")}
    assert {p.name for p in tmp_path.iterdir()} == expected  # the CA's private key is not kept
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    for name in ("superlink", *nodes):
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(names.get_values_for_type(x509.DNSName)) == {name, "localhost"}
        assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
        assert cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=300)
        assert stat.S_IMODE((tmp_path / f"{name}.key").stat().st_mode) == 0o600
    lines = (tmp_path / "supernodes.pub").read_text().splitlines()
    assert [line.split()[2] for line in lines] == nodes
    for name, line in zip(nodes, lines):
        private = load_ssh_private_key((tmp_path / f"{name}.auth-key").read_bytes(), None)
        assert isinstance(private.curve, ec.SECP384R1)
        assert private.public_key().public_numbers() == load_ssh_public_key(line.encode()).public_numbers()
        assert stat.S_IMODE((tmp_path / f"{name}.auth-key").stat().st_mode) == 0o600


def test_under_tls_each_container_mounts_only_its_own_secrets():
    services = compose_config([COMPOSE, TLS_OVERLAY])["services"]
    for name, spec in services.items():
        secrets = {Path(v.split(":")[0]).name for v in spec.get("volumes", []) if v.split(":")[0].endswith("key")}
        own = {"superlink": {"superlink.key"}}.get(
            name, {f"{name}.key", f"{name}.auth-key"} if name.startswith("supernode-") else set()
        )
        assert secrets == own, name


# ------------------------------------------------------------------------------- README
def _deployment_doc() -> str:
    """The "## Deployment" section of docs/deployment.md (moved there from the README), up to the next
    second-level heading."""
    text = (REPO / "docs" / "deployment.md").read_text()
    start = text.index("## Deployment")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_readme_gives_the_commands_the_tests_use():
    section = _deployment_doc()
    validate = "docker-compose -f docker-compose.yml -f docker-compose.tls.yml config -q"
    compose_config([COMPOSE, TLS_OVERLAY])  # fails clearly when docker-compose is missing
    assert subprocess.run(validate.split(), cwd=REPO).returncode == 0
    run_config = config_arg(DEMO_RUN_CONFIG)
    for command in (
        "docker compose build",
        "docker compose up -d",
        f".venv/bin/flwr run . docker --stream --run-config '{run_config}'",
        ".venv/bin/flwr supernode list docker",
        ".venv/bin/flwr ls docker",
        "docker compose exec superexec-serverapp cat /app/runs/latest/results.json",
        "docker compose down",
        ".venv/bin/python deploy/make_certs.py deploy/certs --supernodes 2",
        "docker compose -f docker-compose.yml -f docker-compose.tls.yml up --build -d",
        f".venv/bin/flwr run . docker-tls --stream --run-config '{run_config}'",
        ".venv/bin/flwr supernode list docker-tls",
        ".venv/bin/flwr ls docker-tls",
        "docker compose -f docker-compose.yml -f docker-compose.tls.yml down",
        "docker-compose -f docker-compose.yml -f docker-compose.tls.yml config -q",
        ".venv/bin/python -m deploy.smoke --tls",
    ):
        assert command in section, command
    assert connection_toml("docker", "127.0.0.1:8000", None) in section
    assert connection_toml("docker-tls", "127.0.0.1:8000", "$PWD/deploy/certs/ca.crt") in section


# --------------------------------------------------------------------- the smoke test, slow
def _assert_smoke(summary: dict) -> None:
    print(
        f"\nsmoke ({'TLS' if summary['tls'] else 'insecure'}): wall {summary['wall-seconds']} s "
        f"(startup {summary['startup-seconds']} s, run {summary['run-seconds']} s), accuracy {summary['accuracy']}"
    )
    assert summary["status"] == "finished:completed"
    assert summary["problems"] == []
    assert summary["leftover-pids"] == []


@pytest.mark.slow
@pytest.mark.sim
def test_deployment_smoke_survives_a_supernode_killed_mid_fedprox(tmp_path):
    """`python -m deploy.smoke`: three parties, the demo's strategies; party 2's SuperNode dies
    (SIGKILL to its process group) when FedProx's round 2 starts, min-parties is 2."""
    summary = smoke(tls=False, workdir=tmp_path)
    _assert_smoke(summary)  # check_demo: all three uploads, FedProx's curve 0..2, party 2 dropped
    mix = summary["results"]["strategies"]["mixup-union"]
    assert set(mix["parties"]) == {"0", "1", "2"} and mix["parties-used"] == 3
    prox = summary["results"]["strategies"]["fedprox"]
    assert [point["round"] for point in prox["curve"]] == list(range(FAULT_RUN["rounds"] + 1))
    assert prox["accuracy"] > 3 * 0.1  # the two remaining parties still learn digits
    first = summary["dropped"][0]
    assert {record["party"] for record in summary["dropped"]} == {2}
    assert first["round"] == KILL_ROUND and "Node Unavailable" in first["reason"]
    dropped_at = dt.datetime.strptime(first["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert dropped_at.timestamp() >= int(summary["killed-at"])


@pytest.mark.slow
@pytest.mark.sim
def test_deployment_smoke_over_tls_with_supernode_auth(tmp_path):
    summary = smoke(tls=True, workdir=tmp_path)
    _assert_smoke(summary)
    assert summary["parties"] == 2 and summary["dropped"] in (None, [])
    assert "Failed to activate" in (tmp_path / "logs" / "unregistered-supernode.log").read_text()
    registered = (tmp_path / "logs" / "register-supernodes.log").read_text()
    assert registered.count("register-supernodes: supernode-") == 2


def test_the_smoke_run_in_the_clear_refuses_too_few_parties_before_starting_anything(tmp_path):
    with pytest.raises(DeploymentError, match="parties: 2; .* needs at least 3"):
        smoke(tls=False, parties=2, workdir=tmp_path)
    assert not (tmp_path / "logs").exists()


# ------------------------------------------------------------------------------ faults, slow
# FedProx alone: the fault is in its rounds, and mixup-union would only add minutes.
FEDPROX_FAULT_RUN = {**FAULT_RUN, "strategies": "fedprox"}


@pytest.mark.slow
@pytest.mark.sim
def test_a_run_that_falls_below_min_parties_ends_with_a_clear_error(tmp_path):
    """Two parties, min-parties 2: party 1's SuperNode dies in round 2; the run fails, it does not hang."""
    with Deployment([COMPOSE], parties=2, workdir=tmp_path) as deployment:
        on_line, killed = deployment.kill_when("supernode-1", KILL_AT)
        run = deployment.flwr_run(FEDPROX_FAULT_RUN, timeout=600, on_line=on_line)
        results = deployment.results(FEDPROX_FAULT_RUN)
    assert killed, run.output[-2000:]
    assert run.status == "finished:failed"
    assert "round 2: only 1 parties replied; min-parties is 2; dropped party 1" in run.details
    assert "Node Unavailable" in run.details
    assert "min-parties is 2" in results["strategies"]["fedprox"]["error"]
    assert deployment.alive() == []


# --------------------------------------------------------------------- data volumes, slow
@pytest.mark.slow
@pytest.mark.sim
def test_each_party_reads_only_its_own_data_volume(tmp_path, data_dir):
    """Party 0's volume holds a small MNIST slice and party 1's is empty: party 0 encodes and
    uploads from its own volume, party 1 looks in its own (the data-dir of its --node-config) and
    finds nothing, so the run stops below min-parties."""
    volumes = tmp_path / "volumes"
    (volumes / "party-0-data").mkdir(parents=True)
    with np.load(Path(data_dir) / "mnist.npz") as full:
        np.savez(volumes / "party-0-data" / "mnist.npz", x_train=full["x_train"][:600], y_train=full["y_train"][:600])
    config = {
        "preset": "configs/quickstart.yaml",
        "strategies": "mixup-union",
        "dataset": "mnist",
        "partitioner": "iid",
        "data-dir": "/data",
        "epochs": 1,
        "runs-dir": "/app/runs",
    }
    with Deployment([COMPOSE], parties=2, workdir=tmp_path) as deployment:
        run = deployment.flwr_run(config, timeout=600)
        results = deployment.results(config)
    assert run.status == "finished:failed" and "only 1 valid parties remain; min-parties is 2" in run.details
    manifest = json.loads((Path(results["run-dir"]) / "uploads" / "manifest.json").read_text())
    assert list(manifest) == ["0"] and manifest["0"]["x"]["shape"] == [270, 1, 28, 28]  # half of 600 less 10 %
    assert str(volumes / "party-1-data" / "mnist.npz") in (tmp_path / "logs" / "superexec-clientapp-1.log").read_text()
