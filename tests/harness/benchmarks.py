"""Running a benchmark of ``bench/`` the way ``bench/run`` does, for the smoke tests that keep
every benchmark from rotting (no timing is asserted on a shared, noisy machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, *args: str, timeout_s: float = 1800) -> str:
    """Run ``bench/<script>.py *args`` with this interpreter; its output, once it exited with 0
    (otherwise the assertion shows the end of its output)."""
    done = subprocess.run(
        [sys.executable, f"{script}.py", *args],
        cwd=BENCH,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, (
        f"bench/{script}.py {' '.join(args)}:\n" + done.stdout[-4000:] + done.stderr[-4000:]
    )
    return done.stdout
