"""One version: VERSION is the source of truth, and every place that writes the version (the three
packages, the client pins, the Kubernetes image tag, the changelog, the installed packages) says the
same; the upgrade notes name only versions the changelog lists (``scripts/set-version`` sets them)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = (ROOT / "VERSION").read_text().strip()
PACKAGES = {"client": "snapcoord-client", "coordinator": "snapcoord", "spark_connector": "snapcoord-spark"}


def _changelog_versions() -> list[str]:
    return re.findall(r"^## (\d+\.\d+\.\d+)$", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)


def test_version_is_a_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_every_package_has_the_version_and_pins_the_client_at_it(folder: str) -> None:
    project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
    assert (project["name"], project["version"]) == (PACKAGES[folder], VERSION)
    pins = [d for d in project.get("dependencies", []) if d.startswith("snapcoord-client")]
    assert pins in ([], [f"snapcoord-client=={VERSION}"])


@pytest.mark.parametrize("name", sorted(PACKAGES.values()))
def test_the_installed_packages_are_this_version(name: str) -> None:
    assert version(name) == VERSION, f"{name} is installed at another version: bash scripts/install-test-deps"


def test_the_kubernetes_image_tag_is_the_version() -> None:
    base = (ROOT / "deploy/kubernetes/base/deployment.yaml").read_text()
    assert re.findall(r"image: snapcoord:(\S+)", base) == [VERSION]
    example = (ROOT / "deploy/kubernetes/overlays/example/kustomization.yaml").read_text()
    assert re.findall(r"newTag: (\S+)", example) == [VERSION]


def test_the_changelog_opens_with_this_version_and_lists_each_once() -> None:
    listed = _changelog_versions()
    assert listed[0] == VERSION
    assert len(listed) == len(set(listed))
    text = (ROOT / "CHANGELOG.md").read_text()
    for release in listed:  # each release states both contracts
        section = text.split(f"## {release}\n", 1)[1].split("\n## ", 1)[0]
        assert "Wire" in section and "Storage" in section, release


def test_upgrade_notes_name_only_released_versions() -> None:
    listed = set(_changelog_versions())
    upgrades = (ROOT / "docs/operations/upgrades.md").read_text()
    named = set(re.findall(r"\b(\d+\.\d+\.\d+)\b", upgrades))
    assert named and named <= listed, named - listed
    for doc in ("README.md", "docs/design.md"):  # "v0.1"-style mentions elsewhere
        for short in re.findall(r"\bv(\d+\.\d+(?:\.\d+)?)\b", (ROOT / doc).read_text()):
            assert (short if short.count(".") == 2 else f"{short}.0") in listed, (doc, short)
