"""exactly_once across run changes, against a real coordinator, with a toy sink driven by hand.

Each "run" is a writer over a checkpoint directory that holds what the wrapper reads from Spark's:
``metadata`` (the query id) and ``offsets/<N>`` (the batch's plan). The batches are lists of rows
appended to a list sink, so every loss or duplicate is visible in the list.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import AdvanceResult, CoordinatorClient, NotFound, Offset, Registration
from snapcoord.spark_connector.sink.attempts import Attempt, decode, encode
from snapcoord.spark_connector.sink.epochs import Fenced, claim_epoch, epoch_producer_id
from snapcoord.spark_connector.sink.protocols import RollbackSink
from snapcoord.spark_connector.sink.writer import ExactlyOnceWriter, exactly_once
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
    with caplog.at_level(logging.WARNING, logger="snapcoord.spark_connector.sink.writer"):
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


# --- one call per batch: AdvanceProducerOffsets, and the fallback for an older coordinator --------
#
# The "older coordinator" is a gRPC server in front of a real one that forwards every call except
# AdvanceProducerOffsets: for that method it has no handler, so gRPC itself answers UNIMPLEMENTED, as
# a coordinator of a release before the call does.

ADVANCE = "/snapcoord.v1.ProducerOffsetService/AdvanceProducerOffsets"


class CountingClient(CoordinatorClient):
    """A real client that counts the producer-offset calls it makes (by method name)."""

    def __init__(self, target: str) -> None:
        super().__init__(target, timeout_s=30)
        self.calls: dict[str, int] = {}
        self._count_lock = threading.Lock()

    def _count(self, name: str) -> None:
        with self._count_lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def register_producer_offsets(self, *args: Any, **kwargs: Any) -> Registration:
        self._count("register")
        return super().register_producer_offsets(*args, **kwargs)

    def delete_producer_offsets(self, *args: Any, **kwargs: Any) -> bool:
        self._count("delete")
        return super().delete_producer_offsets(*args, **kwargs)

    def advance_producer_offsets(self, *args: Any, **kwargs: Any) -> AdvanceResult:
        self._count("advance")
        return super().advance_producer_offsets(*args, **kwargs)


class _Forward(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Forwards every unary call but ``missing`` to ``channel``, bytes as they are."""

    def __init__(self, channel: grpc.Channel, missing: str) -> None:
        self._channel, self._missing = channel, missing

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method
        if method == self._missing:
            return None  # gRPC answers UNIMPLEMENTED
        call = self._channel.unary_unary(method)

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                reply: bytes = call(request, timeout=context.time_remaining())
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")
            return reply

        return grpc.unary_unary_rpc_method_handler(forward)


@contextmanager
def without_advance(target: str) -> Iterator[str]:
    """A server on a free port that serves like ``target`` but has no AdvanceProducerOffsets."""
    with grpc.insecure_channel(target) as channel:
        server = grpc.server(ThreadPoolExecutor(4), handlers=[_Forward(channel, ADVANCE)])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(None)


def advancing_writer(
    tmp_path: Path, sink: ListSink, client: CoordinatorClient, name: str
) -> ExactlyOnceWriter:
    """A writer over ``name``'s checkpoint in ``tmp_path`` (batches 0-9 planned): a driver that
    starts again on it is the same query, as after a crash."""
    plans = {n: f'{{"logOffset":{n}}}' for n in range(10)}
    return writer_for(sink, client, name, checkpoint(tmp_path / name, f"q-{name}", plans))


def batch_records(client: CoordinatorClient, name: str) -> list[str]:
    ids = [p.producer_id for p in client.list_producer_offsets(page_size=1000).items]
    return sorted(i for i in ids if i.startswith(f"{name}.b"))


@pytest.mark.process
def test_each_batch_after_the_first_is_one_call(tmp_path: Path, coordinator: CoordinatorProcess) -> None:
    sink = ListSink()
    client = CountingClient(coordinator.target)
    try:
        writer = advancing_writer(tmp_path, sink, client, "advance")
        for n in range(5):
            client.calls.clear()
            writer([f"r{n}"], n)
            # Batch 0 registers (its epoch claim is a registration too); later batches make one
            # call that drops N-1's record and registers N's.
            if n > 0:
                assert client.calls == {"advance": 1}, (n, client.calls)
            assert batch_records(client, "advance") == [f"advance.b{n}"]
        assert sink.rows == [f"r{n}" for n in range(5)]
        record = decode(client.get_producer_offsets("advance.b4").offsets)
        assert record.attempt is not None and record.attempt.batch_id == 4
        assert list(record.sink_positions) == [Offset("list", 0, 4)]  # where batch 4's output starts
    finally:
        client.close()


@pytest.mark.process
def test_a_restarted_driver_rolls_back_its_predecessors_batch_through_the_one_call(
    tmp_path: Path, coordinator: CoordinatorProcess
) -> None:
    """The one call answers a found record like a registration: a restarted driver re-running the
    batch its predecessor wrote but Spark never committed rolls that output back, writes it once,
    and leaves its own record in place of the predecessor's."""
    sink = ListSink()
    client = CountingClient(coordinator.target)
    try:
        first = advancing_writer(tmp_path, sink, client, "rerun")
        for n in range(3):
            first([f"r{n}"], n)  # batch 2 written; the driver dies before Spark's commit of it
        again = advancing_writer(tmp_path, sink, client, "rerun")
        client.calls.clear()
        again(["r2"], 2)
        assert client.calls.get("advance") == 1, client.calls
        assert again.rollbacks == 1
        assert sink.rows == ["r0", "r1", "r2"]
        assert batch_records(client, "rerun") == ["rerun.b2"]
        record = decode(client.get_producer_offsets("rerun.b2").offsets)
        assert record.attempt is not None and record.attempt.epoch == again.epoch != first.epoch
    finally:
        client.close()


@pytest.mark.process
def test_an_older_coordinator_gets_a_delete_and_a_register(
    tmp_path: Path, coordinator: CoordinatorProcess
) -> None:
    sink = ListSink()
    with without_advance(coordinator.target) as old:
        client = CountingClient(old)
        try:
            writer = advancing_writer(tmp_path, sink, client, "fallback")
            writer(["r0"], 0)
            client.calls.clear()
            writer(["r1"], 1)
            # Tried once, answered UNIMPLEMENTED (nothing done): then the two calls, in order.
            assert client.calls == {"advance": 1, "delete": 1, "register": 1}, client.calls
            assert batch_records(client, "fallback") == ["fallback.b1"]
            client.calls.clear()
            writer(["r2"], 2)
            assert client.calls == {"delete": 1, "register": 1}, client.calls  # not asked again
            assert batch_records(client, "fallback") == ["fallback.b2"]
            assert sink.rows == ["r0", "r1", "r2"]
        finally:
            client.close()


@pytest.mark.process
def test_an_older_coordinator_keeps_the_record_a_rerun_needs(
    tmp_path: Path, coordinator: CoordinatorProcess
) -> None:
    """Through the fallback, a restarted driver's re-run of a batch still finds its predecessor's
    record and rolls back to it: the delete removes N-1's record, never N's."""
    sink = ListSink()
    with without_advance(coordinator.target) as old:
        client = CountingClient(old)
        try:
            first = advancing_writer(tmp_path, sink, client, "fallback-rerun")
            for n in range(3):
                first([f"r{n}"], n)  # batch 2 written; Spark's commit of it never came
            again = advancing_writer(tmp_path, sink, client, "fallback-rerun")
            again(["r2"], 2)
            assert again.rollbacks == 1
            assert sink.rows == ["r0", "r1", "r2"]
            assert batch_records(client, "fallback-rerun") == ["fallback-rerun.b2"]
        finally:
            client.close()
