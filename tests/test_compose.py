"""docker-compose.yml and the Dockerfile refer only to things that exist in the code.

No Docker engine runs here, so instead of `docker compose up` these tests check every service,
dependency, port, environment variable and healthcheck against the code, and run the
coordinator's healthcheck command for real against a coordinator configured by the compose
environment (with hosts rewritten to the test servers).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from harness.coordinator import CoordinatorProcess, snapcoord_command
from harness.seaweed import SeaweedS3Server
from snapcoord.coordinator import config
from snapcoord.coordinator.cli import build_parsers

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
COORD: dict[str, Any] = SERVICES["coordinator"]
COORD_ENV: dict[str, str] = {k: str(v) for k, v in COORD["environment"].items()}
DOCKERFILE = (ROOT / "Dockerfile").read_text()
BOTO3_CHAIN_VARS = {
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
}


def _container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}


def _dockerfile_instruction(name: str) -> list[str]:
    """The logical lines (continuations joined) of one Dockerfile instruction."""
    logical = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in logical.splitlines() if line.startswith(name + " ")]


def _exec_form(text: str) -> list[str]:
    assert text.startswith("["), f"use the exec form so signals reach snapcoord: {text}"
    return [s.strip().strip('"') for s in text.strip("[]").split(",")]


def test_services_and_dependencies_exist() -> None:
    assert set(SERVICES) == {"zookeeper", "minio", "bucket-init", "coordinator"}
    for name, service in SERVICES.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
            condition = spec["condition"]
            assert condition in {"service_healthy", "service_completed_successfully"}, (name, dep)
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{name} waits for {dep}, which has no healthcheck"
    # Long-running services all have healthchecks; the init job is one-shot.
    for name in ("zookeeper", "minio", "coordinator"):
        assert SERVICES[name]["healthcheck"]["test"], name
    assert COORD["depends_on"]["bucket-init"]["condition"] == "service_completed_successfully"


def test_coordinator_environment_is_known_and_valid() -> None:
    known = {opt.env for opt in config.OPTIONS}
    for key in COORD_ENV:
        assert key in known or key in BOTO3_CHAIN_VARS, f"docker-compose sets {key}, which nothing reads"
    cfg = config.load({}, COORD_ENV)  # raises ConfigError on a value the coordinator rejects
    assert cfg.storage.metadata_uri == COORD_ENV["SNAPCOORD_METADATA"]
    assert cfg.storage.blobs_uri == COORD_ENV["SNAPCOORD_BLOBS"]


def test_coordinator_points_at_the_other_services() -> None:
    zk = urlsplit(COORD_ENV["SNAPCOORD_METADATA"])
    assert zk.scheme == "zk" and zk.hostname == "zookeeper"
    assert zk.port in _container_ports(SERVICES["zookeeper"])
    s3 = urlsplit(COORD_ENV["AWS_ENDPOINT_URL_S3"])
    assert s3.hostname == "minio" and s3.port in _container_ports(SERVICES["minio"])
    minio_env = SERVICES["minio"]["environment"]
    assert COORD_ENV["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"]
    assert COORD_ENV["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]
    init = SERVICES["bucket-init"]
    assert urlsplit(COORD_ENV["SNAPCOORD_BLOBS"]).netloc == init["environment"]["BUCKET"]
    assert "http://minio:9000" in " ".join(init["entrypoint"])
    assert init["environment"]["MINIO_ROOT_USER"] == minio_env["MINIO_ROOT_USER"]


def test_ports_match_the_configuration_and_the_image() -> None:
    ports = {int(COORD_ENV["SNAPCOORD_PORT"]), int(COORD_ENV["SNAPCOORD_METRICS_PORT"])}
    assert _container_ports(COORD) == ports
    defaults = {opt.name: opt.default for opt in config.OPTIONS}
    assert ports == {int(str(defaults["port"])), int(str(defaults["metrics_port"]))}
    (expose,) = _dockerfile_instruction("EXPOSE")
    assert {int(p) for p in expose.split()} == ports


def test_image_entrypoint_command_and_healthcheck_exist() -> None:
    scripts = tomllib.loads((ROOT / "coordinator" / "pyproject.toml").read_text())["project"]["scripts"]
    (entrypoint,) = _dockerfile_instruction("ENTRYPOINT")
    assert _exec_form(entrypoint) == ["snapcoord"] and "snapcoord" in scripts
    (cmd,) = _dockerfile_instruction("CMD")
    parser, _ = build_parsers()
    parser.parse_args(_exec_form(cmd))  # "serve" is a real subcommand
    assert COORD["command"] == _exec_form(cmd)
    (healthcheck,) = _dockerfile_instruction("HEALTHCHECK")
    docker_probe = _exec_form(healthcheck.split("CMD", 1)[1].strip())
    assert COORD["healthcheck"]["test"][0] == "CMD"
    assert COORD["healthcheck"]["test"][1:] == docker_probe
    parser.parse_args(docker_probe[1:])
    # Everything the image copies exists and is not excluded by .dockerignore.
    ignored = (ROOT / ".dockerignore").read_text().split()
    for copy in _dockerfile_instruction("COPY"):
        if copy.startswith("--from"):
            continue
        source = shlex.split(copy)[0]
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
        assert source.rstrip("/") not in ignored


@pytest.mark.timeout(120)
def test_healthcheck_command_runs_against_a_coordinator_with_the_compose_environment(
    tmp_path: Path, zk_hosts: str, zk_uri: str, s3_server: SeaweedS3Server, s3_uri: str
) -> None:
    env = dict(COORD_ENV)
    # Same variables, hosts rewritten from the compose network to the test servers.
    env["SNAPCOORD_METADATA"] = zk_uri
    env["SNAPCOORD_BLOBS"] = s3_uri
    env.update(s3_server.env())
    probe = COORD["healthcheck"]["test"][1:]
    with CoordinatorProcess(tmp_path / "coordinator", env=env) as coordinator:
        argv = [*snapcoord_command(), *probe[1:]]
        argv[argv.index("--target") + 1] = coordinator.target  # the image probes 127.0.0.1:50051
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip() == f"{coordinator.target}: SERVING"
        assert coordinator.terminate() == 0
        after = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert after.returncode == 1
        assert "UNAVAILABLE" in after.stdout
