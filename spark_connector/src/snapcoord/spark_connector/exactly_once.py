"""Exactly-once ``foreachBatch`` for sinks that cannot write transactionally.

Spark's micro-batch protocol is: write offsets log for batch N, run the batch (``foreachBatch``), write
the commit log for N. A driver that dies between the sink write and the commit log re-runs batch N
with the same ``batch_id`` after a restart, so a plain append sink gets batch N twice (or a partial
batch N plus a full one). ``exactly_once`` closes that gap with the coordinator's producer offsets::

    sink = PartitionedFileSink("/data/events", partition_by=["day"])
    query = (df.writeStream
             .foreachBatch(exactly_once(sink, "coordinator:50051", query_name="events-to-table"))
             .option("checkpointLocation", "/chk/events")
             .start())

For batch N, on the driver:

1. delete the record of batch N-1: Spark calls ``foreachBatch`` for N only after N-1's commit log
   entry is durable, so N-1 can never be re-run and its record is no longer needed (this is also
   how a restarted driver cleans up after its predecessor);
2. ``register_producer_offsets("<query_name>.b<N>", sink.positions())``, create-if-absent;
3. if a record already existed, an earlier attempt of batch N got that far and may have written part
   (or all) of its output: ``sink.rollback_to(stored positions)`` first. (After a retried RPC the
   stored record can be this attempt's own; rolling back to it is then a no-op, so we always roll
   back when ``registered`` is False);
4. run the user's batch function (by default ``sink.write(df, batch_id)``).

The record of the *last* batch of a query stays until the next batch of a later run deletes it, or
``ExactlyOnceWriter.finish(query)`` is called after the query stopped (it deletes it when the query's
last progress proves that batch committed), or its TTL expires (a driver that never
comes back). Deleting it early would be wrong: a query stopped in the middle of batch N re-runs N.
The TTL must exceed the longest time a crashed driver may stay down: a record that expired before the
restart cannot protect the re-run batch.

The producer id derives only from ``query_name`` and the batch id, so use a name that is stable
across restarts and unique per (query, sink); the checkpoint location is a good source of one.
Everything runs on the driver (``require_driver``); the client is created lazily in the driver
process. Under Spark Connect the writer is pickled to the Connect server and runs in its Python
worker: see ``ExactlyOnceWriter.__reduce__``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.driver import DriverOnly, ExecutorContextError, require_driver
from snapcoord.spark_connector.sinks import RollbackSink

log = logging.getLogger(__name__)

BatchFunction = Callable[[Any, int], None]
ClientSource = CoordinatorClient | str | Callable[[], CoordinatorClient]

_QUERY_NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,150}$")
DEFAULT_TTL_MS = 7 * 24 * 3_600_000


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
        self._batch_function: BatchFunction = batch_function
        self._client_source = client
        self._client: CoordinatorClient | None = None
        self._lock = threading.Lock()
        #: Batch ids this process ran, the newest last (the records that may still exist).
        self.last_batch_id: int | None = None
        #: How many batches found a record of an earlier attempt and rolled the sink back.
        self.rollbacks = 0

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
        client = self.client
        if batch_id > 0:
            # N-1 is committed (Spark runs N only after N-1's commit log entry): its record is garbage.
            client.delete_producer_offsets(self.producer_id(batch_id - 1))
        positions = list(self.sink.positions())
        registration = client.register_producer_offsets(
            self.producer_id(batch_id), positions, ttl_ms=self.ttl_ms
        )
        if not registration.registered:
            stored: list[Offset] = list(registration.snapshot.offsets)
            if stored != positions:
                self.rollbacks += 1
                log.warning(
                    "batch %d of %s was attempted before: rolling %r back to %s (now at %s)",
                    batch_id,
                    self.query_name,
                    self.sink,
                    stored,
                    positions,
                )
            self.sink.rollback_to(stored)
        self.last_batch_id = batch_id
        self._batch_function(df, batch_id)

    def finish(self, query: Any) -> bool:
        """After ``query`` (a StreamingQuery) stopped: delete the last batch's record when the query's
        last progress proves that batch committed. Returns True when it deleted one.

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
        return self.client.delete_producer_offsets(self.producer_id(last))

    def close(self) -> None:
        """Close a client this writer created (not one that was passed in)."""
        with self._lock:
            if self._client is not None and self._client is not self._client_source:
                self._client.close()
            self._client = None

    # -- pickling: Spark Connect ships the foreachBatch function to the server -----------------------
    #: Per-process state: a copy starts without a client (gRPC channels do not survive pickling), with
    #: a fresh lock, and with no batches run in *its* process.
    _PROCESS_STATE = ("_client", "_lock", "last_batch_id", "rollbacks")

    def __reduce__(self) -> tuple[Any, ...]:  # type: ignore[override]  # DriverOnly's refuses
        """Pickle as configuration (sink, client source, query name, batch function, TTL).

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
        state = {k: v for k, v in self.__dict__.items() if k not in self._PROCESS_STATE}
        return (_blank, (type(self),), state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client = None
        self._lock = threading.Lock()
        self.last_batch_id = None
        self.rollbacks = 0


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
) -> ExactlyOnceWriter:
    """Wrap ``batch_function`` (default ``sink.write``) for ``writeStream.foreachBatch`` so that
    every batch lands in ``sink`` exactly once across driver crashes.

    ``client`` is a ``CoordinatorClient``, a gRPC target string, or a zero-argument factory (called
    lazily, on the driver). ``query_name`` must be stable across restarts and unique per query and
    sink. ``ttl_ms`` bounds how long a record of an unfinished batch outlives its driver.
    """
    return ExactlyOnceWriter(
        sink, client, query_name=query_name, batch_function=batch_function, ttl_ms=ttl_ms
    )
