"""``bench/upload_checkpoint.py --smoke`` runs once, so that the streaming benchmark cannot rot.

No throughput is asserted (the machine is shared and noisy): only that every figure was measured
and printed, and that the bounded-memory figure came out (the RSS test proper is
``tests/coordinator/test_upload_memory.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_upload_checkpoint_benchmark_smoke_prints_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, "upload_checkpoint.py", "--smoke"],
        cwd=ROOT / "bench",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for figure in (
        "raw S3 multipart put",
        "raw S3 get",
        "in: UploadCheckpoint",
        "out: ReadCheckpoint",
        "ratio in ",
        "ratio out ",
        "2 clients at once:",
        "peak ",
    ):
        assert figure in done.stdout, f"{figure!r} missing:\n{done.stdout}"
