"""``bench/soak.py --minutes 2``: the soak's own servers, faults and history checks, in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_two_minute_soak_loses_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "2"],
        cwd=ROOT / "bench",
        capture_output=True,
        text=True,
        timeout=840,
    )
    print(proc.stdout)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "fault:" in proc.stdout  # at least one fault was injected
    assert ": 0 lost, 0 dangling, 0 create-if-absent violations, bad codes {}" in proc.stdout
