"""The environment: unknown ``SNAPCOORD_*`` variables are refused with the closest known name; the
names the repo uses are all known; the embedded store is flagged where it cannot be right."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from snapcoord.coordinator.config import environment
from snapcoord.coordinator.config.environment import (
    OTHER_VARIABLES,
    embedded_store_warnings,
    known_variables,
    unknown_variable,
)
from snapcoord.coordinator.config.options import OPTIONS, renamed_env

ROOT = Path(__file__).resolve().parents[3]
#: The docs' example of a refused variable.
MISSPELT_ON_PURPOSE = frozenset({"SNAPCOORD_METADTA"})
#: Tests whose names are refused on purpose.
REFUSAL_TESTS = frozenset(
    {
        "tests/coordinator/config/test_environment.py",
        "tests/coordinator/config/test_renamed.py",
        "tests/coordinator/test_cli.py",
    }
)


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("SNAPCOORD_METADTA", "SNAPCOORD_METADATA"),
        ("SNAPCOORD_BLOB", "SNAPCOORD_BLOBS"),
        ("SNAPCOORD_MAX_WORKER", "SNAPCOORD_MAX_WORKERS"),
        ("SNAPCOORD_TOKENFILE", "SNAPCOORD_TOKEN_FILE"),
        ("SNAPCOORD_CONFIG_FILE", "SNAPCOORD_CONFIG"),
    ],
)
def test_an_unknown_variable_is_named_with_the_closest_known_one(name: str, closest: str) -> None:
    message = unknown_variable({"PATH": "/bin", name: "zk://zk:2181/sc"})
    assert message is not None
    assert message.startswith(f"unknown environment variable {name}; did you mean {closest}?")


def test_a_name_like_no_known_one_gets_no_guess() -> None:
    message = unknown_variable({"SNAPCOORD_QQQQQQQQQQQQ": "1"})
    assert message is not None
    assert message.startswith("unknown environment variable SNAPCOORD_QQQQQQQQQQQQ (")


def test_every_setting_and_every_other_known_variable_is_accepted() -> None:
    environ = {name: "x" for name in known_variables()}
    assert unknown_variable(environ) is None
    assert {opt.env for opt in OPTIONS} <= known_variables()
    for name in ("SNAPCOORD_TOKEN", "SNAPCOORD_CLIENT_CA", "SNAPCOORD_VENV", "SNAPCOORD_REVISION"):
        assert name in known_variables()


def test_only_the_prefix_counts() -> None:
    assert unknown_variable({"SNAPCOORDX": "1", "MY_SNAPCOORD_THING": "1", "_SNAPCOORD_HARNESS": "1"}) is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SNAPCOORD_ZK_SERVICE_HOST", "10.0.0.7"),
        ("SNAPCOORD_ZK_SERVICE_PORT", "2181"),
        ("SNAPCOORD_ZK_SERVICE_PORT_CLIENT", "2181"),
        ("SNAPCOORD_ZK_PORT", "tcp://10.0.0.7:2181"),
        ("SNAPCOORD_ZK_PORT_2181_TCP", "tcp://10.0.0.7:2181"),
        ("SNAPCOORD_ZK_PORT_2181_TCP_PROTO", "tcp"),
        ("SNAPCOORD_ZK_PORT_2181_TCP_ADDR", "10.0.0.7"),
        ("SNAPCOORD_SERVICE_HOST", "10.0.0.8"),
    ],
)
def test_kubernetes_service_links_are_not_ours(name: str, value: str) -> None:
    """A Service named ``snapcoord-zk`` in the namespace puts these in every pod (service links)."""
    assert unknown_variable({name: value}) is None


def test_a_port_like_name_with_a_plain_value_is_still_refused() -> None:
    message = unknown_variable({"SNAPCOORD_HEALTH_PROT": "8081", "SNAPCOORD_ZK_PORT": "2181"})
    assert message is not None and "SNAPCOORD_HEALTH_PROT; did you mean SNAPCOORD_HEALTH_PORT?" in message


def _repo_files() -> list[Path]:
    """The repository's own files: not hidden ones (.git, .venv), not build or cache output."""
    skip = ("__pycache__", "build", "dist")
    return [
        path
        for path in ROOT.rglob("*")
        if path.is_file()
        and not any(
            p.startswith(".") or p in skip or p.endswith(".egg-info") for p in path.relative_to(ROOT).parts
        )
    ]


def _repo_names() -> dict[str, set[str]]:
    """Every ``SNAPCOORD_*`` name in the repo's files -> the files naming it."""
    found: dict[str, set[str]] = {}
    for path in _repo_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        # Not a longer name's tail (_SNAPCOORD_HARNESS_STDERR), not a family (SNAPCOORD_TLS_*).
        for m in re.finditer(r"(?<![A-Za-z0-9_])SNAPCOORD_[A-Z0-9_]*[A-Z0-9]\b(?!_?\*)", text):
            found.setdefault(m[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_name_the_repo_uses_is_known_and_every_known_name_is_used() -> None:
    """A script, a doc or a client that reads a new variable must add it to OTHER_VARIABLES (or
    the server would refuse to start in the same environment), and a name nothing uses any more
    leaves the list."""
    names = _repo_names()
    unknown = {
        name: sorted(paths - REFUSAL_TESTS)
        for name, paths in names.items()
        # A service link is known by its shape (tcp://... is what Kubernetes puts in *_PORT).
        if unknown_variable({name: "tcp://10.0.0.1:80"}) is not None
        and name not in MISSPELT_ON_PURPOSE
        and renamed_env(name) is None  # an old name the docs may mention: refused naming the new one
        and paths - REFUSAL_TESTS
    }
    assert unknown == {}, "add these to config.environment.OTHER_VARIABLES, or correct them"
    this_module = str(Path(environment.__file__).resolve().relative_to(ROOT))
    unused = [n for n in OTHER_VARIABLES if not names.get(n, set()) - {this_module}]
    assert unused == []


def test_the_embedded_store_under_kubernetes_is_flagged() -> None:
    k8s = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    (warning,) = embedded_store_warnings("file:///data/metadata", "s3://b/p", 1, k8s)
    assert "under Kubernetes on the embedded store (--metadata file://...)" in warning
    assert "set --metadata zk://... and --blobs s3://..." in warning
    (warning,) = embedded_store_warnings("zk://zk:2181/sc", "file:///data/blobs", 1, k8s)
    assert "(--blobs file://...)" in warning
    assert embedded_store_warnings("zk://zk:2181/sc", "s3://b/p", "auto", k8s) == ()
    assert embedded_store_warnings("file:///m", "file:///b", 1, {}) == ()  # a laptop: fine
    assert embedded_store_warnings("file:///m", "file:///b", 1, {"KUBERNETES_SERVICE_HOST": ""}) == ()


def test_processes_auto_on_the_embedded_store_is_flagged() -> None:
    (warning,) = embedded_store_warnings("file:///m", "s3://b/p", "auto", {})
    assert warning == (
        "--processes auto runs 1 process: the embedded metadata store serves one process; "
        "set --metadata zk://... to run one per CPU"
    )
    assert (
        len(embedded_store_warnings("file:///m", "s3://b/p", "auto", {"KUBERNETES_SERVICE_HOST": "x"})) == 2
    )
