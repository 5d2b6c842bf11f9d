"""Every release can be installed again: the previous one is built from the commit RELEASES names
(git history, no tags) by ``scripts/build-release`` and installed in a venv as its image installs
it; what is installed says the release's version and carries the wire and storage contract
recorded for it. The upgrade tests run this install."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from upgrades.contract import contract_of, recorded
from upgrades.installed import DISTRIBUTIONS, InstalledRelease

pytestmark = pytest.mark.process

#: Where each top-level folder of the installed ``snapcoord`` namespace lives in a source tree.
SOURCE_OF = {
    "v1": "client/src",
    "client": "client/src",
    "coordinator": "coordinator/src",
    "spark_connector": "spark_connector/src",
}


def installed_files(release: InstalledRelease) -> dict[str, bytes]:
    """The installed release's Python files, named by their paths in its source tree."""
    site = release.site_packages()
    found = {}
    for path in (site / "snapcoord").rglob("*.py"):
        relative = path.relative_to(site)
        found[f"{SOURCE_OF[relative.parts[1]]}/{relative.as_posix()}"] = path.read_bytes()
    return found


def test_the_previous_release_says_its_version(previous_release: InstalledRelease) -> None:
    version = previous_release.release.version
    assert previous_release.versions() == dict.fromkeys(DISTRIBUTIONS, version)
    out = subprocess.run(
        [str(previous_release.snapcoord), "--version"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == f"snapcoord {version}"


def test_the_installed_release_has_its_recorded_contract(previous_release: InstalledRelease) -> None:
    """What the wheels built from the commit carry is what RELEASES' contract says of it."""
    contract = contract_of(installed_files(previous_release))
    assert contract.wire and contract.storage
    assert contract == recorded(previous_release.release.version)


def test_its_wheels_and_sdists_are_listed_with_their_hashes(previous_release: InstalledRelease) -> None:
    dist = previous_release.venv.parent / "dist"
    version = previous_release.release.version
    listed = {line.split()[1] for line in (dist / "SHA256SUMS").read_text().splitlines()}
    for name in DISTRIBUTIONS:
        assert {f"{name}-{version}-py3-none-any.whl", f"{name}-{version}.tar.gz"} <= listed
    assert (dist / "BUILT_FROM").read_text().split() == [version, previous_release.release.commit]
    subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=dist, check=True, timeout=120)
    assert Path(previous_release.snapcoord).exists()
