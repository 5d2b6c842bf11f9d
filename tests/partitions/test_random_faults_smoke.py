"""``bench/random_faults.py --smoke``: the long mode's cluster, one scenario, its table row.

The long mode itself (minutes of random partitions) stays outside CI; this keeps it from rotting.
No timing is asserted: the run must exit 0 and print the scenario's row and its summary.
"""

from __future__ import annotations

import pytest

from harness.benchmarks import run_bench

pytestmark = [pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.process, pytest.mark.timeout(900)]


def test_random_faults_smoke() -> None:
    stdout = run_bench("random_faults", "--smoke", timeout_s=600)
    assert "| zkleader |" in stdout, stdout[-4000:]
    assert "1 scenarios, 0 failed" in stdout, stdout[-4000:]
