"""``bench/upload_checkpoint.py --smoke`` runs once, so that the streaming benchmark cannot rot.

No throughput is asserted (the machine is shared and noisy): only that every figure was measured
and printed, and that the bounded-memory figure came out (the RSS test proper is
``tests/coordinator/server/test_upload_memory.py``).
"""

from __future__ import annotations

import pytest

from harness.benchmarks import run_bench

pytestmark = pytest.mark.process


def test_upload_checkpoint_benchmark_smoke_prints_every_figure() -> None:
    stdout = run_bench("upload_checkpoint", "--smoke", timeout_s=900)
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
        assert figure in stdout, f"{figure!r} missing:\n{stdout}"
