"""The three distributions keep their promises: one top-level name, a thin client, a connector
that depends on the client only."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTS = {"client": "snapcoord_client", "coordinator": "snapcoord", "spark_connector": "snapcoord_spark"}


def _requirements(project: str) -> list[str]:
    """The distribution names a project depends on (no versions, no extras)."""
    meta = tomllib.loads((ROOT / project / "pyproject.toml").read_text())
    return [re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in meta["project"]["dependencies"]]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            *(str(ROOT / d) for d in DISTS),
        ],
        check=True,
    )
    found = {}
    for project, stem in DISTS.items():
        (wheel,) = out.glob(f"{stem}-*.whl")
        found[project] = wheel
    return found


def test_client_depends_on_grpcio_and_protobuf_only() -> None:
    assert sorted(_requirements("client")) == ["grpcio", "protobuf"]


def test_spark_connector_depends_on_the_client_only() -> None:
    assert _requirements("spark_connector") == ["snapcoord-client"]
    for source in (ROOT / "spark_connector" / "src").rglob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("snapcoord.coordinator", "kazoo", "boto3")), (source, name)


@pytest.mark.process
def test_every_wheel_claims_only_the_snapcoord_name(wheels: dict[str, Path]) -> None:
    for project, wheel in wheels.items():
        with zipfile.ZipFile(wheel) as zf:
            tops = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" not in n}
        assert tops == {"snapcoord"}, (project, tops)


@pytest.mark.process
def test_client_wheel_carries_the_api_but_not_the_coordinator(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels["client"]) as zf:
        names = set(zf.namelist())
    for module in ("producer", "snapshot", "lease", "backlog", "common"):
        assert f"snapcoord/v1/{module}_pb2.py" in names
        assert f"snapcoord/v1/{module}_pb2.pyi" in names
    assert "snapcoord/client/__init__.py" in names
    assert not any(n.startswith("snapcoord/coordinator/") for n in names)
    # snapcoord/ itself stays a namespace package shared by the three distributions.
    assert "snapcoord/__init__.py" not in names


@pytest.mark.process
def test_importing_the_client_loads_no_server_dependency() -> None:
    heavy = ("kazoo", "boto3", "botocore", "pyspark", "snapcoord.coordinator", "prometheus_client")
    code = (
        "import sys, snapcoord.client, snapcoord.v1.producer_pb2_grpc, snapcoord.v1.snapshot_pb2_grpc,"
        " snapcoord.v1.lease_pb2_grpc, snapcoord.v1.backlog_pb2_grpc\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == ""
