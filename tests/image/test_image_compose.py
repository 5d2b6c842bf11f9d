"""The coordinator services of docker-compose.yml (and with docker-compose.secure.yml on top) run with
the built image, started from the compose files' own settings: command, environment, ports, volumes,
healthcheck and stop grace.

Neither Docker Compose nor the upstream ZooKeeper and MinIO images can be had here, so the compose
file's ``zookeeper`` and ``minio`` services are stood in for by the harness's ZooKeeper (Debian's
package) and SeaweedFS (an S3 server from PyPI), started with the compose file's credentials and
bucket (what its ``bucket-init`` job creates) and reached from the containers under the compose
service names (``--add-host``); only their ports in the environment differ. The image is the one
``scripts/build-image`` built (the compose file's ``build`` makes the same from the Dockerfile),
and the host ports are free ones rather than 50051/9464, which may be taken on a shared machine.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_readme_tour import README_STEPS

from harness.certs import CertificateAuthority
from harness.image import (
    HOST_LOOPBACK,
    ROOT,
    BuiltImage,
    Container,
    record_serving,
    run_tour,
    tools_path,
)
from harness.ports import free_port
from harness.seaweed import SeaweedS3Server
from harness.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.process, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(900)]

COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SECURE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text())
OPS_TOKEN = "ops-example-token"  # the README's "Securing it" token for deploy/auth.example.yaml's ops


class Stores:
    """The stand-ins for the compose file's zookeeper and minio services."""

    def __init__(self, zookeeper: ZooKeeperServer, s3: SeaweedS3Server) -> None:
        self.zookeeper = zookeeper
        self.s3 = s3

    def environment(self, compose_env: Mapping[str, Any]) -> dict[str, str]:
        """The service's environment with the stand-ins' ports in place of the upstream images' ones."""
        env = {key: str(value) for key, value in compose_env.items()}
        for key, value in env.items():
            value = value.replace("zookeeper:2181", f"zookeeper:{self.zookeeper.port}")
            env[key] = value.replace("http://minio:9000", f"http://minio:{self.s3.port}")
        return env


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    minio = COMPOSE["services"]["minio"]["environment"]
    bucket = COMPOSE["services"]["bucket-init"]["environment"]["BUCKET"]
    zookeeper = ZooKeeperServer(tmp_path_factory.mktemp("compose-zookeeper"))
    s3 = SeaweedS3Server(
        tmp_path_factory.mktemp("compose-s3"),
        bucket=bucket,
        access_key=minio["MINIO_ROOT_USER"],
        secret_key=minio["MINIO_ROOT_PASSWORD"],
    )
    zookeeper.start()
    try:
        s3.start()
        try:
            yield Stores(zookeeper, s3)
        finally:
            s3.stop()
    finally:
        zookeeper.stop()


def service_container(
    image: BuiltImage,
    service: Mapping[str, Any],
    stores: Stores,
    overlay: Mapping[str, Any] | None = None,
    mounts: Mapping[str, Path] | None = None,
) -> tuple[Container, dict[int, int]]:
    """A container as compose would start ``service`` (with ``overlay``'s environment and volumes
    merged in, as compose merges files); ``mounts`` maps relative sources to where they are here.
    Returns it and its container-to-host port map."""
    env = dict(service["environment"]) | dict((overlay or {}).get("environment", {}))
    volumes: list[str] = []
    for volume in [*service.get("volumes", []), *(overlay or {}).get("volumes", [])]:
        source, target, *mode = volume.split(":")
        here = (mounts or {}).get(source, ROOT / source)
        volumes.append(":".join([str(here), target, *mode]))
    publish = {int(str(port).rsplit(":", 1)[1]): free_port() for port in service["ports"]}
    health = service["healthcheck"]["test"]
    assert health[0] == "CMD", health
    container = Container(
        image.tag,
        name=f"snapcoord-compose-{uuid.uuid4().hex[:8]}",
        args=service["command"],
        env=stores.environment(env),
        publish=publish,
        volumes=volumes,
        add_hosts={"zookeeper": HOST_LOOPBACK, "minio": HOST_LOOPBACK},
        health_cmd=json.dumps(health[1:]),
    )
    return container, publish


def grace_seconds(service: Mapping[str, Any]) -> int:
    grace = str(service["stop_grace_period"])
    assert grace.endswith("s"), grace
    return int(grace.removesuffix("s"))


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["grpcurl", *args], capture_output=True, text=True, env=tools_path(), timeout=60)


def test_the_compose_coordinators_start_share_the_stores_and_answer_the_tour(
    snapcoord_image: BuiltImage, stores: Stores, image_report: list[str]
) -> None:
    services = COMPOSE["services"]
    first, first_ports = service_container(snapcoord_image, services["coordinator"], stores)
    second, second_ports = service_container(snapcoord_image, services["coordinator-2"], stores)
    with first, second:
        record_serving(first, image_report, "docker-compose.yml coordinator")
        record_serving(second, image_report, "docker-compose.yml coordinator-2")
        run_tour(README_STEPS, first_ports[50051], first_ports[9464])
        query = ["-plaintext", "-d", '{"app_id": "clickstream", "consistent": true}']
        method = "snapcoord.v1.SnapshotService/GetCurrentSnapshot"
        answers = [
            grpcurl(*query, f"127.0.0.1:{ports[50051]}", method) for ports in (first_ports, second_ports)
        ]
        assert answers[0].returncode == 0 and '"generation": "1"' in answers[0].stdout, answers[0]
        assert answers[1].stdout == answers[0].stdout  # the second replica reads the same stores
        for container, service in ((first, services["coordinator"]), (second, services["coordinator-2"])):
            assert container.stop(grace_seconds(service)) == 0, container.logs()


def test_the_secure_compose_coordinator_serves_tls_and_tokens(
    snapcoord_image: BuiltImage, stores: Stores, tmp_path: Path, image_report: list[str]
) -> None:
    """The README's "Securing it" certificates in ./pki (key readable by the image's user, as the
    compose file says), the example auth file, TLS on the gRPC port."""
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = CertificateAuthority.create(pki, "snapcoord-test-ca")
    ca.issue(pki, "localhost", file_stem="server")
    (pki / "ca.pem").write_bytes(ca.pem)
    (pki / "server.key").chmod(0o644)
    service = COMPOSE["services"]["coordinator"]
    container, ports = service_container(
        snapcoord_image, service, stores, overlay=SECURE["services"]["coordinator"], mounts={"./pki": pki}
    )
    with container:
        record_serving(container, image_report, "docker-compose.secure.yml coordinator")
        target = f"127.0.0.1:{ports[50051]}"
        listed = grpcurl(
            "-cacert", str(pki / "ca.pem"), "-H", f"authorization: Bearer {OPS_TOKEN}", target, "list"
        )
        assert listed.returncode == 0 and "snapcoord.v1.SnapshotService" in listed.stdout, listed
        plaintext = grpcurl("-plaintext", target, "list")
        assert plaintext.returncode != 0, plaintext
        anonymous = grpcurl(
            "-cacert",
            str(pki / "ca.pem"),
            "-d",
            '{"producer_id": "p"}',
            target,
            "snapcoord.v1.ProducerOffsetService/GetProducerOffsets",
        )
        assert "Unauthenticated" in anonymous.stdout + anonymous.stderr, anonymous
        assert container.stop(grace_seconds(service)) == 0, container.logs()
