"""docker-compose.yml and the Dockerfile refer only to things that exist in the code.

No Docker engine runs here, so instead of `docker compose up` these tests check every service,
dependency, port, environment variable and healthcheck against the code, and run the
coordinator's healthcheck command for real against a coordinator configured by the compose
environment (with hosts rewritten to the test servers). They also hold the image to its
reproducibility rules: pinned tags, and third-party packages only from the hashed lock file.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement

from harness.coordinator import CoordinatorProcess, snapcoord_command
from harness.seaweed import SeaweedS3Server
from snapcoord.coordinator.cli import build_parsers
from snapcoord.coordinator.config import options, settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
COORD: dict[str, Any] = SERVICES["coordinator"]
COORD_ENV: dict[str, str] = {k: str(v) for k, v in COORD["environment"].items()}
REPLICA: dict[str, Any] = SERVICES["coordinator-2"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
LOCK = ROOT / "deploy" / "requirements.lock"
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


def _join_continuations(text: str) -> str:
    """``text`` with backslash-newline continuations joined into logical lines."""
    return re.sub(r"\\\n\s*", " ", text)


def _dockerfile_instruction(name: str) -> list[str]:
    """The logical lines (continuations joined) of one Dockerfile instruction."""
    logical = _join_continuations(DOCKERFILE)
    return [line.split(None, 1)[1] for line in logical.splitlines() if line.startswith(name + " ")]


def _exec_form(text: str) -> list[str]:
    assert text.startswith("["), f"use the exec form so signals reach snapcoord: {text}"
    return [s.strip().strip('"') for s in text.strip("[]").split(",")]


def test_services_and_dependencies_exist() -> None:
    assert set(SERVICES) == {"zookeeper", "minio", "bucket-init", "coordinator", "coordinator-2"}
    for name, service in SERVICES.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
            condition = spec["condition"]
            assert condition in {"service_healthy", "service_completed_successfully"}, (name, dep)
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{name} waits for {dep}, which has no healthcheck"
    # Long-running services all have healthchecks; the init job is one-shot.
    for name in ("zookeeper", "minio", "coordinator", "coordinator-2"):
        assert SERVICES[name]["healthcheck"]["test"], name
    assert COORD["depends_on"]["bucket-init"]["condition"] == "service_completed_successfully"


def test_coordinator_environment_is_known_and_valid() -> None:
    known = {opt.env for opt in options.OPTIONS}
    for key in COORD_ENV:
        assert key in known or key in BOTO3_CHAIN_VARS, f"docker-compose sets {key}, which nothing reads"
    cfg = settings.load({}, COORD_ENV)  # raises ConfigError on a value the coordinator rejects
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
    defaults = {opt.name: opt.default for opt in options.OPTIONS}
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
        assert "--target" not in argv, "the probe must follow SNAPCOORD_PORT, not name a port"
        # The probe asks 127.0.0.1:$SNAPCOORD_PORT: the test coordinator's port here.
        probe_env = {**os.environ, "SNAPCOORD_PORT": str(coordinator.grpc_port)}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=probe_env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip() == f"{coordinator.target}: SERVING"
        assert coordinator.terminate() == 0
        after = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=probe_env)
        assert after.returncode == 1
        assert "UNAVAILABLE" in after.stdout


# --- production shape: restarts, volumes, pinned tags, a second replica ---------------------------


def test_services_restart_and_keep_their_data() -> None:
    for name in ("zookeeper", "minio", "coordinator", "coordinator-2"):
        assert SERVICES[name]["restart"] == "unless-stopped", name
    assert SERVICES["bucket-init"]["restart"] == "no"  # one-shot: exits 0 once the bucket exists
    declared = set(COMPOSE["volumes"])
    for name, data_dir in (("zookeeper", "/data"), ("zookeeper", "/datalog"), ("minio", "/data")):
        mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES[name]["volumes"]}
        assert mounts.get(data_dir) in declared, f"{name}:{data_dir} is not on a named volume"


def test_image_tags_are_pinned() -> None:
    for name, service in SERVICES.items():
        image = service["image"]
        if "build" in service or image == SERVICES["coordinator"]["image"]:
            continue  # built here
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: {image} is not pinned"
    zk_tag = SERVICES["zookeeper"]["image"].rpartition(":")[2]
    assert re.fullmatch(r"\d+\.\d+\.\d+", zk_tag), f"ZooKeeper tag {zk_tag} is not a full version"
    assert re.fullmatch(r"RELEASE\.[0-9TZ-]+", SERVICES["minio"]["image"].rpartition(":")[2])


def test_second_replica_is_the_same_coordinator_on_other_host_ports() -> None:
    for key in ("image", "command", "environment", "depends_on", "healthcheck", "stop_grace_period"):
        assert REPLICA[key] == COORD[key], key
    assert REPLICA["profiles"] == ["replicas"] and "profiles" not in COORD
    assert "build" in COORD and "build" not in REPLICA  # built once, by the coordinator service

    def host_ports(service: dict[str, Any]) -> set[int]:
        return {int(str(p).split(":")[0]) for p in service["ports"]}

    assert _container_ports(REPLICA) == _container_ports(COORD)
    assert not host_ports(REPLICA) & host_ports(COORD), "--profile replicas would bind a host port twice"
    header = (ROOT / "docker-compose.yml").read_text().split("\nname:", 1)[0]
    assert "docker compose --profile replicas up" in header
    for port in host_ports(REPLICA):
        assert str(port) in header, f"the header does not say where coordinator-2 listens ({port})"


# --- the image: locked dependencies, no wheels in the final layer ----------------------------------


def _stages() -> dict[str, str]:
    """Dockerfile stage name -> its text (continuations joined)."""
    parts = re.split(r"^FROM \S+ AS (\S+)\s*$", _join_continuations(DOCKERFILE), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _lock() -> dict[str, tuple[str, list[str]]]:
    """Package name (normalised) -> (pinned version, hashes) from deploy/requirements.lock."""
    text = _join_continuations(LOCK.read_text())
    locked = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(
            r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)\s*(#.*)?", line.strip()
        )
        assert m, f"unexpected line in {LOCK.name}: {line}"
        locked[_normalise(m[1])] = (m[2], re.findall(r"sha256:([0-9a-f]{64})", m[3]))
    return locked


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_image_installs_only_locked_packages_and_ships_no_wheels() -> None:
    stages = _stages()
    assert list(stages) == ["build", "runtime"]
    build, runtime = stages["build"], stages["runtime"]
    assert "--require-hashes" in build and "-r deploy/requirements.lock" in build
    # Our own wheels go in without dependencies: every dependency came from the lock.
    for install in re.findall(r"pip install [^&\n]*", build):
        assert "--require-hashes" in install or "--no-deps" in install, install
    assert "pip check" in build
    # The runtime stage installs nothing and copies only the venv.
    assert "pip" not in runtime and "/wheels" not in runtime
    copies = re.findall(r"^COPY (.*)$", runtime, flags=re.MULTILINE)
    assert copies == ["--from=build /opt/snapcoord /opt/snapcoord"]
    assert "/opt/snapcoord/bin" in runtime.split("ENV", 1)[1].split("RUN", 1)[0]  # PATH
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"build", "**/build", "**/dist"} <= set(ignored)


#: The extras the image installs (scripts/lock-image-deps locks them with the dependencies).
IMAGE_EXTRAS = {"coordinator": ("otel",)}


def test_the_lock_script_locks_the_image_extras() -> None:
    script = (ROOT / "scripts" / "lock-image-deps").read_text()
    assert 'IMAGE_EXTRAS = {"client": (), "coordinator": ("otel",)}' in script


def test_lock_covers_every_runtime_dependency_within_its_range() -> None:
    locked = _lock()
    assert all(hashes for _, hashes in locked.values())
    # The image's interpreter: CPython 3.11 on Linux.
    env: dict[str, str] = {
        **{k: str(v) for k, v in default_environment().items()},
        "python_version": "3.11",
        "sys_platform": "linux",
        "extra": "",
    }
    for dist in ("client", "coordinator"):
        project = tomllib.loads((ROOT / dist / "pyproject.toml").read_text())["project"]
        # The image has the coordinator's tracing extra: --otel-exporter otlp needs no rebuild.
        extras = [
            text for extra in IMAGE_EXTRAS.get(dist, ()) for text in project["optional-dependencies"][extra]
        ]
        for text in [*project["dependencies"], *extras]:
            req = Requirement(text)
            if req.name.startswith("snapcoord"):
                continue  # built from this repository
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = _normalise(req.name)
            assert name in locked, f"{dist}/pyproject.toml needs {text}; run scripts/lock-image-deps"
            assert req.specifier.contains(locked[name][0], prereleases=True), (
                f"{dist}/pyproject.toml needs {text}, the lock pins {locked[name][0]}: "
                "run scripts/lock-image-deps"
            )
    # The lock is closed: what each locked package needs (read from the metadata of the same
    # version where the test venv has it installed) is locked too.
    checked = 0
    for name, (version, _) in locked.items():
        try:
            dist_meta = distribution(name)
        except PackageNotFoundError:
            continue
        if dist_meta.version != version:
            continue
        checked += 1
        for text in dist_meta.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                assert _normalise(req.name) in locked, f"{name} {version} needs {text}, which is not locked"
    assert checked >= len(locked) // 2, "too few locked versions installed here to check the closure"
