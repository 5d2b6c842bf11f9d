"""The golden records are each release's own bytes: every recorded release, installed from its
commit, writes its golden folder again, the same (``golden_010.py`` for 0.1.0, ``golden.py`` for
the others). Kept apart from ``test_golden``, which the release script's gate runs without
installing releases."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from upgrades import golden, golden_010
from upgrades.installed import install
from upgrades.releases import find
from upgrades.test_golden import NAMES, RELEASES

pytestmark = pytest.mark.process


@pytest.mark.parametrize("version", RELEASES)
def test_a_releases_golden_records_are_what_it_writes(version: str, tmp_path: Path) -> None:
    release = install(find(version))
    writer = golden_010 if version == "0.1.0" else golden
    subprocess.run([str(release.python), str(writer.__file__), str(tmp_path)], check=True, timeout=120)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NAMES[version])
    for name in NAMES[version]:
        assert (tmp_path / name).read_bytes() == (golden.GOLDEN / version / name).read_bytes(), name
