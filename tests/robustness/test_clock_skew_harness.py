"""tests/harness/clock.py: what a process under ``skewed_env`` sees; the error without libfaketime."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import clock as clock_harness
from harness.clock import SkewedClock, skewed_env
from harness.process import HarnessError

# Prints its wall and monotonic clocks, sleeps (time.sleep must work), waits for the test to move
# the offset, prints them again.
CHILD = """
import json, sys, time
def show(): print(json.dumps({"wall": time.time(), "mono": time.monotonic()}), flush=True)
show()
time.sleep(0.05)
sys.stdin.readline()
show()
"""


@pytest.mark.process
def test_a_skewed_process_sees_the_offset_move_while_monotonic_time_and_sleep_stay_real(
    tmp_path: Path,
) -> None:
    clock = SkewedClock(tmp_path / "offset")
    clock.set(30)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env={**skewed_env(clock), "PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    first = json.loads(child.stdout.readline())
    real, mono = time.time(), time.monotonic()
    assert 29 < first["wall"] - real < 31
    assert abs(first["mono"] - mono) < 5  # the same real monotonic clock as this process
    clock.set(-20)
    child.stdin.write("go\n")
    child.stdin.flush()
    second = json.loads(child.stdout.readline())
    assert -21 < second["wall"] - time.time() < -19
    assert second["mono"] >= first["mono"]
    assert child.wait(timeout=30) == 0  # time.sleep did not fail


def test_without_libfaketime_the_error_names_the_install_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock_harness, "LIBFAKETIME_DIRS", (Path("/nonexistent"),))
    with pytest.raises(HarnessError, match="scripts/install-test-deps"):
        clock_harness.libfaketime()
