"""Exactly-once ``foreachBatch`` for sinks that cannot write transactionally.

Spark's micro-batch protocol is: write offsets log for batch N, run the batch (``foreachBatch``), write
the commit log for N. A driver that dies between the sink write and the commit log re-runs batch N
with the same ``batch_id`` after a restart, so a plain append sink gets batch N twice (or a partial
batch N plus a full one). ``exactly_once`` closes that gap with the coordinator's producer offsets::

    sink = PartitionedFileSink("/data/events", partition_by=["day"])
    query = (df.writeStream
             .foreachBatch(exactly_once(sink, "coordinator:50051", query_name="events-to-table",
                                        checkpoint_location="/chk/events"))
             .option("checkpointLocation", "/chk/events")
             .start())

On the first batch a run executes, the writer claims the run's *epoch* from the coordinator
(``epochs``), gives a ``CoordinatedSink`` its client (the commit point where the sink's store has no
atomic create: ``claims``) and, for a ``FencedSink``, fences the sink with it: from then on every
write of an older run (a zombie driver) is invisible. Then, for batch N, on the driver:

1. delete the record of batch N-1: Spark calls ``foreachBatch`` for N only after N-1's commit log
   entry is durable, so N-1 can never be re-run and its record is no longer needed (this is also
   how a restarted driver cleans up after its predecessor);
2. ``register_producer_offsets("<query_name>.b<N>", attempt + sink.positions())``, create-if-absent;
   the attempt (``attempts``) names the run: epoch, the checkpoint's query id, a digest of Spark's
   offsets log entry for N. Steps 1 and 2 are one call, ``advance_producer_offsets`` (one ZooKeeper
   transaction on the coordinator: both or neither); against a coordinator that answers it
   ``Unimplemented`` (a release before it) the writer makes the two calls, in that order, from then
   on;
3. if a record already existed, ``attempts.decide`` says whose it is. Only the attempt that wrote it
   is rolled back: this run's own (after a lost reply, a no-op), or the previous driver of this
   checkpoint that died in N, which can only be the first batch this run executes. Any other record
   (a reset or restored checkpoint, another query of the same name, a leftover) is stale: logged as
   a WARNING and replaced, never a reason to delete output. After a rollback the record is replaced
   by this attempt's, so that the next rollback removes exactly this attempt's writes;
4. run the user's batch function (by default ``sink.write(df, batch_id)``).

The record of the *last* batch of a query stays until the next batch of a later run deletes it, or
``ExactlyOnceWriter.finish(query)`` is called after the query stopped (it deletes it when the query's
last progress proves that batch committed), or its TTL expires (a driver that never
comes back). Deleting it early would be wrong: a query stopped in the middle of batch N re-runs N.
The TTL must exceed the longest time a crashed driver may stay down: a record that expired before the
restart cannot protect the re-run batch.

Everything runs on the driver (``require_driver``); the client is created lazily in the driver
process. Under Spark Connect the writer is pickled to the Connect server and runs in its Python
worker: see ``ExactlyOnceWriter.__reduce__``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from snapcoord.client import CoordinatorClient, Offset, Registration, Unimplemented
from snapcoord.spark_connector.driver import DriverOnly, ExecutorContextError, require_driver
from snapcoord.spark_connector.sink.attempts import Attempt, Verdict, decide, decode, encode, plan_digest
from snapcoord.spark_connector.sink.epochs import Fenced, claim_epoch, epoch_producer_id
from snapcoord.spark_connector.sink.protocols import CoordinatedSink, FencedSink, RollbackSink
from snapcoord.spark_connector.storage import Storage, classic_session, open_location

log = logging.getLogger(__name__)

BatchFunction = Callable[[Any, int], None]
ClientSource = CoordinatorClient | str | Callable[[], CoordinatorClient]

_QUERY_NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,150}$")
DEFAULT_TTL_MS = 7 * 24 * 3_600_000
_QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark on the thread that runs foreachBatch
#: How often one batch may meet and replace a foreign record before giving up (races only).
_MAX_REGISTER_ROUNDS = 8


class ExactlyOnceWriter(DriverOnly):
    """The ``(df, batch_id)`` callable ``exactly_once`` returns; see the module docstring."""

    def __init__(
        self,
        sink: RollbackSink,
        client: ClientSource,
        *,
        query_name: str,
        batch_function: BatchFunction | None = None,
        ttl_ms: int = DEFAULT_TTL_MS,
        checkpoint_location: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if not _QUERY_NAME_RE.fullmatch(query_name) or query_name in (".", ".."):
            raise ValueError(f"query_name {query_name!r} must be 1-150 characters of [A-Za-z0-9._:-]")
        if ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
        if batch_function is None:
            write = getattr(sink, "write", None)
            if not callable(write):
                raise TypeError(f"{sink!r} has no write(df, batch_id): pass batch_function")
            batch_function = write
        self.sink = sink
        self.query_name = query_name
        self.ttl_ms = ttl_ms
        self.checkpoint_location = checkpoint_location
        self.storage_options = dict(storage_options or {})
        self._batch_function: BatchFunction = batch_function
        self._client_source = client
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        """Everything that belongs to this process and its run, never to the configuration: a new
        writer and an unpickled copy (Spark Connect's server) both start from here."""
        self._client: CoordinatorClient | None = None
        self._checkpoint: Storage | None = None
        self._lock = threading.Lock()
        #: The batch id this process ran last (its record may still exist).
        self.last_batch_id: int | None = None
        #: How many batches found a record of an earlier attempt and rolled the sink back.
        self.rollbacks = 0
        #: How many records of other runs were found, logged and replaced without a rollback.
        self.stale_records = 0
        #: This run's epoch (None before the first batch) and the query id it was claimed for.
        self.epoch: int | None = None
        self._run_query_id: str | None = None
        self._batches_in_run = 0
        #: False once the coordinator answered AdvanceProducerOffsets with Unimplemented.
        self._advance_supported = True

    def producer_id(self, batch_id: int) -> str:
        return f"{self.query_name}.b{batch_id}"

    @property
    def client(self) -> CoordinatorClient:
        """The coordinator client, created on first use in this (driver) process."""
        require_driver("ExactlyOnceWriter")
        with self._lock:
            if self._client is None:
                source = self._client_source
                if isinstance(source, CoordinatorClient):
                    self._client = source
                elif isinstance(source, str):
                    self._client = CoordinatorClient(source)
                else:
                    self._client = source()
            return self._client

    def __call__(self, df: Any, batch_id: int) -> None:
        require_driver("exactly_once batch function")
        batch_id = int(batch_id)
        attempt = self._attempt(df, batch_id)
        previous = None
        if batch_id > 0:
            self._check_fence()
            # N-1 is committed (Spark runs N only after N-1's commit log entry): its record is garbage.
            previous = self.producer_id(batch_id - 1)
            if not self._advance_supported:
                self.client.delete_producer_offsets(previous)
                previous = None
        # With one call for both, this point lies before the deletion of N-1 and the registration.
        self._hook("after_delete", batch_id)
        self._register(attempt, previous)
        self._batches_in_run += 1
        self.last_batch_id = batch_id
        self._hook("after_register", batch_id)
        self._batch_function(df, batch_id)

    # -- the steps -------------------------------------------------------------------------------
    def _attempt(self, df: Any, batch_id: int) -> Attempt:
        """This batch's attempt; claims an epoch (and fences the sink) on a run's first batch."""
        query_id = self._query_id(df)
        if self.epoch is None or query_id != self._run_query_id:
            self._start_run(query_id, floor=0)
        assert self.epoch is not None
        return Attempt(batch_id, self.epoch, query_id, self._plan(df, batch_id))

    def _start_run(self, query_id: str | None, *, floor: int) -> None:
        sink = self.sink if isinstance(self.sink, FencedSink) else None
        if sink is not None:
            floor = max(floor, sink.max_epoch())
        epoch = claim_epoch(self.client, self.query_name, floor=floor, ttl_ms=self.ttl_ms, query_id=query_id)
        if isinstance(self.sink, CoordinatedSink):
            # The commit point of a table whose store has no atomic create (the sink asks it only there).
            self.sink.use_coordinator(self.client)
        if sink is not None:
            sink.fence(epoch)  # before any write of this run: older runs' late writes become invisible
        self.epoch, self._run_query_id, self._batches_in_run = epoch, query_id, 0

    def _register(self, attempt: Attempt, previous: str | None = None) -> None:
        """Register the attempt's record (deleting ``previous``'s in the same call, when given),
        and settle a record found in its place (the module docstring's step 3)."""
        pid = self.producer_id(attempt.batch_id)
        for _ in range(_MAX_REGISTER_ROUNDS):
            positions = list(self.sink.positions())
            registration = self._register_once(pid, encode(attempt, positions), previous)
            previous = None  # deleted by the first round's call, whatever it answered
            if registration.registered:
                return
            record = decode(registration.snapshot.offsets)
            decision = decide(record, attempt, first_batch_of_run=self._batches_in_run == 0)
            if decision.verdict is Verdict.OWN:
                # Ours (a retried call whose reply was lost, or this run re-running a failed batch):
                # roll back to it; a no-op when nothing was written since.
                if list(record.sink_positions) != positions:
                    self._count_rollback(attempt, record.sink_positions, positions, decision.reason)
                self.sink.rollback_to(record.sink_positions)
                return
            if decision.verdict is Verdict.NEWER:
                if isinstance(self.sink, FencedSink) or self._batches_in_run > 0:
                    raise Fenced(
                        f"{self.query_name} batch {attempt.batch_id}: {decision.reason}; stopping this driver"
                    )
                # A sink without fences on its first batch: this run's number was claimed after the
                # claims of earlier runs expired (the coordinator keeps records at most 7 days).
                assert record.attempt is not None
                log.warning(
                    "%s: record %s: %s; claiming a higher epoch", self.query_name, pid, decision.reason
                )
                self._start_run(attempt.query_id, floor=record.attempt.epoch)
                assert self.epoch is not None
                attempt = Attempt(attempt.batch_id, self.epoch, attempt.query_id, attempt.plan)
                continue
            if decision.verdict is Verdict.ROLLBACK:
                self._count_rollback(attempt, record.sink_positions, positions, decision.reason)
                self._hook("before_rollback", attempt.batch_id)
                self.sink.rollback_to(record.sink_positions)
            else:
                self.stale_records += 1
                log.warning(
                    "%s: ignoring stale record %s (%s): %s; it is replaced and rolls nothing back",
                    self.query_name,
                    pid,
                    list(registration.snapshot.offsets),
                    decision.reason,
                )
            # Replace the record by this attempt's, so that a later rollback removes only what *this*
            # attempt writes. A crash right here leaves no record: nothing of this attempt is written yet.
            self.client.delete_producer_offsets(pid)
        raise RuntimeError(f"{self.query_name}: could not register {pid} after {_MAX_REGISTER_ROUNDS} rounds")

    def _register_once(self, pid: str, offsets: list[Offset], previous: str | None) -> Registration:
        """One registration of ``pid``; with ``previous``, that record is deleted in the same call
        (``advance_producer_offsets``), or, by a coordinator without it, just before."""
        if previous is not None:
            try:
                advanced = self.client.advance_producer_offsets(
                    pid, offsets, previous_producer_id=previous, ttl_ms=self.ttl_ms
                )
            except Unimplemented:
                log.info("%s: the coordinator has no AdvanceProducerOffsets; deleting and registering", pid)
                self._advance_supported = False
                self.client.delete_producer_offsets(previous)
            else:
                return Registration(advanced.registered, advanced.snapshot)
        return self.client.register_producer_offsets(pid, offsets, ttl_ms=self.ttl_ms)

    def _count_rollback(self, attempt: Attempt, stored: Any, now: list[Offset], reason: str) -> None:
        self.rollbacks += 1
        log.warning(
            "batch %d of %s was attempted before (%s): rolling %r back to %s (now at %s)",
            attempt.batch_id,
            self.query_name,
            reason,
            self.sink,
            list(stored),
            now,
        )

    def _check_fence(self) -> None:
        if isinstance(self.sink, FencedSink):
            self.sink.check_epoch()

    def _query_id(self, df: Any) -> str | None:
        """The streaming query's id (stable for a checkpoint): Spark's local property on the thread
        running foreachBatch, else ``<checkpoint>/metadata``.

        Under Spark Connect the function runs in the server's Python worker, which sees a Connect
        DataFrame: no SparkContext, and the local property lives on a JVM thread the worker cannot
        reach. There only ``checkpoint_location`` (read by the worker, on the server's host) names the
        run, and without it a record of a reset checkpoint's batch could pass for this run's earlier
        attempt and roll back committed output: such a writer refuses to run.
        """
        try:
            value = df.sparkSession.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
        except Exception:  # not a classic DataFrame (tests, Spark Connect): fall back to the checkpoint
            value = None
        if value:
            return str(value)
        checkpoint = self._checkpoint_storage(df)
        if checkpoint is not None:
            try:
                metadata = checkpoint.read_bytes("metadata").decode("utf-8")
            except FileNotFoundError:
                pass
            else:
                return str(json.loads(metadata.splitlines()[0])["id"])
        if type(df).__module__.startswith("pyspark.sql.connect."):
            raise ValueError(
                f"{self.query_name}: under Spark Connect exactly_once cannot see the streaming query's id; "
                "pass checkpoint_location= (the query's checkpointLocation, which the Connect server "
                f"reaches with storage_options=), found {self.checkpoint_location!r} without a metadata file"
            )
        return None

    def _checkpoint_storage(self, df: Any) -> Storage | None:
        """``checkpoint_location``'s store (``storage.open_location``: through the DataFrame's classic
        session where there is one, else fsspec with ``storage_options``), opened once per process;
        None without a ``checkpoint_location``. A location it cannot reach raises
        ``UnsupportedLocation`` before the batch writes anything."""
        if self.checkpoint_location is None:
            return None
        if self._checkpoint is None:
            session = getattr(df, "sparkSession", None)
            self._checkpoint = open_location(
                self.checkpoint_location,
                spark=session if classic_session(session) is not None else None,
                storage_options=self.storage_options,
            )
        return self._checkpoint

    def _plan(self, df: Any, batch_id: int) -> str | None:
        """Digest of ``<checkpoint>/offsets/<N>`` (written before foreachBatch; the same on a re-run)."""
        checkpoint = self._checkpoint_storage(df)
        if checkpoint is None:
            return None
        try:
            return plan_digest(checkpoint.read_bytes(f"offsets/{batch_id}").decode("utf-8"))
        except FileNotFoundError:
            return None

    def _hook(self, point: str, batch_id: int) -> None:
        """Test seam for kill points between the steps; does nothing here."""

    def finish(self, query: Any) -> bool:
        """After ``query`` (a StreamingQuery) stopped: delete the last batch's record when the query's
        last progress proves that batch committed, and then this run's epoch claim. Returns True when
        it deleted the batch record.

        Proof: Spark writes a batch's commit log entry before it reports the batch's progress, and
        reports a higher batch id (an idle trigger's progress carries the *next* id) only after that.
        So a last progress with a higher batch id, or the same id with an ``addBatch`` duration (an
        executed batch, not an idle trigger before it), means committed. Anything else (a query
        stopped in the middle of the batch) keeps the record, which the batch's re-run needs. Safe
        to skip: the next batch of a later run, or the TTL, deletes it too.
        """
        require_driver("ExactlyOnceWriter.finish")
        last = self.last_batch_id
        progress = query.lastProgress
        if last is None or not progress:
            return False
        batch_id = int(progress.get("batchId", -1))
        executed = "addBatch" in (progress.get("durationMs") or {})
        if batch_id < last or (batch_id == last and not executed):
            return False
        deleted = self.client.delete_producer_offsets(self.producer_id(last))
        if self.epoch is not None:
            # No record of this run is left, so its epoch claim protects nothing any more (a sink's
            # fences keep the numbers growing).
            self.client.delete_producer_offsets(epoch_producer_id(self.query_name, self.epoch))
        return deleted

    def close(self) -> None:
        """Close a client this writer created (not one that was passed in)."""
        with self._lock:
            if self._client is not None and self._client is not self._client_source:
                self._client.close()
            self._client = None

    # -- pickling: Spark Connect ships the foreachBatch function to the server -----------------------
    #: What a copy carries: configuration only. Everything else (client, lock, epoch, the run's query
    #: id and batch count, counters) is per process and per run, and ``_reset_process_state`` sets it
    #: afresh, so the copy on the Connect server claims its own epoch and derives its run at its first
    #: batch. A copy that inherited the sender's epoch would write as a run it never claimed.
    #: Subclasses with more configuration extend this tuple.
    _CONFIGURATION: tuple[str, ...] = (
        "sink",
        "query_name",
        "ttl_ms",
        "checkpoint_location",
        "storage_options",
        "_batch_function",
        "_client_source",
    )

    def __reduce__(self) -> tuple[Any, ...]:  # type: ignore[override]  # DriverOnly's refuses
        """Pickle as configuration (``_CONFIGURATION``).

        Under Spark Connect, ``foreachBatch`` pickles the function on the client and runs it in a
        Python worker of the Connect server's driver; the copy creates its client lazily there. A live
        ``CoordinatorClient`` cannot travel, so a writer built from one refuses. Shipping a copy into
        a Spark task still fails, at use: ``require_driver``.
        """
        if isinstance(self._client_source, CoordinatorClient):
            raise ExecutorContextError(
                "ExactlyOnceWriter was given a live CoordinatorClient, which cannot be pickled; under "
                "Spark Connect foreachBatch pickles the writer to the Connect server: pass the "
                "coordinator's address (exactly_once(sink, 'host:port', ...)) or a picklable "
                "zero-argument factory instead"
            )
        state = {k: self.__dict__[k] for k in self._CONFIGURATION}
        return (_blank, (type(self),), state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()


def _blank(cls: type[ExactlyOnceWriter]) -> ExactlyOnceWriter:
    """An uninitialised writer for unpickling (``__setstate__`` fills it in)."""
    return cls.__new__(cls)


def exactly_once(
    sink: RollbackSink,
    client: ClientSource,
    *,
    query_name: str,
    batch_function: BatchFunction | None = None,
    ttl_ms: int = DEFAULT_TTL_MS,
    checkpoint_location: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ExactlyOnceWriter:
    """Wrap ``batch_function`` (default ``sink.write``) for ``writeStream.foreachBatch`` so that
    every batch lands in ``sink`` exactly once across driver crashes and run changes.

    ``client`` is a ``CoordinatorClient``, a gRPC target string, or a zero-argument factory (called
    lazily, on the driver). ``query_name`` must be unique per query and sink. ``ttl_ms`` bounds how
    long a record of an unfinished batch outlives its driver. ``checkpoint_location`` (the query's, any
    location Spark can use) lets records carry the batch's planned offsets, so a record of a restored
    or rewound checkpoint is never mistaken for an earlier attempt of the same batch; it is read
    through Spark's Hadoop file system in a classic driver, and through fsspec with
    ``storage_options`` where no JVM is reachable (the Spark Connect server's Python worker).
    """
    return ExactlyOnceWriter(
        sink,
        client,
        query_name=query_name,
        batch_function=batch_function,
        ttl_ms=ttl_ms,
        checkpoint_location=checkpoint_location,
        storage_options=storage_options,
    )
