"""The built image on real ZooKeeper and S3 (the harness's servers on this machine's loopback, which the
container reaches at 10.0.2.2): the tour's registrations, snapshots, backlog and leases, ``snapcoord
check-config`` inside, and a restart of the container that finds everything it stored.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_readme_tour import STEPS

from harness.image import (
    HOST_LOOPBACK,
    BuiltImage,
    Container,
    data_volume,
    record_serving,
    run_tour,
    tools_path,
)
from harness.ports import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

CURRENT = "snapcoord.v1.SnapshotService/GetCurrentSnapshot"


def from_the_container(address: str) -> str:
    """An address of this machine's loopback as the container reaches it."""
    return address.replace("127.0.0.1", HOST_LOOPBACK).replace("localhost", HOST_LOOPBACK)


def current_snapshot(grpc_port: int) -> str:
    done = subprocess.run(
        [
            "grpcurl",
            "-plaintext",
            "-d",
            '{"app_id": "clickstream", "consistent": true}',
            f"127.0.0.1:{grpc_port}",
            CURRENT,
        ],
        capture_output=True,
        text=True,
        env=tools_path(),
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_image_on_zookeeper_and_s3_serves_the_tour_checks_its_config_and_restarts_with_its_data(
    snapcoord_image: BuiltImage,
    zk_uri: str,
    s3_uri: str,
    s3_client: S3Client,
    tmp_path: Path,
    image_report: list[str],
) -> None:
    grpc_port, metrics_port = free_port(), free_port()
    env = {
        "SNAPCOORD_METADATA": from_the_container(zk_uri),
        "SNAPCOORD_BLOBS": s3_uri,
        "AWS_ENDPOINT_URL_S3": from_the_container(os.environ["AWS_ENDPOINT_URL_S3"]),
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": os.environ["AWS_DEFAULT_REGION"],
    }
    with Container(
        snapcoord_image.tag,
        name=f"snapcoord-stores-{uuid.uuid4().hex[:8]}",
        publish={50051: grpc_port, 9464: metrics_port},
        volumes=[data_volume(tmp_path / "data")],
        read_only=True,
        env=env,
    ) as running:
        record_serving(running, image_report, "ZooKeeper + S3")
        run_tour(STEPS, grpc_port, metrics_port)
        before = current_snapshot(grpc_port)
        assert '"generation": "1"' in before, before

        checked = running.exec("snapcoord", "check-config", timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr

        bucket, _, prefix = s3_uri.removeprefix("s3://").partition("/")
        stored = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0)
        assert stored > 0, f"nothing under {s3_uri}"

        assert running.stop() == 0, running.logs()
        running.restart()
        record_serving(running, image_report, "ZooKeeper + S3, restarted")
        assert current_snapshot(grpc_port) == before
