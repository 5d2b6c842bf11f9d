"""SnapshotService: an application-wide table of generation snapshots."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from snapcoord.coordinator.api.chunk_frames import PreEncodedChunks, encode_chunk
from snapcoord.coordinator.api.convert import offsets_from_pb, snapshot_to_pb
from snapcoord.coordinator.api.snapshot_frames import encode_snapshot
from snapcoord.coordinator.errors import InvalidArgument
from snapcoord.coordinator.transport.status import until_ended
from snapcoord.v1 import snapshot_pb2, snapshot_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


class SnapshotService(snapshot_pb2_grpc.SnapshotServiceServicer):
    """snapcoord.v1.SnapshotService (docs/api.md): converts, calls the registry, converts back.

    GetCurrentSnapshot, ListSnapshots, CreateSnapshot and AbortSnapshot answer with snapshot
    headers (no task reports); ReportTaskSnapshot adds the task it recorded; GetSnapshot has every
    task, with checkpoint payloads when include_checkpoints is set.
    """

    def __init__(self, services: Services) -> None:
        self._snapshots = services.snapshots

    def add_to(self, server: grpc.Server) -> None:
        snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(self, PreEncodedChunks(server))

    def CreateSnapshot(
        self, request: snapshot_pb2.CreateSnapshotRequest, context: grpc.ServicerContext
    ) -> bytes | snapshot_pb2.Snapshot:
        snapshot = self._snapshots.create(
            request.app_id, list(request.task_ids), request.ttl_ms, request.timeout_ms, dict(request.labels)
        )
        return encode_snapshot(snapshot)

    def GetCurrentSnapshot(
        self, request: snapshot_pb2.GetCurrentSnapshotRequest, context: grpc.ServicerContext
    ) -> bytes | snapshot_pb2.Snapshot:
        return encode_snapshot(self._snapshots.current(request.app_id, consistent=request.consistent))

    def GetSnapshot(
        self, request: snapshot_pb2.GetSnapshotRequest, context: grpc.ServicerContext
    ) -> bytes | snapshot_pb2.Snapshot:
        found = self._snapshots.get(
            request.app_id, request.generation, include_checkpoints=request.include_checkpoints
        )
        return encode_snapshot(found.snapshot, found.payloads)

    def ReadCheckpoint(
        self, request: snapshot_pb2.ReadCheckpointRequest, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        # Each message is a CheckpointChunk encoded by hand (chunk_frames): add_to registers a
        # serializer that passes the bytes through.
        ref, pieces = self._snapshots.read_checkpoint(
            request.app_id, request.generation, request.task_id, request.store
        )
        offset = 0
        with contextlib.closing(pieces):
            for piece in pieces:
                yield encode_chunk(piece, offset, ref.size, ref.sha256)
                offset += len(piece)
        if offset == 0:  # an empty payload still answers with its size and hash
            yield encode_chunk(b"", 0, ref.size, ref.sha256)

    def ListSnapshots(
        self, request: snapshot_pb2.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.ListSnapshotsResponse:
        page, token = self._snapshots.list_page(request.app_id, request.page_size, request.page_token)
        return snapshot_pb2.ListSnapshotsResponse(
            snapshots=[snapshot_to_pb(s) for s in page], next_page_token=token
        )

    def ReportTaskSnapshot(
        self, request: snapshot_pb2.ReportTaskSnapshotRequest, context: grpc.ServicerContext
    ) -> bytes | snapshot_pb2.Snapshot:
        task = request.task
        snapshot = self._snapshots.report(
            request.app_id,
            request.generation,
            task.task_id,
            offsets_from_pb(task.committed_offsets),
            dict(task.checkpoints),
            dict(task.uploaded_checkpoints),
        )
        return encode_snapshot(snapshot)

    def UploadCheckpoint(
        self, request_iterator: Iterator[snapshot_pb2.UploadCheckpointRequest], context: grpc.ServicerContext
    ) -> snapshot_pb2.CheckpointUpload:
        request_iterator = until_ended(request_iterator, context)
        first = next(request_iterator, None)
        if first is None:
            raise InvalidArgument(
                "UploadCheckpoint got no message: the first names app_id, generation, task_id and store"
            )

        def pieces() -> Iterator[bytes]:
            if first.data:
                yield first.data
            for n, message in enumerate(request_iterator, start=2):
                if message.app_id or message.generation or message.task_id or message.store:
                    raise InvalidArgument(
                        f"UploadCheckpoint message {n} sets app_id, generation, task_id or store; only the "
                        "first message names the checkpoint, later ones carry only data"
                    )
                if message.data:
                    yield message.data

        stored = self._snapshots.upload(first.app_id, first.generation, first.task_id, first.store, pieces())
        return snapshot_pb2.CheckpointUpload(
            upload_id=stored.upload_id, size=stored.size, sha256=stored.sha256
        )

    def AbortSnapshot(
        self, request: snapshot_pb2.AbortSnapshotRequest, context: grpc.ServicerContext
    ) -> bytes | snapshot_pb2.Snapshot:
        return encode_snapshot(self._snapshots.abort(request.app_id, request.generation, request.reason))

    def DeleteSnapshot(
        self, request: snapshot_pb2.DeleteSnapshotRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.DeleteSnapshotResponse:
        return snapshot_pb2.DeleteSnapshotResponse(
            deleted=self._snapshots.delete(request.app_id, request.generation)
        )

    def SetRetentionPolicy(
        self, request: snapshot_pb2.SetRetentionPolicyRequest, context: grpc.ServicerContext
    ) -> snapshot_pb2.RetentionPolicy:
        policy = self._snapshots.set_retention(
            request.app_id, request.keep_last_completed, request.completed_ttl_ms
        )
        return snapshot_pb2.RetentionPolicy(
            app_id=request.app_id,
            keep_last_completed=policy.keep_last_completed,
            completed_ttl_ms=policy.completed_ttl_ms,
        )
