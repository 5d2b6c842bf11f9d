"""Issue #42, point 1: how often a reader of the exactly-once sink's table sees a batch it must not see,
on each store, before anything changes.

Two races of the commit (``scenarios``), each replayed under ``RANDOM_RUNS`` seeded random
interleavings of the two actors' store calls (``scheduler.PriorityChoice``; every interleaving is
far too many: a run has 30 to 60 store calls). Counted per store and scenario: runs in which a
reader sees a batch whose writer did not report it written and whose batch is re-run (``exposed``),
and runs in which a batch reported written is not what a reader sees (``lost``: a later create
replaced it).

Each race runs with both commit points (the ``point`` parameter): the store alone, which the sink uses where
the store's exclusive create is atomic, and the coordinator's commit claims, which it uses where it is
not (issue #42, point 2). On those stores the store-only runs are the "before" that shows what the
claims close; on the local store the claims' runs check the protocol on an atomic store too.

Where the exclusive create is atomic (the local store) both counts are 0, asserted, and so they are on
every store with the coordinator as the commit point. With the store alone where the create is a
check and then a write they are not: those combinations are listed in ``KNOWN_GAPS`` and their
"nothing exposed or lost" assertion is an ``xfail(strict=True)``, so the test fails the day the gap
closes unnoticed or its count is no longer what docs/spark-storage.md says. The counts are printed,
recorded (``record_property``) and written down in docs/spark-storage.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from pyspark.sql import SparkSession

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient

from .conftest import fsspec_sftp_store
from .scenarios import (
    EXPOSED,
    Store,
    exposures,
    losses,
    two_drivers,
    visible_writers,
    zombie_vs_fence,
)
from .scheduler import Exploration, Pause, Run, explore

SCENARIOS = {"zombie_vs_fence": zombie_vs_fence, "two_drivers": two_drivers}
RANDOM_RUNS = 200
SEED = 42
#: (store, scenario) pairs where a reader sees a batch it must not see with the store alone as the
#: commit point: fsspec's sftp rename is posix-rename@openssh.com, which replaces an existing entry, so
#: the create is only as exclusive as the existence check before it; S3A without conditional create
#: checks in ``create`` and uploads at the stream's ``close``. Hadoop's sftp store is not listed
#: although its create is not atomic either: ``SFTPFileSystem.rename`` checks the target and then
#: posix-renames inside one call into the JVM, which the harness grants as one step, so it cannot see
#: that window (see docs/spark-storage.md); its 0 is what the harness sees, not a proof.
KNOWN_GAPS = frozenset(
    {
        ("fsspec-sftp", "zombie_vs_fence"),
        ("fsspec-sftp", "two_drivers"),
        ("s3a-unconditional", "zombie_vs_fence"),
        ("s3a-unconditional", "two_drivers"),
    }
)
#: Fewer runs on the stores whose every step is a call into the JVM (0.5 to 1 s a run on a busy
#: machine): Hadoop's sftp, where the harness cannot see the window (above), still checks that the
#: sink's code path works there and reports no error; S3A without conditional create shows its gaps
#: within the first 50 (1 exposed, 2 lost; docs/spark-storage.md has the counts of 200).
RUNS_BY_STORE = {"hadoop-sftp": 50, "s3a-unconditional": 50}


@pytest.fixture(scope="module")
def claims(zk_coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    """A client of a real coordinator (``snapcoord serve`` on ZooKeeper) for the commit claims."""
    with CoordinatorClient(zk_coordinator.target, timeout_s=60) as client:
        yield client


def _summary(store: Store, scenario: str, point: str, found: Exploration) -> str:
    outcomes = ", ".join(f"{n} {o}" for o, n in found.outcomes.most_common())
    return (
        f"{store.name} {scenario} ({point}): {found.runs} runs ({found.mode} interleavings, {found.distinct} "
        f"distinct): {exposures(found.outcomes)} exposed, {losses(found.outcomes)} lost; {outcomes}"
    )


@pytest.mark.parametrize(
    "point",
    [
        "store",  # the store alone
        # The coordinator's commit claims: ``claims``, requested at run time, is a snapcoord serve
        # on ZooKeeper and S3.
        pytest.param("coordinator", marks=(pytest.mark.process, pytest.mark.zookeeper, pytest.mark.s3)),
    ],
)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_commit_race(
    store: Store,
    scenario: str,
    point: str,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
) -> None:
    client: CoordinatorClient | None = None
    if point == "coordinator":
        client = request.getfixturevalue("claims")
    runs = RUNS_BY_STORE.get(store.name, RANDOM_RUNS)
    race = SCENARIOS[scenario](store, f"{scenario}-{point}", None, client)
    found = explore(race, every_up_to=0, random_runs=runs, seed=SEED)
    summary = _summary(store, scenario, point, found)
    print(summary)
    record_property("races", summary)
    errors = [o for o in found.outcomes if ":error:" in o or o.startswith("unreadable")]
    assert not errors, f"{summary}; example interleaving: {found.examples[errors[0]]}"
    if point == "store" and (store.name, scenario) in KNOWN_GAPS:
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason=f"issue #42: {store.name}'s exclusive create is a check and then a write "
                "(point 2 makes the coordinator the commit point there)",
            )
        )
    assert exposures(found.outcomes) == 0 and losses(found.outcomes) == 0, summary


@pytest.mark.spark
@pytest.mark.process
def test_the_race_reader_reads_what_spark_reads(request: pytest.FixtureRequest, spark: SparkSession) -> None:
    """The counts read the table with ``SparkSinkLog``; Spark's own reader of the same tables returns
    exactly the rows of the writers counted visible (or fails where the log lists a file that is gone),
    for an exposed zombie batch and a refused one."""
    tables: dict[str, str] = {}
    with fsspec_sftp_store(request) as store:
        scenario = zombie_vs_fence(store, "spark-check", tables)
        for steps in range(1, 30):  # the zombie pauses after each of its steps in turn
            scenario(Run(Pause("zombie", steps)))
            if any(f"zombie:{EXPOSED}" in o for o in tables) and len(tables) > 1:
                break
        assert any(f"zombie:{EXPOSED}" in o for o in tables), tables
        sshd_uri = store.storage_for("zombie").uri()
        for outcome, table in sorted(tables.items()):
            seen = visible_writers(store.reader.child(table), ["zombie"])
            df = spark.read.schema("v string").json(f"{sshd_uri}/{table}")
            if seen and not seen["zombie"]:  # the log lists a file that is gone
                with pytest.raises(Exception, match=r"FileNotFound|does not exist|No such file"):
                    df.collect()
            else:
                assert {r.v for r in df.collect()} == set(seen), (outcome, df.inputFiles())
