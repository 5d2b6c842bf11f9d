"""The previous release, installed once per session from its commit (``installed``; cached on disk
across sessions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from upgrades.installed import InstalledRelease, install
from upgrades.releases import previous

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def previous_release() -> InstalledRelease:
    """The newest release before this tree's version, in its own venv."""
    return install(previous((ROOT / "VERSION").read_text().strip()))
