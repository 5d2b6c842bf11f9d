"""BacklogService: per-job backlog boundaries and progress (FLIP-309 processing backlog)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.v1 import backlog_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


class BacklogService(backlog_pb2_grpc.BacklogServiceServicer):
    """snapcoord.v1.BacklogService (API.md "BacklogService").

    Not built yet: the processing backlog issue brings it (MarkBacklog, ReportProgress, GetBacklogStatus,
    ClearBacklog). Until then every RPC is the generated base class's, which the interceptor answers with
    UNIMPLEMENTED naming the RPC; nothing pretends to work.
    """

    def __init__(self, services: Services) -> None:
        self._services = services

    def add_to(self, server: grpc.Server) -> None:
        backlog_pb2_grpc.add_BacklogServiceServicer_to_server(self, server)
