"""Soak: mixed load on 3 coordinator replicas over a 3-node ZooKeeper ensemble, with a fault every
few minutes, then the history checks of the failure tests.

    bench/run soak [--minutes 30] [--fault-every 3] [--workers 3] [--keep DIR]

Faults rotate through: kill the ZooKeeper leader, kill a coordinator replica, kill the janitor
leader, lose the ZooKeeper quorum for a while (2 of 3 nodes down), freeze a replica past its
session timeout (SIGSTOP). Each is healed before the next. Printed: per fault the share of calls
that succeeded while it lasted, the time to recover and the slowest call (the client retries
UNAVAILABLE within its deadline, so an outage shows as slow calls as much as failed ones); the
replicas' RSS every minute (a leak shows as steady growth); at the end acknowledged writes lost,
records pointing at missing S3 objects and create-if-absent violations, all of which must be 0
(exit status 1 otherwise). ``--keep DIR`` copies the call histories there, to look into a failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the harness that starts real ZooKeeper and SeaweedFS

from harness.cluster import NOT_SERVING, Cluster  # noqa: E402
from harness.mixedload import MixedLoad, check_history, window  # noqa: E402
from harness.process import install_sigterm_cleanup, wait_until  # noqa: E402
from harness.seaweed import SeaweedS3Server  # noqa: E402
from snapcoord.client import CoordinatorClient  # noqa: E402

WAIT_S = 180.0


def zk_leader(c: Cluster) -> str:
    leader = c.ensemble.wait_quorum()
    leader.kill()
    c.ensemble.wait_quorum(timeout=WAIT_S)
    leader.start()
    c.ensemble.wait_quorum(timeout=WAIT_S)
    return f"zk leader (node {leader.myid})"


def replica(c: Cluster) -> str:
    c.replicas[1].kill()
    return "coordinator replica 1"


def janitor_leader(c: Cluster) -> str:
    i = c.janitor_leader(timeout=WAIT_S)
    c.replicas[i].kill()
    wait_until(lambda: any(r.is_janitor_leader() for r in c.replicas if r.alive()), timeout=WAIT_S,
               interval=0.2, what="another janitor leader")  # fmt: skip
    return f"janitor leader (replica {i})"


def quorum(c: Cluster) -> str:
    leader = c.ensemble.wait_quorum()
    down = [*[n for n in c.ensemble.nodes if n is not leader][:1], leader]
    for node in down:
        node.kill()
    c.wait_health(NOT_SERVING, timeout=WAIT_S)
    time.sleep(5)  # a soak keeps the outage on for a while; tests wait on conditions instead
    for node in down:
        node.start()
    c.ensemble.wait_quorum(timeout=WAIT_S)
    return "zk quorum (2 of 3 nodes down)"


def freeze(c: Cluster) -> str:
    r = c.replicas[2]
    r.pause()
    time.sleep(8)  # past the 4 s session timeout
    r.resume()
    return "replica 2 frozen 8 s (SIGSTOP)"


FAULTS: tuple[Callable[[Cluster], str], ...] = (zk_leader, replica, janitor_leader, quorum, freeze)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--fault-every", type=float, default=3.0, help="minutes between faults")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--pause", type=float, default=0.02, help="seconds each worker waits between cycles")
    parser.add_argument("--keep", type=Path, default=None, help="copy the call histories (JSON lines) here")
    args = parser.parse_args()
    install_sigterm_cleanup()  # a SIGTERM stops the servers first (the watchdogs cover SIGKILL)
    budget_s = args.minutes * 60
    fault_every_s = min(args.fault_every * 60, budget_s / 4)

    with tempfile.TemporaryDirectory(prefix="snapcoord-soak-") as tmp:
        s3 = SeaweedS3Server(Path(tmp) / "s3")
        with s3:
            os.environ.update(s3.env())
            with Cluster(Path(tmp) / "cluster", s3.uri("soak")) as c:
                return soak(c, Path(tmp), budget_s, fault_every_s, args.workers, args.pause, args.keep)


def soak(
    c: Cluster,
    tmp: Path,
    budget_s: float,
    fault_every_s: float,
    workers: int,
    pause: float,
    keep: Path | None,
) -> int:
    started = time.time()
    load = MixedLoad(
        c.target, tmp / "load", workers=workers, seconds=budget_s, max_calls=10**7, pause_s=pause
    )
    load.start()
    faults: list[tuple[str, float, float]] = []
    # (seconds since start, pid, RSS bytes): per process, since faults replace replicas.
    rss: list[tuple[float, int, int]] = []
    next_fault = started + fault_every_s / 2
    next_rss = started
    k = 0
    try:
        while time.time() < started + budget_s - 20:
            now = time.time()
            if now >= next_rss:
                sample = [(r.pid, r.rss_bytes()) if r.alive() else None for r in c.replicas]
                rss.extend((now - started, pid, b) for pid, b in filter(None, sample) if b is not None)
                mib = ["-" if x is None or x[1] is None else f"{x[0]}:{x[1] / 2**20:.0f}" for x in sample]
                print(f"t={now - started:6.0f}s rss MiB per replica (pid:MiB): {' '.join(mib)}", flush=True)
                next_rss = now + 60
            # No fault in the last quarter (at most a minute): the run ends on a healed cluster.
            if now >= next_fault and now < started + budget_s - min(60, budget_s / 4):
                t0 = time.time()
                what = FAULTS[k % len(FAULTS)](c)
                k += 1
                c.heal()  # everything back (restarted replicas listen on new ports: not in the load)
                faults.append((what, t0, time.time()))
                print(
                    f"t={t0 - started:6.0f}s fault: {what}; healed after {time.time() - t0:.1f}s", flush=True
                )
                next_fault = time.time() + fault_every_s
            time.sleep(1)
    finally:
        load.stop()
    rows = load.rows()
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for path in load.history_paths():
            shutil.copy(path, keep / path.name)
    print("\n## soak results")
    overall = window(rows)
    elapsed = time.time() - started
    print(f"duration {elapsed:.0f}s: {overall.ok}/{overall.calls} calls ok, codes {overall.codes}")
    for what, t0, t1 in faults:
        slowest = max((r.end - r.start for r in rows if t0 <= r.start < t1), default=0.0)
        print(f"- {what}: {window(rows, t0, t1)}, slowest call {slowest:.1f}s")
    print(rss_summary(rss))
    print(janitor_failures(c))
    c.heal()
    with CoordinatorClient(c.target, timeout_s=60) as client:
        verdict = check_history(rows, client)
    print(f"history: {verdict}")
    return 0 if verdict.ok and verdict.acknowledged > 0 else 1


_STEP_RE = re.compile(
    r'^snapcoord_janitor_passes_total\{(?=[^}]*outcome="error")[^}]*step="([^"]+)"[^}]*\}\s+(\S+)$',
    re.MULTILINE,
)


def janitor_failures(c: Cluster) -> str:
    """Janitor steps that failed (outcome "error", not an outage's "interrupted") on the replicas
    still running: a step failing pass after pass falls behind without any call failing."""
    failed: dict[str, float] = {}
    for r in c.replicas:
        try:
            text = r.metrics_text()
        except OSError:
            continue
        for step, count in _STEP_RE.findall(text):
            failed[step] = failed.get(step, 0.0) + float(count)
    shown = ", ".join(f"{step} {count:.0f}" for step, count in sorted(failed.items()) if count)
    return f"janitor steps failed on the running replicas: {shown or 'none'}"


def rss_summary(rss: list[tuple[float, int, int]]) -> str:
    """Per replica process: its first, highest and last RSS and the minutes between the samples.

    A replaced replica is a new process that starts small, so growth is only read within one
    process; a leak shows as a last sample well above the first in every long-lived process.
    """
    by_pid: dict[int, list[tuple[float, int]]] = {}
    for t, pid, b in rss:
        by_pid.setdefault(pid, []).append((t, b))
    lines = ["rss MiB per process (first -> last, max, over minutes):"]
    for pid, samples in by_pid.items():
        (t0, first), (t1, last) = samples[0], samples[-1]
        peak = max(b for _, b in samples)
        lines.append(
            f"  pid {pid}: {first / 2**20:.0f} -> {last / 2**20:.0f}, max {peak / 2**20:.0f}, "
            f"over {(t1 - t0) / 60:.0f} min ({len(samples)} samples)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
