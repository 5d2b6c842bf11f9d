"""Histories of a real cluster (3-node ZooKeeper, 2 replicas, SeaweedFS) checked against the model:
clean under process faults, and each planted bug caught with its anomaly kind.

``ROBUSTNESS_SECONDS`` (default 10) sets the length of the faulted run: the long mode is the same
test with minutes (docs/robustness/histories.md).
"""

from __future__ import annotations

import os
import secrets
import time

import pytest

from harness.cluster import REPLICA_FLAGS, Cluster, Replica
from robustness.checker import check
from robustness.history import History
from robustness.planted import BUGS, planted_command
from robustness.runner import MARGIN_S, run_checked
from robustness.workload import Workload, final_reader

SECONDS = float(os.environ.get("ROBUSTNESS_SECONDS", "10"))
SEED = int(os.environ.get("ROBUSTNESS_SEED", "0")) or secrets.randbelow(1 << 30)
PLANTED_SECONDS = 6.0
PLANTED_ROUNDS = 3


# The long mode outlasts the suite's per-test timeout: allow the run, its heal and its check.
@pytest.mark.timeout(int(300 + 2 * SECONDS))
def test_histories_under_process_faults_have_no_anomaly(cluster: Cluster) -> None:
    report, history, faults = run_checked(
        cluster, seconds=SECONDS, seed=SEED, prefix=f"h{secrets.token_hex(3)}"
    )
    outcomes = {o: sum(1 for x in history if x.outcome == o) for o in ("ok", "fail", "info")}
    print(f"seed {SEED}: outcomes {outcomes}; {faults}")  # shown with -s or -rP
    if not report.ok:
        history.dump(cluster.workdir / "history.jsonl")  # for a look at what the run did
    assert report.ok, (
        f"seed {SEED}; faults: {faults}; outcomes {outcomes}; history in {cluster.workdir}\n{report}"
    )
    # The run did something: most calls were answered, and every kind of record was written.
    assert outcomes["ok"] > 100, outcomes
    assert any("undone" in what for _, what in faults.events), f"no fault was injected: {faults}"
    assert {o.kind for o in history if o.outcome == "ok"} == {"producer", "snapshot", "lease", "backlog"}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_is_caught(cluster: Cluster, bug: str) -> None:
    chroot = f"planted-{bug}-{secrets.token_hex(3)}"
    args = ["--metadata", cluster.ensemble.uri(chroot), "--blobs", cluster.blobs_uri, *REPLICA_FLAGS]
    replica = Replica(cluster.workdir / chroot, args=args, start_timeout_s=120, command=planted_command(bug))
    replica.start()
    expected = BUGS[bug][1]
    try:
        # The workload is random and some bugs need a timing (a renewal just past an expiry): up
        # to PLANTED_ROUNDS runs, each with its own seed and keys, until one shows the bug.
        for round_ in range(PLANTED_ROUNDS):
            history = History()
            # Three threads keep short leases of their own: a renewal past expiry needs a few tries.
            workload = Workload(
                [replica.target],
                history,
                threads=8,
                keys=2,
                seed=SEED + round_,
                prefix=f"pl{round_}",
                retention=True,
                slow_leases=3,
            )
            with workload:
                time.sleep(PLANTED_SECONDS)  # the length of the load, not a wait for a condition
            assert replica.alive(), replica.workdir
            report = check(history, final_reader([replica.target]), margin_s=MARGIN_S)
            if expected in report.kinds():
                break
    finally:
        replica.kill()
    if expected not in report.kinds():
        history.dump(replica.workdir / "history.jsonl")  # for a look at what the run did
    assert expected in report.kinds(), (
        f"seed {SEED}: {bug} not caught as {expected} ({replica.workdir})\n{report}"
    )
