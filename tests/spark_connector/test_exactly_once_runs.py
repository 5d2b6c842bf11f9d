"""exactly_once across run changes, against a real coordinator, with a toy sink driven by hand.

Each "run" is a writer over a checkpoint directory that holds what the wrapper reads from Spark's:
``metadata`` (the query id) and ``offsets/<N>`` (the batch's plan). The batches are lists of rows
appended to a list sink, so every loss or duplicate is visible in the list.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, NotFound, Offset
from snapcoord.spark_connector.attempts import Attempt, decode, encode
from snapcoord.spark_connector.epochs import Fenced, claim_epoch, epoch_producer_id
from snapcoord.spark_connector.exactly_once import ExactlyOnceWriter, exactly_once
from snapcoord.spark_connector.sinks import RollbackSink
from snapcoord.spark_connector.storage import UnsupportedLocation


class ListSink:
    """An append-only list with its length as the one position (a sink without fences)."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def positions(self) -> list[Offset]:
        return [Offset("list", 0, len(self.rows))]

    def rollback_to(self, positions: Sequence[Offset]) -> None:
        del self.rows[positions[0].offset :]


class FencedListSink(ListSink):
    """The same list with the fencing half of the protocol. ``view()`` is another driver's object
    on the same storage: rows and fences are shared, the epoch it writes as is its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fences: list[int] = [0]  # shared storage: the highest epoch fenced
        self.epoch = 0

    def view(self) -> FencedListSink:
        other = FencedListSink()
        other.rows, other.fences = self.rows, self.fences
        return other

    def max_epoch(self) -> int:
        return self.fences[0]

    def fence(self, epoch: int) -> None:
        if self.fences[0] > epoch:
            raise Fenced(f"fenced by {self.fences[0]}")
        self.fences[0] = self.epoch = epoch

    def check_epoch(self) -> None:
        if self.fences[0] > self.epoch:
            raise Fenced(f"fenced by {self.fences[0]}")

    def rollback_to(self, positions: Sequence[Offset]) -> None:
        self.check_epoch()
        super().rollback_to(positions)


def checkpoint(root: Path, query_id: str, plans: dict[int, str]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    (root / "offsets").mkdir(exist_ok=True)
    for batch, plan in plans.items():
        (root / "offsets" / str(batch)).write_text(f"v1\n{{}}\n{plan}\n")
    return str(root)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(tmp_path_factory.mktemp("coordinator")) as coord:
        yield coord


@pytest.fixture
def client(coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(coordinator.target) as c:
        yield c


def run(writer: ExactlyOnceWriter, sink: ListSink, batches: range) -> None:
    for n in batches:
        writer([f"r{n}"], n)


def writer_for(sink: ListSink, client: CoordinatorClient, name: str, chk: str) -> ExactlyOnceWriter:
    def write(df: list[str], batch_id: int) -> None:
        sink.rows.extend(df)

    return exactly_once(sink, client, query_name=name, batch_function=write, checkpoint_location=chk)


@pytest.mark.process
def test_checkpoint_reset_never_rolls_back_committed_output(
    tmp_path: Path, client: CoordinatorClient, caplog: pytest.LogCaptureFixture
) -> None:
    sink = ListSink()
    plans = {n: f'{{"logOffset":{n}}}' for n in range(8)}
    first = writer_for(sink, client, "reset", checkpoint(tmp_path / "chk", "q-first", plans))
    run(first, sink, range(4))  # stopped without finish(): reset.b3 stays
    assert client.get_producer_offsets("reset.b3")

    # Reset: delete the checkpoint, start again under the same name and sink. Batch 0 re-reads
    # everything, and batch 3 meets the old run's record, which must not cut batches 0-3.
    chk = tmp_path / "chk"
    for f in sorted(chk.rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    second = writer_for(sink, client, "reset", checkpoint(chk, "q-second", plans))
    with caplog.at_level(logging.WARNING, logger="snapcoord.spark_connector.exactly_once"):
        run(second, sink, range(6))
    # The reset replays the source: batches 0-3 are there twice (once per run), nothing is lost.
    assert sink.rows == [f"r{n}" for n in range(4)] + [f"r{n}" for n in range(6)]
    assert (second.rollbacks, second.stale_records) == (0, 1)
    stale = [r.getMessage() for r in caplog.records if "stale record reset.b3" in r.getMessage()]
    assert len(stale) == 1 and "query id q-first" in stale[0], caplog.text
    assert second.epoch is not None and first.epoch is not None and second.epoch > first.epoch


@pytest.mark.process
def test_restore_rename_and_outage_records_never_roll_back(tmp_path: Path, client: CoordinatorClient) -> None:
    sink = ListSink()
    plans = {n: f'{{"logOffset":{n}}}' for n in range(10)}
    original = writer_for(sink, client, "orders", checkpoint(tmp_path / "orig", "q-orig", plans))
    run(original, sink, range(6))  # orders.b5 stays behind
    kept = list(sink.rows)

    # Restore into a fresh checkpoint from a snapshot after batch 2: the copy keeps the query id, and
    # batches from 3 on are planned again (other offsets). The leftover orders.b5 is not batch 5's
    # earlier attempt of *this* checkpoint.
    restored_plans = {n: f'{{"logOffset":{n},"restored":true}}' for n in range(10)}
    restored = writer_for(sink, client, "orders", checkpoint(tmp_path / "restored", "q-orig", restored_plans))
    run(restored, sink, range(3, 7))
    assert sink.rows == [*kept, "r3", "r4", "r5", "r6"]
    assert (restored.rollbacks, restored.stale_records) == (0, 1)

    # Same plan, same query id, but met in the middle of a run (a long outage, then a rewound
    # checkpoint): only the first batch of a run can be an earlier run's unfinished batch.
    client.register_producer_offsets(
        "orders.b8", encode(Attempt(8, 1, "q-orig", None), [Offset("list", 0, 2)])
    )
    rewound = writer_for(sink, client, "orders", checkpoint(tmp_path / "rewound", "q-orig", plans))
    before = list(sink.rows)
    run(rewound, sink, range(7, 9))
    assert sink.rows == [*before, "r7", "r8"]
    assert (rewound.rollbacks, rewound.stale_records) == (0, 1)

    # A renamed query on the same sink has its own records: none of the old name's is consulted.
    renamed = writer_for(sink, client, "orders-v2", checkpoint(tmp_path / "renamed", "q-renamed", plans))
    before = list(sink.rows)
    run(renamed, sink, range(3))
    assert sink.rows == [*before, "r0", "r1", "r2"]
    assert (renamed.rollbacks, renamed.stale_records) == (0, 0)


@pytest.mark.process
def test_two_runs_of_one_name_on_two_checkpoints_keep_each_others_output(
    tmp_path: Path, client: CoordinatorClient
) -> None:
    sink = ListSink()
    plans = {n: str(n) for n in range(6)}
    a = writer_for(sink, client, "twins", checkpoint(tmp_path / "a", "q-a", plans))
    b = writer_for(sink, client, "twins", checkpoint(tmp_path / "b", "q-b", plans))
    a(["a0"], 0)
    b(["b0"], 0)  # a's twins.b0 is stale for b: replaced, a0 stays
    a(["a1"], 1)
    b(["b1"], 1)
    assert sink.rows == ["a0", "b0", "a1", "b1"]
    assert a.rollbacks == b.rollbacks == 0
    # b met both of a's records; a's batch 1 deleted b's record of batch 0 (the N-1 delete does not
    # look at whose record it is: concurrent queries of one name are not supported, sequential are).
    assert (a.stale_records, b.stale_records) == (0, 2)


@pytest.mark.process
def test_the_earlier_driver_of_the_same_checkpoint_is_rolled_back_exactly_once(
    tmp_path: Path, client: CoordinatorClient
) -> None:
    sink = FencedListSink()
    plans = {n: str(n) for n in range(5)}
    chk = checkpoint(tmp_path / "chk", "q-crash", plans)
    dead_sink = sink.view()
    dead = writer_for(dead_sink, client, "crash", chk)
    run(dead, dead_sink, range(3))
    sink.rows.append("partial-r2")  # the dead driver also wrote part of a second attempt of batch 2

    # The restarted driver re-runs batch 2 first: roll back to the record, then it is this
    # attempt's record, so a second crash rolls back exactly this attempt's writes.
    again_sink = sink.view()
    again = writer_for(again_sink, client, "crash", chk)
    again(["r2"], 2)
    assert sink.rows == ["r0", "r1", "r2"]
    assert again.rollbacks == 1
    sink.rows.append("partial-again")
    third_sink = sink.view()
    third = writer_for(third_sink, client, "crash", chk)
    run(third, third_sink, range(2, 5))
    assert sink.rows == ["r0", "r1", "r2", "r3", "r4"]
    assert third.rollbacks == 1
    assert dead.epoch is not None and again.epoch is not None and third.epoch is not None
    assert dead.epoch < again.epoch < third.epoch

    # The earlier drivers are zombies now: fenced before they delete or write anything.
    for zombie in (again, dead):
        with pytest.raises(Fenced):
            zombie(["late"], 5)
        with pytest.raises(Fenced):
            zombie(["late"], 2)
    assert sink.rows == ["r0", "r1", "r2", "r3", "r4"]
    assert client.get_producer_offsets("crash.b4")  # no zombie deleted the live record


@pytest.mark.process
def test_epochs_grow_past_expired_claims(tmp_path: Path, client: CoordinatorClient) -> None:
    first = claim_epoch(client, "epochs", floor=0, ttl_ms=60_000, query_id=None)
    second = claim_epoch(client, "epochs", floor=0, ttl_ms=60_000, query_id="q")
    assert second == first + 1
    assert claim_epoch(client, "epochs", floor=10, ttl_ms=60_000, query_id=None) == 11

    # A sink without fences whose earlier claims expired: a record of a higher epoch of the same
    # checkpoint on the run's first batch makes the writer claim above it, then roll back as usual.
    sink = ListSink()
    sink.rows = ["r0", "partial"]
    plans = {1: "1"}
    chk = checkpoint(tmp_path / "chk", "q-old", plans)
    client.register_producer_offsets(
        "expired.b1", encode(Attempt(1, 40, "q-old", None), [Offset("list", 0, 1)])
    )
    writer = writer_for(sink, client, "expired", chk)
    writer(["r1"], 1)
    assert sink.rows == ["r0", "r1"]
    assert writer.epoch is not None and writer.epoch > 40
    assert writer.rollbacks == 1

    # finish() after a committed last batch leaves no record of the run behind.
    assert writer.finish(_Query({"batchId": 2, "durationMs": {"triggerExecution": 1}}))
    for pid in ("expired.b1", epoch_producer_id("expired", writer.epoch)):
        with pytest.raises(NotFound):
            client.get_producer_offsets(pid)


@dataclass
class _Query:
    lastProgress: dict[str, object] | None  # the StreamingQuery attribute finish() reads


@pytest.mark.process
def test_wrapper_rolls_back_a_rerun_batch_and_deletes_committed_records(
    coordinator: CoordinatorProcess,
) -> None:
    sink = ListSink()
    assert isinstance(sink, RollbackSink)
    with CoordinatorClient(coordinator.target) as client:

        def write(df: list[str], batch_id: int) -> None:
            sink.rows.extend(df)

        first = exactly_once(sink, coordinator.target, query_name="toy", batch_function=write)
        first(["a", "b"], 0)
        first(["c"], 1)  # batch 0 committed: its record goes
        with pytest.raises(NotFound):
            client.get_producer_offsets("toy.b0")
        assert decode(client.get_producer_offsets("toy.b1").offsets).sink_positions == (Offset("list", 0, 2),)
        sink.rows.append("partial")  # a crashed attempt of batch 1 wrote more than "c"

        second = exactly_once(
            sink, lambda: CoordinatorClient(coordinator.target), query_name="toy", batch_function=write
        )
        second(["c"], 1)  # the restarted driver re-runs batch 1
        assert sink.rows == ["a", "b", "c"]
        assert second.rollbacks == 1
        second(["d"], 2)
        assert sink.rows == ["a", "b", "c", "d"]

        # finish() drops the last record only when the query's last progress proves batch 2 committed.
        executed = {"batchId": 2, "durationMs": {"addBatch": 5, "triggerExecution": 9}}
        idle_before = {"batchId": 2, "durationMs": {"triggerExecution": 1}}  # stopped inside batch 2
        idle_after = {"batchId": 3, "durationMs": {"triggerExecution": 1}}
        assert not second.finish(_Query(None))
        assert not second.finish(_Query(idle_before))
        assert not second.finish(_Query({"batchId": 1, "durationMs": {"addBatch": 5}}))
        assert decode(client.get_producer_offsets("toy.b2").offsets).sink_positions == (Offset("list", 0, 3),)
        assert second.finish(_Query(idle_after))
        assert not second.finish(_Query(executed))  # already gone
        client.register_producer_offsets("toy.b2", [Offset("list", 0, 3)])
        assert second.finish(_Query(executed))
        with pytest.raises(NotFound):
            client.get_producer_offsets("toy.b2")
        second.close()
        first.close()


def test_checkpoint_location_as_a_file_uri_names_the_same_run(tmp_path: Path) -> None:
    """Spark accepts ``file:`` URIs as checkpointLocation; the writer reads the same metadata and
    offsets log through one; a location no backend reaches fails the batch before anything is written."""
    chk = checkpoint(tmp_path / "chk dir", "q-1", {0: "plan-0"})
    by_path = exactly_once(
        ListSink(), "127.0.0.1:1", query_name="uri", batch_function=print, checkpoint_location=chk
    )
    by_uri = exactly_once(
        ListSink(),
        "127.0.0.1:1",
        query_name="uri",
        batch_function=print,
        checkpoint_location=Path(chk).as_uri(),
    )
    assert by_uri._query_id([]) == by_path._query_id([]) == "q-1"
    assert by_uri._plan([], 0) == by_path._plan([], 0) is not None
    unknown = exactly_once(
        ListSink(),
        "127.0.0.1:1",
        query_name="uri",
        batch_function=print,
        checkpoint_location="nosuch://b/chk",
    )
    with pytest.raises(UnsupportedLocation, match="nosuch"):
        unknown._query_id([])
    with pytest.raises(UnsupportedLocation, match="nosuch"):
        unknown([], 0)  # before the coordinator (unreachable here) or the sink is touched
