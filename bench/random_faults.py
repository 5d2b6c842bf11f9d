"""Long mode of the partition tests: random partitions on a namespaced cluster for minutes.

    bench/run random_faults [--minutes 10] [--seed N] [--only NAME,NAME]
    bench/run random_faults --smoke      one scenario, for CI

Starts the cluster of ``tests/partitions`` once (each ZooKeeper server, each replica, SeaweedFS
and the clients in their own network namespace; needs root for ``ip netns``), then runs the
partition scenarios in a random order (seeded) until the time is up, each with the history
helper's workload beside it and its checker after it. Prints one row per scenario (availability
during the fault per replica, time to the first consistent read and to SERVING after the heal)
and exits 1 when any expectation failed, naming the seed to repeat the order with.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from harness.partition_scenarios import SCENARIOS, ScenarioFailed, ScenarioResult  # noqa: E402
from harness.partitioned import PartitionedCluster  # noqa: E402

SMOKE = "leader_isolated"
HEADER = (
    "| scenario | ok/total during the fault | UNAVAILABLE after (s) "
    "| first ok after heal (s) | SERVING after heal (s) |"
)


def row(result: ScenarioResult) -> str:
    during = ", ".join(str(a) for a in result.during)
    refusing = ", ".join(f"{r} {t:.1f}" for r, t in result.refusing_after_s.items()) or "-"
    first_ok = ", ".join(f"{r} {t:.1f}" for r, t in result.first_ok_after_heal_s.items())
    serving = ", ".join(f"{r} {t:.1f}" for r, t in result.serving_after_heal_s.items())
    return f"| {result.name} | {during} | {refusing} | {first_ok} | {serving} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to keep starting scenarios")
    parser.add_argument("--seed", type=int, default=None, help="the order of the scenarios (default: random)")
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    parser.add_argument("--smoke", action="store_true", help=f"run {SMOKE} once and stop")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    failures: list[str] = []
    print(f"seed {seed}")
    print(HEADER)
    print("|---|---|---|---|---|")
    runs = 0
    with tempfile.TemporaryDirectory(prefix="snapcoord-random-faults-") as tmp:
        cluster = PartitionedCluster(Path(tmp))
        try:
            cluster.start()
            deadline = time.monotonic() + args.minutes * 60
            while runs == 0 or (not args.smoke and time.monotonic() < deadline):
                name = SMOKE if args.smoke else rng.choice(names)
                runs += 1
                cluster.heal()
                try:
                    print(row(SCENARIOS[name](cluster)), flush=True)
                except ScenarioFailed as e:
                    failures.append(f"{name}: {e}")
                    print(f"| {name} | FAILED: {str(e).splitlines()[0][:200]} | | | |", flush=True)
        finally:
            cluster.stop()
    print(f"{runs} scenarios, {len(failures)} failed (seed {seed})")
    for failure in failures:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
