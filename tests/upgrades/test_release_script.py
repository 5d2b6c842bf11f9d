"""``scripts/release`` on a clone of this repository: a release is one commit, recorded in RELEASES
and tagged, after which the tree says the next development version; a tree that is not ready (a
format change its changelog does not name, uncommitted changes, a version that is not the
release's) is refused with nothing committed. The clone holds this tree's last commit: uncommitted
changes (to the scripts too) are not what it runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from upgrades.releases import release_of

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
#: The version tests the release's gate runs (the previous-release install has its own tests).
GATE = "tests/test_versions.py tests/upgrades/test_contracts.py tests/upgrades/test_golden.py"


def git(clone: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(clone), *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()


@pytest.fixture
def clone(tmp_path: Path) -> Iterator[Path]:
    """A clone of this commit, on a branch, with the tree's development version."""
    path = tmp_path / "repo"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(path)], check=True, timeout=300
    )
    git(path, "checkout", "--quiet", "-B", "main", git(ROOT, "rev-parse", "HEAD"))
    git(path, "config", "user.email", "release-test@example.invalid")
    git(path, "config", "user.name", "release test")
    yield path


def release(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SNAPCOORD_VENV": str(Path(sys.executable).parents[1]),
        "SNAPCOORD_RELEASE_GATE": GATE,
    }
    # --no-install: the clone shares this tree's venv, which must keep pointing at this tree.
    return subprocess.run(
        ["bash", "scripts/release", *args, "--no-install"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def test_a_release_is_one_recorded_commit_and_the_tree_moves_on(clone: Path) -> None:
    assert release_of(VERSION) != VERSION, "the repository says a released number"
    number = release_of(VERSION)
    major, minor, _ = number.split(".")
    following = f"{major}.{int(minor) + 1}.0"
    before = git(clone, "rev-parse", "HEAD")
    done = release(clone, number)
    assert done.returncode == 0, done.stderr[-3000:]

    made = git(clone, "rev-parse", "HEAD~1")
    assert git(clone, "rev-parse", "HEAD~2") == before
    assert git(clone, "show", f"{made}:VERSION") == number
    assert git(clone, "rev-parse", f"v{number}^{{commit}}") == made
    assert git(clone, "cat-file", "-t", f"v{number}") == "tag"  # annotated
    # Only the release commit says the released number; RELEASES names it.
    assert (clone / "VERSION").read_text().strip() == f"{following}.dev0"
    assert (clone / "RELEASES").read_text().splitlines()[-1] == f"{number} {made}"
    headings = re.findall(r"^## .*$", (clone / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings[:2] == [f"## {following} (unreleased)", f"## {number}"]
    made_changelog = git(clone, "show", f"{made}:CHANGELOG.md")
    assert f"## {number}\n" in made_changelog and "(unreleased)" not in made_changelog
    # The release commit carries its contract and golden records, which the moved-on tree keeps.
    assert (clone / "tests/upgrades/contracts" / f"{number}.json").exists()
    assert (clone / "tests/upgrades/golden" / number / "lease.json").exists()
    for path in ("client/pyproject.toml", "deploy/kubernetes/base/deployment.yaml"):
        assert (
            number in git(clone, "show", f"{made}:{path}")
            and f"{following}.dev0" in (clone / path).read_text()
        )
    # Both commits pass the version and contract tests.
    for commit in (made, "main"):
        git(clone, "checkout", "--quiet", commit)
        pytest_args = ["-n", "0", "-q", "-p", "no:cacheprovider", *GATE.split()]
        checked = subprocess.run(
            [sys.executable, "-m", "pytest", *pytest_args, "-k", "not installed_packages_are_this_version"],
            cwd=clone,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert checked.returncode == 0, (commit, checked.stdout[-3000:])


def test_a_format_change_the_changelog_does_not_name_is_refused(clone: Path) -> None:
    leases = clone / "coordinator/src/snapcoord/coordinator/domain/leases.py"
    leases.write_text(leases.read_text().replace("LEASE_VERSION = 1", "LEASE_VERSION = 7"))
    git(clone, "commit", "--quiet", "-am", "leases in a new format, not in the changelog")
    head = git(clone, "rev-parse", "HEAD")
    refused = release(clone, release_of(VERSION))
    assert refused.returncode != 0
    assert "storage: leases.LEASE_VERSION 1 -> 7" in refused.stdout + refused.stderr
    assert git(clone, "rev-parse", "HEAD") == head and git(clone, "status", "--porcelain") == ""
    assert git(clone, "tag", "--list") == ""


@pytest.mark.parametrize("problem", ["dirty", "not-this-version"])
def test_a_tree_not_ready_is_refused_before_anything_changes(clone: Path, problem: str) -> None:
    number = release_of(VERSION)
    if problem == "dirty":
        (clone / "README.md").write_text("edited\n")
    else:
        number = "9.9.9"
    head = git(clone, "rev-parse", "HEAD")
    refused = release(clone, number)
    assert refused.returncode != 0
    assert ("uncommitted changes" if problem == "dirty" else "not a development version") in refused.stderr
    assert git(clone, "rev-parse", "HEAD") == head
