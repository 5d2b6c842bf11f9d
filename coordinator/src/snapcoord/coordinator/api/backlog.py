"""BacklogService: per-job backlog boundaries and progress (FLIP-309 processing backlog)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

import grpc

from snapcoord.coordinator.api.convert import backlog_status_to_pb, offsets_from_pb, offsets_to_pb
from snapcoord.coordinator.domain.backlog import Positions
from snapcoord.v1 import backlog_pb2, backlog_pb2_grpc, common_pb2

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


_FIELDS = attrgetter("stream", "partition", "offset")


def positions_from_pb(items: Sequence[common_pb2.Offset]) -> Positions:
    """A report's positions as columns, read in C (``map``): no ``Offset`` per partition."""
    if not items:
        return Positions((), (), ())
    streams, partitions, offsets = zip(*map(_FIELDS, items), strict=True)
    return Positions(streams, partitions, offsets)


class BacklogService(backlog_pb2_grpc.BacklogServiceServicer):
    """snapcoord.v1.BacklogService (docs/api.md, "BacklogService"): converts, calls the registry,
    converts back.

    Errors are the registry's ``SnapcoordError``s; the interceptor maps them to status codes.
    ReportProgress's status carries ``job_id`` and ``processing_backlog`` without partitions (its
    answer grows with what changed: ``domain.backlog.Progress``), and its ``unmarked`` the
    positions of partitions the mark does not name; MarkBacklog and GetBacklogStatus list every
    partition, MarkBacklog also the partitions it ``added``.
    """

    def __init__(self, services: Services) -> None:
        self._backlog = services.backlog

    def add_to(self, server: grpc.Server) -> None:
        backlog_pb2_grpc.add_BacklogServiceServicer_to_server(self, server)

    def MarkBacklog(
        self, request: backlog_pb2.MarkBacklogRequest, context: grpc.ServicerContext
    ) -> backlog_pb2.BacklogStatus:
        status = self._backlog.mark(request.job_id, offsets_from_pb(request.boundaries), request.reset)
        return backlog_status_to_pb(status)

    def ReportProgress(
        self, request: backlog_pb2.ReportProgressRequest, context: grpc.ServicerContext
    ) -> backlog_pb2.ReportProgressResponse:
        positions = positions_from_pb(request.positions)
        progress = self._backlog.report(request.job_id, positions, request.report_id)
        return backlog_pb2.ReportProgressResponse(
            newly_finished=offsets_to_pb(progress.newly_finished),
            status=backlog_pb2.BacklogStatus(
                job_id=progress.job_id, processing_backlog=progress.processing_backlog
            ),
            unmarked=offsets_to_pb(progress.unmarked),
        )

    def GetBacklogStatus(
        self, request: backlog_pb2.GetBacklogStatusRequest, context: grpc.ServicerContext
    ) -> backlog_pb2.BacklogStatus:
        return backlog_status_to_pb(self._backlog.status(request.job_id))

    def ClearBacklog(
        self, request: backlog_pb2.ClearBacklogRequest, context: grpc.ServicerContext
    ) -> backlog_pb2.ClearBacklogResponse:
        return backlog_pb2.ClearBacklogResponse(cleared=self._backlog.clear(request.job_id))
