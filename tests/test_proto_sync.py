"""The generated modules in client/src/snapcoord/v1 match proto/ (regenerated with the pinned generator)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_is_in_sync_with_the_protos() -> None:
    result = subprocess.run(
        [str(ROOT / "scripts" / "gen-proto"), "--check"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (
        "client/src/snapcoord/v1 is stale: run scripts/gen-proto and commit the result\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
