"""A stored format or the wire cannot change under a released number: the tree's contract (wire and
storage, ``contract``) is the one recorded for its version when VERSION is a released number, and
otherwise every change from the last release's is named in the changelog's unreleased section.
The recorded contracts are those of the commits RELEASES names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from upgrades.contract import (
    CONTRACTS,
    Contract,
    commit_files,
    contract_of,
    recorded,
    tree_files,
    undocumented,
)
from upgrades.releases import RELEASED_NUMBER, Release, previous, read_releases, version_key

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()


def first_section() -> str:
    """The changelog's first section: the one of this tree's version (its heading, then its text)."""
    return re.split(r"^## ", (ROOT / "CHANGELOG.md").read_text(), flags=re.MULTILINE)[1]


def contract_problems(version: str, tree: Contract, section: str) -> list[str]:
    """Why the tree (at ``version``; ``section`` is its changelog section) breaks the rule: under a
    released number its contract is the one recorded for it, and every change since the release
    before is named in its section (``undocumented``)."""
    problems = []
    if RELEASED_NUMBER.fullmatch(version):
        mine = recorded(version)
        if mine is None:
            problems.append(
                f"VERSION {version} is a released number with no recorded contract: scripts/release"
            )
        elif mine != tree:
            problems.append(f"the tree's contract changed under the released number {version}")
    last = previous(version)
    before = recorded(last.version)
    assert before is not None, f"no contract recorded for {last.version} in {CONTRACTS}"
    if before != tree:
        problems += [f"not in the changelog section: {line}" for line in undocumented(before, tree, section)]
    return problems


def test_the_tree_keeps_the_last_releases_contract_or_the_changelog_names_each_change() -> None:
    assert contract_problems(VERSION, contract_of(tree_files()), first_section()) == []


def test_every_recorded_release_has_its_contract() -> None:
    """And the release being made (VERSION a released number, not yet in RELEASES) has its own."""
    expected = {r.version for r in read_releases()} | (
        {VERSION} if RELEASED_NUMBER.fullmatch(VERSION) else set()
    )
    assert sorted(p.stem for p in CONTRACTS.glob("*.json")) == sorted(expected)


@pytest.mark.process  # git
@pytest.mark.parametrize("release", read_releases(), ids=lambda r: r.version)
def test_a_recorded_contract_is_its_release_commits(release: Release) -> None:
    assert recorded(release.version) == contract_of(commit_files(release.commit))


# --- the check catches what it is for -------------------------------------------------------------

BASE = Contract(("field snapcoord.v1.Lease.lease_id = 1 optional string",), {"leases.LEASE_VERSION": 1})
NEW_FIELD = Contract((*BASE.wire, "field snapcoord.v1.Lease.holder = 7 optional string"), BASE.storage)
NEW_FORMAT = Contract(BASE.wire, {"leases.LEASE_VERSION": 2})


@pytest.mark.parametrize("change", ["wire", "storage"])
def test_a_change_under_a_released_number_is_refused(change: str) -> None:
    """The 0.2.0 story: a format change (or a wire addition) while VERSION still reads a released
    number whose contract is recorded."""
    last = max(read_releases(), key=lambda r: version_key(r.version)).version
    tree = recorded(last)
    assert tree is not None
    if change == "wire":
        planted = Contract((*tree.wire, *NEW_FIELD.wire[1:]), tree.storage)
    else:
        planted = Contract(tree.wire, {**tree.storage, **NEW_FORMAT.storage})
    assert f"the tree's contract changed under the released number {last}" in contract_problems(
        last, planted, ""
    )
    # A release being made records its contract first; one set by hand has none.
    assert "no recorded contract" in contract_problems("99.0.0", tree, "")[0]


def test_a_development_version_names_each_change_in_its_changelog_section() -> None:
    assert undocumented(BASE, NEW_FIELD, "**Wire**: new field `Lease.owner`.") == [
        "wire: added field snapcoord.v1.Lease.holder = 7 optional string"
    ]
    assert undocumented(BASE, NEW_FIELD, "**Wire**: new field `holder` of `Lease`.") == []
    assert undocumented(BASE, NEW_FIELD, "**Wire**: new field `Lease.holder`.") == []
    assert undocumented(BASE, NEW_FORMAT, "**Storage**: leases change.") == [
        "storage: leases.LEASE_VERSION 1 -> 2"
    ]
    assert undocumented(BASE, NEW_FORMAT, "**Storage**: leases are written in format version 2.") == []
    removed = undocumented(NEW_FIELD, BASE, "Nothing.")
    assert removed == ["wire: removed field snapcoord.v1.Lease.holder = 7 optional string"]
