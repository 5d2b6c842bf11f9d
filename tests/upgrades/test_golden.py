"""Golden records of every release (``golden``: one stored record of each kind, written by that
release's own encoders) are read by this tree, and the tree writes each kind exactly as the last
release did unless the record's format version is higher: a stored format cannot change under an
old format version (``test_contracts`` then asks the changelog to name the new one)."""

from __future__ import annotations

import json

import pytest

from snapcoord.coordinator.errors import CorruptRecord
from upgrades.golden import GOLDEN, SAMPLES, Sample
from upgrades.releases import read_releases, version_key

#: Releases whose golden records exist: every one from 0.2.0 (0.1.0's records are read by the
#: coordinator's own format tests; its encoders predate these samples' names).
FIRST_WITH_GOLDEN = "0.2.0"
RELEASES = [r.version for r in read_releases() if version_key(r.version) >= version_key(FIRST_WITH_GOLDEN)]
LAST = RELEASES[-1]


def drift(sample: Sample, old: bytes, new: bytes) -> str | None:
    """Why ``new`` (the tree's bytes of ``sample``) may not replace ``old`` (a release's), if so."""
    if new == old:
        return None
    before, after = json.loads(old)["version"], json.loads(new)["version"]
    if after > before:
        return None
    return f"{sample.name}: written unlike {LAST} under the same format version {after}: give it a new one"


def test_every_release_from_the_first_with_golden_records_has_them() -> None:
    for version in RELEASES:
        assert sorted(p.name for p in (GOLDEN / version).iterdir()) == sorted(s.name for s in SAMPLES), (
            version
        )


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_this_tree_reads_every_releases_golden_record(version: str, sample: Sample) -> None:
    data = (GOLDEN / version / sample.name).read_bytes()
    try:
        sample.decode(data)
    except CorruptRecord as e:  # NewerFormat too: a release's record this tree cannot read
        pytest.fail(f"{version}'s {sample.name} is refused: {e}")


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_this_tree_writes_as_the_last_release_or_under_a_new_format_version(sample: Sample) -> None:
    assert drift(sample, (GOLDEN / LAST / sample.name).read_bytes(), sample.encode()) is None


def test_a_format_change_under_the_same_version_is_caught() -> None:
    sample = SAMPLES[0]
    old = (GOLDEN / LAST / sample.name).read_bytes()
    doc = json.loads(old)
    changed = json.dumps({**doc, "holder": "x"}, sort_keys=True, separators=(",", ":")).encode()
    assert "under the same format version" in (drift(sample, old, changed) or "")
    bumped = json.dumps({**doc, "holder": "x", "version": doc["version"] + 1}).encode()
    assert drift(sample, old, bumped) is None
