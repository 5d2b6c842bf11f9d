"""A recorded release's image, built again from the release's commit by one command
(``scripts/build-release VERSION --image``): the image of the release before this tree's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from upgrades.releases import previous

from harness.image import ROOT, BuiltImage, run_once

pytestmark = pytest.mark.process

VERSION = (ROOT / "VERSION").read_text().strip()


@pytest.mark.timeout(900)
def test_the_previous_releases_image_is_built_from_its_commit(
    snapcoord_image: BuiltImage, tmp_path: Path
) -> None:
    """``snapcoord_image`` first: the shared base is made and cached by then."""
    release = previous(VERSION)
    tag = f"localhost/snapcoord:{release.version}"
    built = subprocess.run(
        ["bash", "scripts/build-release", release.version, "--out", str(tmp_path), "--image"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    assert run_once(tag, "snapcoord", "--version").strip() == f"snapcoord {release.version}"
    assert run_once(tag, "printenv", "SNAPCOORD_REVISION").strip() == release.commit
    # The wheels beside it are the release's own, checked by their sums.
    assert subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=tmp_path).returncode == 0
