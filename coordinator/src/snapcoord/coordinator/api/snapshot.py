"""SnapshotService: generation snapshots per app, task reports, fencing and retention."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.v1 import snapshot_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


class SnapshotService(snapshot_pb2_grpc.SnapshotServiceServicer):
    """snapcoord.v1.SnapshotService (API.md "SnapshotService").

    Not built yet: the generation snapshots issue brings it (CreateSnapshot, ReportTaskSnapshot, fencing,
    retention policy). Until then every RPC is the generated base class's, which the interceptor answers
    with UNIMPLEMENTED naming the RPC; nothing pretends to work.
    """

    def __init__(self, services: Services) -> None:
        self._services = services

    def add_to(self, server: grpc.Server) -> None:
        snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(self, server)
