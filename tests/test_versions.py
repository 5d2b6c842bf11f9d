"""One version: VERSION is the source of truth, and every place that writes the version (the three
packages, the client pins, the Kubernetes image tag, the changelog, the installed packages) says the
same; the upgrade notes name only versions the changelog lists (``scripts/set-version`` sets them).

A released number names one commit (RELEASES): every other commit says a development version
(X.Y.Z.devN) of the next release, whose changelog section is marked unreleased."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from upgrades.releases import RELEASED_NUMBER, read_releases, release_of, version_key

ROOT = Path(__file__).resolve().parents[1]
VERSION = (ROOT / "VERSION").read_text().strip()
PACKAGES = {"client": "snapcoord-client", "coordinator": "snapcoord", "spark_connector": "snapcoord-spark"}
#: A changelog section's heading: a release, or the next release while it is being developed.
HEADING = re.compile(r"^## (\d+\.\d+\.\d+)( \(unreleased\))?$", re.MULTILINE)


def _changelog_versions() -> list[str]:
    return [m[0] for m in HEADING.findall((ROOT / "CHANGELOG.md").read_text())]


def test_version_is_a_release_or_development_number_after_every_release() -> None:
    """A released number is said only by its own commit (before RELEASES can name it); once it
    is recorded, the version is the next release's development version, so an unreleased build
    never calls itself by a released number."""
    release = release_of(VERSION)
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", VERSION), VERSION
    recorded = {r.version for r in read_releases()}
    assert release not in recorded, (
        f"{release} is released (RELEASES): scripts/set-version X.Y.Z.dev0 (the next)"
    )
    assert all(version_key(release) > version_key(r) for r in recorded), (release, recorded)


def test_releases_names_each_version_once_oldest_first_with_a_full_commit() -> None:
    releases = read_releases()
    versions = [r.version for r in releases]
    assert versions == sorted(versions, key=version_key) and len(set(versions)) == len(versions)
    assert all(RELEASED_NUMBER.fullmatch(v) for v in versions), versions
    assert all(re.fullmatch(r"[0-9a-f]{40}", r.commit) for r in releases)
    assert len({r.commit for r in releases}) == len(releases)
    assert {"0.1.0", "0.2.0", "0.3.0"} <= set(versions)


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
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = HEADING.findall(text)
    listed = [version for version, _ in headings]
    assert listed[0] == release_of(VERSION)
    # Only the first section may be unreleased, and only while VERSION is a development version.
    developing = release_of(VERSION) != VERSION
    assert [bool(unreleased) for _, unreleased in headings] == [developing] + [False] * (len(headings) - 1)
    assert len(listed) == len(set(listed))
    assert set(listed) >= {r.version for r in read_releases()}
    for release, unreleased in headings:  # each release states both contracts
        section = text.split(f"## {release}{unreleased}\n", 1)[1].split("\n## ", 1)[0]
        assert "Wire" in section and "Storage" in section, release


def test_upgrade_notes_name_only_released_versions() -> None:
    listed = set(_changelog_versions())
    upgrades = (ROOT / "docs/operations/upgrades.md").read_text()
    named = set(re.findall(r"\b(\d+\.\d+\.\d+)\b", upgrades))
    assert named and named <= listed, named - listed
    for doc in ("README.md", "docs/design.md"):  # "v0.1"-style mentions elsewhere
        for short in re.findall(r"\bv(\d+\.\d+(?:\.\d+)?)\b", (ROOT / doc).read_text()):
            assert (short if short.count(".") == 2 else f"{short}.0") in listed, (doc, short)
