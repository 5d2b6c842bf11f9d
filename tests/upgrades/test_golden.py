"""Golden records of every release (``golden``: one stored record of each kind, written by that
release's own encoders; ``golden_010`` for 0.1.0, whose modules predate ``golden``'s) are read by
this tree, and the tree writes each kind exactly as the last release did unless the record's format
version is higher: a stored format cannot change under an old format version (``test_contracts``
then asks the changelog to name the new one).

0.1.0's records are read as the values the tree itself writes, what the changelog promises
("0.2.0 reads what 0.1.0 wrote"; replicas of both must not run together, but an upgrade of all at
once keeps every record): the reports 0.1.0 counted in a snapshot header still count, and a lease
0.1.0 wrote reads with no incarnation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from snapcoord.coordinator.domain.leases import Lease
from snapcoord.coordinator.errors import CorruptRecord
from upgrades import golden_010
from upgrades.golden import GOLDEN, SAMPLES, Sample
from upgrades.releases import read_releases

RELEASES = [r.version for r in read_releases()]
LAST = RELEASES[-1]
#: The golden files of each release: every sample's, but for 0.1.0, which wrote fewer kinds.
NAMES = {version: tuple(s.name for s in SAMPLES) for version in RELEASES} | {"0.1.0": golden_010.NAMES}
#: Every release's golden record of each kind it wrote.
CASES = [(version, s) for version in RELEASES for s in SAMPLES if s.name in NAMES[version]]


def drift(sample: Sample, old: bytes, new: bytes) -> str | None:
    """Why ``new`` (the tree's bytes of ``sample``) may not replace ``old`` (a release's), if so."""
    if new == old:
        return None
    before, after = json.loads(old)["version"], json.loads(new)["version"]
    if after > before:
        return None
    return f"{sample.name}: written unlike {LAST} under the same format version {after}: give it a new one"


def test_every_release_has_golden_records_of_every_kind_it_writes() -> None:
    for version in RELEASES:
        assert sorted(p.name for p in (GOLDEN / version).iterdir()) == sorted(NAMES[version]), version


@pytest.mark.parametrize(("version", "sample"), CASES, ids=[f"{v}-{s.name}" for v, s in CASES])
def test_this_tree_reads_every_releases_golden_record(version: str, sample: Sample) -> None:
    data = (GOLDEN / version / sample.name).read_bytes()
    try:
        sample.decode(data)
    except CorruptRecord as e:  # NewerFormat too: a release's record this tree cannot read
        pytest.fail(f"{version}'s {sample.name} is refused: {e}")


def as_0_1_0_wrote(value: object) -> object:
    """``value`` (a record the tree decoded from its own bytes) without what 0.1.0 did not store."""
    return dataclasses.replace(value, incarnation="") if isinstance(value, Lease) else value


@pytest.mark.parametrize("name", golden_010.NAMES)
def test_this_tree_reads_0_1_0s_records_as_the_values_0_1_0_wrote(name: str) -> None:
    (sample,) = [s for s in SAMPLES if s.name == name]
    read = sample.decode((GOLDEN / "0.1.0" / name).read_bytes())
    assert read == as_0_1_0_wrote(sample.decode(sample.encode()))


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
