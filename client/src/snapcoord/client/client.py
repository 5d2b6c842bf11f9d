"""``CoordinatorClient``: one method per RPC of the five snapcoord.v1 services.

Each method converts its arguments to the request message, makes the call with a deadline (the
client's ``timeout_s`` or the method's own), retries UNAVAILABLE for idempotent RPCs (their
``idempotency_level`` in the proto: ``_retry.IDEMPOTENT``), turns a failed status into a
``SnapcoordError`` subclass, and returns a frozen dataclass. The channel is created on the first
call in each process.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

import grpc

from snapcoord.client import _convert as cv
from snapcoord.client import tracing
from snapcoord.client._channel import (
    KEEPALIVE_OPTIONS,
    SERVICE_CONFIG,
    SERVICE_OF,
    LazyChannel,
    MiB,
    TlsConfig,
    normalize_target,
)
from snapcoord.client._env import tls_from_env, token_from_env
from snapcoord.client._retry import RetryPolicy, call_with_retry
from snapcoord.client._types import (
    AcquireResult,
    AdvanceResult,
    BacklogStatus,
    CheckpointUpload,
    CommitClaimResult,
    CommitClaims,
    Lease,
    Offset,
    Page,
    ProducerSnapshot,
    ProgressResult,
    Registration,
    RetentionPolicy,
    Snapshot,
    SnapshotRef,
    TableFence,
    TaskSnapshot,
)
from snapcoord.client.errors import Internal, SnapcoordError, error_from_rpc
from snapcoord.client.lease import LeaseKeeper

R = TypeVar("R")

#: Channel options the client sets unless ``grpc_options`` names them. The reconnect backoff is
#: capped at 10 s (gRPC's default cap is 120 s) so that a client finds a restarted coordinator
#: within a few of its own retries instead of failing fast for minutes.
DEFAULT_GRPC_OPTIONS: Mapping[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 250,
    "grpc.max_reconnect_backoff_ms": 10_000,
    "grpc.primary_user_agent": "snapcoord-python-client",
    "grpc.service_config": SERVICE_CONFIG,
    **KEEPALIVE_OPTIONS,
}


#: Most payload bytes per UploadCheckpoint message (the coordinator refuses bigger ones).
UPLOAD_CHUNK_BYTES = MiB


def _pieces(data: bytes | BinaryIO | Iterable[bytes]) -> Iterator[bytes]:
    """``data`` in pieces of at most ``UPLOAD_CHUNK_BYTES`` (non-empty ones only)."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for at in range(0, len(view), UPLOAD_CHUNK_BYTES):
            yield bytes(view[at : at + UPLOAD_CHUNK_BYTES])
        return
    if hasattr(data, "read"):
        while piece := data.read(UPLOAD_CHUNK_BYTES):
            yield bytes(piece)
        return
    for item in data:
        view = memoryview(item)
        for at in range(0, len(view), UPLOAD_CHUNK_BYTES):
            yield bytes(view[at : at + UPLOAD_CHUNK_BYTES])


class CoordinatorClient:
    """A thin, typed client for one coordinator or several replicas.

    ``target`` is a gRPC target (``host:port``, ``dns:///name:port``, ``ipv4:10.0.0.1:1,10.0.0.2:1``),
    a comma-separated list of IP addresses, or a sequence of them; calls are spread over every
    address with gRPC's ``round_robin`` policy (``grpc_options`` may override it). ``timeout_s``
    bounds every call, retries included, unless the call passes its own. ``tls`` switches to TLS
    (mutual with a key and chain); ``token`` is sent as ``authorization: Bearer <token>`` (as call
    credentials over TLS, as plain metadata otherwise: use plaintext only on trusted paths). Left
    unset, both come from the environment (``SNAPCOORD_TOKEN`` or ``SNAPCOORD_TOKEN_FILE``;
    ``SNAPCOORD_CLIENT_CA``, ``SNAPCOORD_CLIENT_CERT``, ``SNAPCOORD_CLIENT_KEY``). Message size
    limits default to 128 MiB each way because checkpoints can be large.

    The client is thread-safe and cheap to keep. It cannot be pickled: a Spark task builds its own
    from the target. After a fork the child's first call opens the child's own channel.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        timeout_s: float = 30.0,
        tls: TlsConfig | None = None,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        max_receive_message_bytes: int = 128 * MiB,
        max_send_message_bytes: int = 128 * MiB,
        grpc_options: Mapping[str, Any] | Sequence[tuple[str, Any]] = (),
    ) -> None:
        target = normalize_target(target)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._timeout_s = float(timeout_s)
        self._retry = retry if retry is not None else RetryPolicy()
        options: dict[str, Any] = {
            **DEFAULT_GRPC_OPTIONS,
            "grpc.max_receive_message_length": max_receive_message_bytes,
            "grpc.max_send_message_length": max_send_message_bytes,
        }
        options.update(dict(grpc_options))
        # Unset credentials come from SNAPCOORD_TOKEN / SNAPCOORD_CLIENT_* (see _env), so a client
        # built from an address alone (the Spark connector's) authenticates as the deployment says.
        tls = tls if tls is not None else tls_from_env()
        token = token if token is not None else token_from_env()
        self._channel = LazyChannel(target, tls=tls, token=token, options=tuple(options.items()))

    # -- lifecycle -------------------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return self._channel.target

    @property
    def timeout_s(self) -> float:
        """The default deadline of a call, retries included."""
        return self._timeout_s

    def close(self) -> None:
        """Close the channel of this process; later calls raise ValueError. Idempotent."""
        self._channel.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CoordinatorClient({self.target!r}, timeout_s={self._timeout_s})"

    def __reduce__(self) -> Any:
        raise TypeError(
            "CoordinatorClient cannot be pickled (it owns a gRPC channel): pass the target string to "
            "the task and create a CoordinatorClient there"
        )

    def _call(self, method: str, request: Any, convert: Callable[[Any], R], timeout_s: float | None) -> R:
        budget = self._timeout_s if timeout_s is None else timeout_s
        if budget <= 0:
            raise ValueError(f"timeout_s must be positive, got {budget}")

        with tracing.call_span(SERVICE_OF[method], method) as span:
            # The trace headers name this call's span, so every attempt joins the caller's trace.
            metadata = span.metadata(self._channel.metadata)

            def attempt(remaining_s: float) -> Any:
                rpc = self._channel.method(method)
                try:
                    return rpc(request, timeout=remaining_s, metadata=metadata)
                except grpc.RpcError as e:
                    raise error_from_rpc(e, method) from e

            try:
                reply = call_with_retry(attempt, method=method, policy=self._retry, timeout_s=budget)
            except SnapcoordError as e:
                span.finish(e.code, e.attempts)
                raise
            span.finish("OK", 1)
        return convert(reply)

    # -- ProducerOffsetService -------------------------------------------------------------------------
    def register_producer_offsets(
        self, producer_id: str, offsets: Iterable[Offset], *, ttl_ms: int = 0, timeout_s: float | None = None
    ) -> Registration:
        """Register the positions a sink starts from; the first registration wins (create-if-absent).

        ``registered`` False means a record existed and ``snapshot`` is the stored one. This call is
        retried on UNAVAILABLE, so when a reply was lost after the coordinator stored *this*
        registration, the retry answers registered=False with it. Tell the two apart by comparing:
        ``registration.snapshot.offsets == tuple(offsets)`` means the stored positions are the ones
        sent (yours, or an identical registration: either way the right ones to roll back to).
        ``ttl_ms`` 0 is the server default (24 h).
        """
        offsets = tuple(offsets)
        return self._call(
            "RegisterProducerOffsets",
            cv.register_request(producer_id, offsets, ttl_ms),
            cv.registration_from_pb,
            timeout_s,
        )

    def get_producer_offsets(self, producer_id: str, *, timeout_s: float | None = None) -> ProducerSnapshot:
        """The stored registration; ``NotFound`` when absent (``Expired``, a subclass, when expired)."""
        return self._call(
            "GetProducerOffsets",
            cv.get_producer_request(producer_id),
            cv.producer_snapshot_from_pb,
            timeout_s,
        )

    def delete_producer_offsets(self, producer_id: str, *, timeout_s: float | None = None) -> bool:
        """Delete the registration; False when there was none (also after a retried call)."""
        return self._call(
            "DeleteProducerOffsets",
            cv.delete_producer_request(producer_id),
            cv.deleted_producer_from_pb,
            timeout_s,
        )

    def advance_producer_offsets(
        self,
        producer_id: str,
        offsets: Iterable[Offset],
        *,
        previous_producer_id: str,
        ttl_ms: int = 0,
        timeout_s: float | None = None,
    ) -> AdvanceResult:
        """Delete ``previous_producer_id``'s registration and register ``producer_id`` (create-if-
        absent, as ``register_producer_offsets``) in one transaction on the coordinator: one call
        where a writer that keeps one record per step would make a delete and a register.

        A live registration of ``producer_id`` is kept (``registered`` False, ``snapshot`` the stored
        one) and the previous one is deleted all the same. ``previous_deleted`` says whether a live
        previous registration was deleted (False for none, and after a retried call). Retried on
        UNAVAILABLE like the register: compare ``snapshot.offsets`` to tell a lost reply of this
        call from someone else's record. ``InvalidArgument`` when ``previous_producer_id`` is empty
        or equals ``producer_id``; a coordinator older than this RPC answers ``Unimplemented``.
        """
        offsets = tuple(offsets)
        return self._call(
            "AdvanceProducerOffsets",
            cv.advance_request(producer_id, offsets, ttl_ms, previous_producer_id),
            cv.advanced_from_pb,
            timeout_s,
        )

    def list_producer_offsets(
        self, *, page_size: int = 0, page_token: str = "", timeout_s: float | None = None
    ) -> Page[ProducerSnapshot]:
        """One page of registrations (``page_size`` 0 = the server's default)."""
        return self._call(
            "ListProducerOffsets",
            cv.list_producers_request(page_size, page_token),
            cv.producer_page_from_pb,
            timeout_s,
        )

    # -- SnapshotService -------------------------------------------------------------------------------
    def create_snapshot(
        self,
        app_id: str,
        task_ids: Iterable[str],
        *,
        ttl_ms: int = 0,
        timeout_ms: int = 0,
        labels: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Snapshot:
        """Start generation+1 in state CREATED; if the current snapshot is still CREATED, return it
        unchanged (so a retry is safe: check ``task_ids`` if several drivers may create).
        ``timeout_ms`` (0 = server default) is how long it may stay CREATED before it is aborted."""
        return self._call(
            "CreateSnapshot",
            cv.create_snapshot_request(app_id, task_ids, ttl_ms, timeout_ms, labels or {}),
            cv.snapshot_from_pb,
            timeout_s,
        )

    def get_current_snapshot(
        self, app_id: str, *, consistent: bool = False, timeout_s: float | None = None
    ) -> Snapshot:
        """The current snapshot header (generation 0, state EMPTY before the first one).
        ``consistent`` reads through to ZooKeeper instead of the coordinator's watch-fed cache."""
        return self._call(
            "GetCurrentSnapshot", cv.get_current_request(app_id, consistent), cv.snapshot_from_pb, timeout_s
        )

    def get_snapshot(
        self,
        app_id: str,
        generation: int,
        *,
        include_checkpoints: bool = False,
        timeout_s: float | None = None,
    ) -> Snapshot:
        """One snapshot with every task's report; checkpoint payloads only with
        ``include_checkpoints``. ``NotFound`` when absent."""
        return self._call(
            "GetSnapshot",
            cv.get_snapshot_request(app_id, generation, include_checkpoints),
            cv.snapshot_from_pb,
            timeout_s,
        )

    def read_checkpoint(
        self, app_id: str, generation: int, task_id: str, store: str, *, timeout_s: float | None = None
    ) -> Iterator[bytes]:
        """One task's checkpoint payload for ``store``, as pieces of at most 1 MiB, streamed as they
        are consumed (``NotFound`` when absent). The whole payload is never in memory on either
        side; for payloads above the server's inline limit this is the only way to read them.
        After the last piece the payload's size and SHA-256 are checked (``Internal`` on a
        mismatch). Not retried: a caller that loses the stream reads again from the start."""
        budget = self._timeout_s if timeout_s is None else timeout_s
        if budget <= 0:
            raise ValueError(f"timeout_s must be positive, got {budget}")
        method = "ReadCheckpoint"
        request = cv.read_checkpoint_request(app_id, generation, task_id, store)

        def open_stream(remaining_s: float) -> tuple[Any, Any]:
            """The stream and its first piece: retried on UNAVAILABLE like any read."""
            stream = self._channel.method(method)(
                request, timeout=remaining_s, metadata=self._channel.metadata
            )
            try:
                return stream, next(stream, None)
            except grpc.RpcError as e:
                raise error_from_rpc(e, method) from e

        stream, first = call_with_retry(open_stream, method=method, policy=self._retry, timeout_s=budget)
        digest = hashlib.sha256()
        size, expected_size, expected_sha = 0, 0, hashlib.sha256().hexdigest()
        try:
            chunk = first
            while chunk is not None:
                expected_size, expected_sha = chunk.total_size, chunk.sha256
                if chunk.data:
                    digest.update(chunk.data)
                    size += len(chunk.data)
                    yield chunk.data
                chunk = next(stream, None)
        except grpc.RpcError as e:
            raise error_from_rpc(e, method) from e
        finally:
            stream.cancel()  # a reader that stopped early frees the server's stream
        if (size, digest.hexdigest()) != (expected_size, expected_sha):
            raise Internal(
                f"checkpoint {app_id}@{generation}/{task_id}/{store}: received {size} bytes with SHA-256 "
                f"{digest.hexdigest()}, the server announced {expected_size} bytes with {expected_sha}",
                method=method,
            )

    def upload_checkpoint(
        self,
        app_id: str,
        generation: int,
        task_id: str,
        store: str,
        data: bytes | BinaryIO | Iterable[bytes],
        *,
        timeout_s: float | None = None,
    ) -> CheckpointUpload:
        """Stream one checkpoint payload to the coordinator's blob store, for a later
        ``report_task_snapshot`` that names it in ``TaskSnapshot.uploads`` (store -> upload_id).

        ``data`` is bytes, a binary file (read from its current position to its end) or an iterable
        of byte pieces; it goes in messages of at most 1 MiB, so neither side holds the payload
        whole. Refused like a report (``SnapshotFenced``, ``InvalidArgument`` for a task outside the
        task set) before any data is sent on. Retried on UNAVAILABLE only when ``data`` is bytes or
        a seekable file: every attempt is a new upload sent from the start (an iterable cannot be
        replayed). An upload no report names is removed by the coordinator's janitor.
        """
        budget = self._timeout_s if timeout_s is None else timeout_s
        if budget <= 0:
            raise ValueError(f"timeout_s must be positive, got {budget}")
        method = "UploadCheckpoint"
        start: int | None = None
        replayable = isinstance(data, bytes | bytearray | memoryview)
        if not replayable and hasattr(data, "read") and getattr(data, "seekable", lambda: False)():
            start = data.tell()  # type: ignore[union-attr]
            replayable = True

        def messages() -> Iterator[Any]:
            if start is not None:
                data.seek(start)  # type: ignore[union-attr]
            first = True
            for piece in _pieces(data):
                if first:
                    yield cv.upload_header(app_id, generation, task_id, store, piece)
                    first = False
                else:
                    yield cv.upload_data(piece)
            if first:  # an empty payload: the header alone
                yield cv.upload_header(app_id, generation, task_id, store, b"")

        with tracing.call_span(SERVICE_OF[method], method) as span:
            metadata = span.metadata(self._channel.metadata)

            def attempt(remaining_s: float) -> Any:
                rpc = self._channel.method(method)
                try:
                    return rpc(messages(), timeout=remaining_s, metadata=metadata)
                except grpc.RpcError as e:
                    raise error_from_rpc(e, method) from e

            try:
                reply = call_with_retry(
                    attempt, method=method, policy=self._retry, timeout_s=budget, retryable=replayable
                )
            except SnapcoordError as e:
                span.finish(e.code, e.attempts)
                raise
            span.finish("OK", 1)
        return cv.checkpoint_upload_from_pb(reply)

    def list_snapshots(
        self, app_id: str, *, page_size: int = 0, page_token: str = "", timeout_s: float | None = None
    ) -> Page[Snapshot]:
        """One page of the app's snapshot headers, newest first."""
        return self._call(
            "ListSnapshots",
            cv.list_snapshots_request(app_id, page_size, page_token),
            cv.snapshot_page_from_pb,
            timeout_s,
        )

    def report_task_snapshot(
        self, app_id: str, generation: int, task: TaskSnapshot, *, timeout_s: float | None = None
    ) -> Snapshot:
        """Report one task's offsets and checkpoints for ``generation``; returns the header with
        this task's report (state COMPLETED when it was the last one).

        ``SnapshotFenced`` when the generation is not current, the snapshot is no longer CREATED, or
        the task already reported something different; ``InvalidArgument`` when the task is not in
        the snapshot's task set. The same report twice is accepted, so this call is retried.
        Stores in ``task.uploads`` name payloads streamed with ``upload_checkpoint`` before.
        """
        return self._call(
            "ReportTaskSnapshot", cv.report_request(app_id, generation, task), cv.snapshot_from_pb, timeout_s
        )

    def abort_snapshot(
        self, app_id: str, generation: int, reason: str = "", *, timeout_s: float | None = None
    ) -> Snapshot:
        """CREATED -> ABORTED (idempotent); the next ``create_snapshot`` starts generation+1."""
        return self._call(
            "AbortSnapshot", cv.abort_request(app_id, generation, reason), cv.snapshot_from_pb, timeout_s
        )

    def delete_snapshot(self, app_id: str, generation: int, *, timeout_s: float | None = None) -> bool:
        """Delete an ended snapshot; False when there was none. ``LeaseHeld`` while a lease holds it,
        ``SnapshotInProgress`` while it is still CREATED (both ``FailedPrecondition``)."""
        return self._call(
            "DeleteSnapshot",
            cv.delete_snapshot_request(app_id, generation),
            cv.deleted_snapshot_from_pb,
            timeout_s,
        )

    def set_retention_policy(
        self,
        app_id: str,
        *,
        keep_last_completed: int,
        completed_ttl_ms: int,
        timeout_s: float | None = None,
    ) -> RetentionPolicy:
        """Override the server's retention defaults for one app."""
        return self._call(
            "SetRetentionPolicy",
            cv.retention_request(app_id, keep_last_completed, completed_ttl_ms),
            cv.retention_from_pb,
            timeout_s,
        )

    # -- LeaseService ----------------------------------------------------------------------------------
    def acquire_snapshots(
        self,
        lease_id: str,
        snapshots: Iterable[SnapshotRef],
        *,
        duration_ms: int,
        timeout_s: float | None = None,
    ) -> AcquireResult:
        """Create the lease if absent, renew it to now+duration and pin every snapshot that exists;
        the others come back in ``unavailable``. See ``lease()`` for a lease kept alive for you."""
        return self._call(
            "AcquireSnapshots",
            cv.acquire_request(lease_id, duration_ms, snapshots),
            cv.acquire_from_pb,
            timeout_s,
        )

    def release_snapshots(
        self, lease_id: str, snapshots: Iterable[SnapshotRef], *, timeout_s: float | None = None
    ) -> Lease:
        """Unpin; ``NotFound`` for an unknown lease, ``Expired`` (a ``NotFound``) for an expired one."""
        return self._call(
            "ReleaseSnapshots", cv.release_request(lease_id, snapshots), cv.lease_of_pb, timeout_s
        )

    def renew_lease(self, lease_id: str, *, duration_ms: int, timeout_s: float | None = None) -> Lease:
        """Set the lease's expiry to now+duration; ``NotFound`` for an unknown lease, ``Expired`` (a
        ``NotFound``) for an expired one."""
        return self._call("RenewLease", cv.renew_request(lease_id, duration_ms), cv.lease_of_pb, timeout_s)

    def drop_lease(self, lease_id: str, *, timeout_s: float | None = None) -> bool:
        """Release everything and delete the lease; False when there was none."""
        return self._call("DropLease", cv.drop_request(lease_id), cv.dropped_from_pb, timeout_s)

    def get_lease(self, lease_id: str, *, timeout_s: float | None = None) -> Lease:
        """The lease; ``NotFound`` when unknown, ``Expired`` (a ``NotFound``) when expired."""
        return self._call("GetLease", cv.get_lease_request(lease_id), cv.lease_from_pb, timeout_s)

    def list_leases(
        self, *, page_size: int = 0, page_token: str = "", timeout_s: float | None = None
    ) -> Page[Lease]:
        """One page of leases."""
        return self._call(
            "ListLeases", cv.list_leases_request(page_size, page_token), cv.lease_page_from_pb, timeout_s
        )

    def lease(
        self,
        lease_id: str,
        snapshots: Iterable[SnapshotRef],
        duration_s: float,
        *,
        renew_every_s: float | None = None,
        drop_on_exit: bool = True,
    ) -> LeaseKeeper:
        """``with client.lease(lease_id, refs, duration_s) as lease:`` pins ``refs`` for the block,
        renewing from a background thread every ``duration_s / 3``, and drops the lease on exit.

        Use ``load_or_create_lease_id(path, prefix)`` for ``lease_id`` so that a restarted driver
        takes its old lease over instead of leaking it until expiry.
        """
        return LeaseKeeper(
            self, lease_id, snapshots, duration_s, renew_every_s=renew_every_s, drop_on_exit=drop_on_exit
        )

    # -- BacklogService --------------------------------------------------------------------------------
    def mark_backlog(
        self,
        job_id: str,
        boundaries: Iterable[Offset],
        *,
        reset: bool = False,
        timeout_s: float | None = None,
    ) -> BacklogStatus:
        """Mark the backlog boundary of each partition; the first mark wins (kept across driver
        restarts) and later ones return it, unless ``reset``. A later mark naming partitions the
        stored one lacks adds them (each keeps its first boundary) and lists them in ``added``."""
        return self._call(
            "MarkBacklog", cv.mark_request(job_id, boundaries, reset), cv.backlog_status_from_pb, timeout_s
        )

    def report_progress(
        self,
        job_id: str,
        positions: Iterable[Offset],
        *,
        report_id: str | None = None,
        timeout_s: float | None = None,
    ) -> ProgressResult:
        """Report positions; ``newly_finished`` holds the partitions this report finished, and
        ``unmarked`` the positions of partitions the mark does not name (mark them).

        Safe to retry: the report goes with a ``report_id`` (a fresh UUID unless given), kept
        across the client's own retries on UNAVAILABLE, and a retry with the same id answers the
        same ``newly_finished``. After ``DeadlineExceeded`` (or any failure) call again with the
        same ``report_id`` and positions to learn what the report finished; a caller that may
        send a report again after a restart gives a deterministic id (the query run and batch).
        """
        rid = uuid.uuid4().hex if report_id is None else report_id
        return self._call(
            "ReportProgress", cv.progress_request(job_id, positions, rid), cv.progress_from_pb, timeout_s
        )

    def get_backlog_status(self, job_id: str, *, timeout_s: float | None = None) -> BacklogStatus:
        """The job's boundaries and progress; ``NotFound`` when never marked."""
        return self._call(
            "GetBacklogStatus", cv.get_backlog_request(job_id), cv.backlog_status_from_pb, timeout_s
        )

    def clear_backlog(self, job_id: str, *, timeout_s: float | None = None) -> bool:
        """Forget the job's mark and progress; False when there was none."""
        return self._call("ClearBacklog", cv.clear_backlog_request(job_id), cv.cleared_from_pb, timeout_s)

    # -- CommitClaimService ----------------------------------------------------------------------------
    def fence_table(
        self, table_id: str, epoch: int, seq: int, *, timeout_s: float | None = None
    ) -> TableFence:
        """Fence ``table_id`` at ``epoch`` (a new run of the writer) and claim the number its writes
        start from, in one coordinator transaction: ``from_seq`` is the higher of ``seq`` (the next
        number as the store shows it) and one above the table's highest claim, so a number an older
        run claimed is never handed out again. From then on ``claim_commit`` refuses lower epochs.

        ``TableFenced`` (with ``fence_epoch``) when a newer run fenced the table already; nothing
        changes then. The same epoch again answers the recorded fence, so a retry is safe.
        ``Unsupported`` from a coordinator older than 0.4.0.
        """
        return self._call(
            "FenceTable", cv.fence_table_request(table_id, epoch, seq), cv.table_fence_from_pb, timeout_s
        )

    def claim_commit(
        self, table_id: str, seq: int, epoch: int, attempt: str, *, timeout_s: float | None = None
    ) -> CommitClaimResult:
        """Claim log number ``seq`` of ``table_id`` for one write before making its entry visible.

        ``granted`` True: this write (``epoch`` and ``attempt``, 1-64 characters of
        ``[A-Za-z0-9._:-]``) holds the number, also when this is a retry of a call whose reply was
        lost. ``granted`` False: ``holder`` is the write that holds it; do not write the entry.
        ``TableFenced`` when a run with a higher epoch fenced the table (nothing is claimed);
        ``Unsupported`` from a coordinator older than 0.4.0.
        """
        return self._call(
            "ClaimCommit",
            cv.claim_commit_request(table_id, seq, epoch, attempt),
            cv.claim_result_from_pb,
            timeout_s,
        )

    def get_commit_claims(
        self, table_id: str, from_seq: int = 0, limit: int = 0, *, timeout_s: float | None = None
    ) -> CommitClaims:
        """The table's fence and its claims from ``from_seq`` on, in number order (at most
        ``limit``; 0 is the server's page size). ``NotFound`` when the table has neither a fence
        nor a claim."""
        return self._call(
            "GetCommitClaims",
            cv.get_claims_request(table_id, from_seq, limit),
            cv.commit_claims_from_pb,
            timeout_s,
        )
