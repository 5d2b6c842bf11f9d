"""The built image, run as users and the Kubernetes base run it: uid 10001, read-only root filesystem,
only the data volume writable; health from inside (the HEALTHCHECK) and from the host, the README's
tour through the real grpcurl, ``snapcoord_build_info``, the drain on SIGTERM, and what the image
must not hold. Embedded stores here; tests/image/test_image_stores.py runs it on ZooKeeper and S3.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from packaging.requirements import Requirement
from test_readme_tour import STEPS

from harness.image import (
    BASE_IMAGE,
    DATA_DIR,
    IMAGE_UID,
    ROOT,
    BuiltImage,
    Container,
    data_volume,
    podman,
    record_serving,
    run_once,
    run_tour,
    tools_path,
)
from harness.ports import free_port
from harness.process import wait_until
from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

DEPLOYMENT = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text())
GRACE_PERIOD_S = int(DEPLOYMENT["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
MANIFEST_ENV = dict(
    line.split("=", 1)
    for line in (ROOT / "deploy" / "kubernetes" / "base" / "snapcoord.env").read_text().splitlines()
    if line and not line.startswith("#")
)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def container(
    snapcoord_image: BuiltImage,
    ports: tuple[int, int],
    tmp_path_factory: pytest.TempPathFactory,
    image_report: list[str],
) -> Iterator[Container]:
    """The image with the Kubernetes base's settings: read-only root, /tmp and the data volume writable."""
    data = tmp_path_factory.mktemp("image-data") / "data"
    with Container(
        snapcoord_image.tag,
        name=f"snapcoord-test-{uuid.uuid4().hex[:8]}",
        publish={50051: ports[0], 9464: ports[1]},
        volumes=[data_volume(data)],
        read_only=True,
        env={"SNAPCOORD_SHUTDOWN_GRACE": MANIFEST_ENV["SNAPCOORD_SHUTDOWN_GRACE"]},
    ) as running:
        record_serving(running, image_report, "embedded stores, read-only root")
        yield running


def test_health_is_serving_inside_and_from_the_host(container: Container, ports: tuple[int, int]) -> None:
    inside = container.healthcheck()
    assert inside.returncode == 0, inside.stdout + inside.stderr
    for service in ("", "snapcoord.v1.SnapshotService"):
        with grpc.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=30
            )
        assert reply.status == SERVING, service
    done = subprocess.run(
        ["grpcurl", "-plaintext", f"127.0.0.1:{ports[0]}", "grpc.health.v1.Health/Check"],
        capture_output=True,
        text=True,
        env=tools_path(),
        timeout=60,
    )
    assert json.loads(done.stdout) == {"status": "SERVING"}, done.stdout + done.stderr


def test_the_tour_runs_against_the_image_through_grpcurl(
    container: Container, ports: tuple[int, int]
) -> None:
    """Reflection (``list``, ``describe``), registrations, snapshots, backlog and leases: the README's
    tour and docs/tour.md, as written."""
    run_tour(STEPS, *ports)


def test_it_runs_as_uid_10001_with_only_its_data_volume_writable(container: Container) -> None:
    assert container.exec("id", "-u").stdout.strip() == str(IMAGE_UID)
    status = container.exec("cat", "/proc/1/status").stdout
    assert re.search(rf"^Uid:\s+{IMAGE_UID}\s+{IMAGE_UID}\s", status, flags=re.M), status
    cmdline = container.exec("cat", "/proc/1/cmdline").stdout.split("\0")
    assert cmdline[0].startswith("/opt/snapcoord/bin/python"), cmdline  # PID 1 is the server itself
    assert cmdline[1:3] == ["/opt/snapcoord/bin/snapcoord", "serve"], cmdline
    assert (
        podman("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", container.name).stdout.strip()
        == "true"
    )
    for path in ("/opt/snapcoord/x", "/etc/x", "/var/x"):
        denied = container.exec("touch", path)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, (path, denied)
    written = container.exec("touch", f"{DATA_DIR}/written", "/tmp/written")
    assert written.returncode == 0, written.stderr


def test_build_info_carries_the_version_and_revision_of_the_build(
    container: Container, ports: tuple[int, int], snapcoord_image: BuiltImage
) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    line = next(line for line in metrics.splitlines() if line.startswith("snapcoord_build_info{"))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert labels["version"] == (ROOT / "VERSION").read_text().strip(), line
    assert labels["revision"] == snapcoord_image.revision, line
    assert line.endswith(" 1.0"), line


@dataclass(frozen=True)
class Call:
    producer_id: str
    sent: float
    ended: float
    code: grpc.StatusCode


def test_sigterm_drains_in_flight_calls_and_exits_0_within_the_grace_period(
    snapcoord_image: BuiltImage, tmp_path: Path, image_report: list[str]
) -> None:
    """With the manifests' shutdown grace, SIGTERM under a stream of registrations: health turns
    NOT_SERVING, the process exits 0 within terminationGracePeriodSeconds, and the drain cut no
    call short. Whether a call was accepted is read from the store afterwards (the same container
    started again on its data volume): every call that ended OK is stored, and every call that
    failed is not, so no call the server took was cut off or lost its reply. Each call registers
    a producer of its own."""
    port = free_port()
    with Container(
        snapcoord_image.tag,
        name=f"snapcoord-drain-{uuid.uuid4().hex[:8]}",
        publish={50051: port},
        volumes=[data_volume(tmp_path / "data")],
        read_only=True,
        env={"SNAPCOORD_SHUTDOWN_GRACE": MANIFEST_ENV["SNAPCOORD_SHUTDOWN_GRACE"]},
    ) as running:
        record_serving(running, image_report, "drain test")
        calls: list[Call] = []
        errors: list[BaseException] = []

        def register(worker: int) -> None:
            try:
                call_until_refused(worker)
            except BaseException as e:  # handed to the test's thread, which fails with it
                errors.append(e)

        def call_until_refused(worker: int) -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
                for n in range(100_000):
                    producer_id = f"drain-{worker}-{n}"
                    request = producer_pb2.RegisterProducerOffsetsRequest(
                        producer_id=producer_id,
                        offsets=[common_pb2.Offset(stream="s", partition=0, offset=n)],
                    )
                    sent = time.monotonic()
                    try:
                        stub.RegisterProducerOffsets(request, timeout=GRACE_PERIOD_S)
                        calls.append(Call(producer_id, sent, time.monotonic(), grpc.StatusCode.OK))
                    except grpc.RpcError as e:
                        calls.append(Call(producer_id, sent, time.monotonic(), e.code()))
                        return

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=120
            )
            assert next(watch).status == SERVING
            workers = [threading.Thread(target=register, args=(i,)) for i in range(4)]
            for worker in workers:
                worker.start()
            try:
                wait_until(lambda: len(calls) >= 40, timeout=60, what="calls under way")
                signalled = time.monotonic()
                running.signal("TERM")
                assert next(watch).status == NOT_SERVING
                assert list(watch) == []  # the drain ends the watch
                code = running.wait_exit(timeout=GRACE_PERIOD_S)
            finally:
                for worker in workers:
                    worker.join(timeout=120)
        log = running.logs()
        assert not errors, errors
        assert code == 0, log
        assert "SIGTERM: draining" in log, log

        running.restart()
        running.wait_healthy()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)

            def stored(producer_id: str) -> bool:
                request = producer_pb2.GetProducerOffsetsRequest(producer_id=producer_id)
                try:
                    stub.GetProducerOffsets(request, timeout=30)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.NOT_FOUND, e
                    return False
                return True

            wrong = [call for call in calls if stored(call.producer_id) != (call.code == grpc.StatusCode.OK)]
        assert wrong == [], wrong
        across = [call for call in calls if call.sent < signalled < call.ended]
        across_ok = sum(call.code == grpc.StatusCode.OK for call in across)
        failed = ", ".join(sorted(call.code.name for call in calls if call.code != grpc.StatusCode.OK))
        image_report.append(
            f"SIGTERM drain: {len(calls)} calls, {len(across)} sent before the signal and ended after it "
            f"({across_ok} OK), failed: {failed or 'none'}; the store agrees with every reply"
        )


def runtime_names() -> set[str]:
    """What the image installs on purpose: the locked packages, our two, a venv's pip and setuptools."""
    locked = re.findall(
        r"^([A-Za-z0-9_.-]+)==", (ROOT / "deploy" / "requirements.lock").read_text(), flags=re.M
    )
    return {name.lower().replace("_", "-") for name in locked} | {
        "snapcoord",
        "snapcoord-client",
        "pip",
        "setuptools",
    }


def test_the_image_holds_no_test_dependencies_compiler_pip_cache_or_build_host_settings(
    snapcoord_image: BuiltImage,
) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    test_only = sorted(
        {
            Requirement(spec).name.lower().replace("_", "-")
            for group in ("test", "lint")
            for spec in pyproject["dependency-groups"][group]
            if isinstance(spec, str)
        }
        - runtime_names()
    )
    probe = (
        "import hashlib, importlib.metadata as m, json, os, shutil\n"
        "print(json.dumps({\n"
        " 'dists': sorted({d.metadata['Name'].lower() for d in m.distributions()}),\n"
        " 'compilers': [c for c in ('gcc', 'cc', 'c++', 'clang', 'make') if shutil.which(c)],\n"
        " 'paths': [p for p in ('/root/.cache', '/var/lib/snapcoord/.cache', '/tmp', '/wheels', '/src',\n"
        "   '/opt/build', '/etc/pip.conf', '/etc/xdg/pip', '/run/snapcoord-build-ca.pem')\n"
        "   if os.path.exists(p) and (p != '/tmp' or os.listdir(p))],\n"
        " 'pip_env': sorted(k for k in os.environ if k.startswith('PIP_')),\n"
        " 'ca': hashlib.sha256(open('/etc/ssl/certs/ca-certificates.crt', 'rb').read()).hexdigest(),\n"
        "}))\n"
    )
    found = json.loads(run_once(snapcoord_image.tag, "python", "-c", probe))
    dists = {name.replace("_", "-") for name in found["dists"]}
    assert not dists & set(test_only), dists & set(test_only)
    assert not any(d.startswith(("pyspark", "pytest", "mypy", "ruff")) for d in dists), dists
    assert found["compilers"] == []
    assert found["paths"] == []
    assert found["pip_env"] == []
    base_ca = run_once(BASE_IMAGE, "sha256sum", "/etc/ssl/certs/ca-certificates.crt").split()[0]
    assert found["ca"] == base_ca, "the image's CA bundle is not the base image's own"
    config_env = podman("image", "inspect", "--format", "{{json .Config.Env}}", snapcoord_image.tag).stdout
    assert "PIP_CERT" not in config_env and "PIP_INDEX" not in config_env, config_env
