"""ProducerOffsetService: create-if-absent producer offset records with a TTL."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.coordinator.api.convert import offsets_from_pb, producer_snapshot_to_pb
from snapcoord.v1 import producer_pb2, producer_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


class ProducerOffsetService(producer_pb2_grpc.ProducerOffsetServiceServicer):
    """snapcoord.v1.ProducerOffsetService (docs/api.md): converts, calls the registry, converts back.

    Errors are the registry's ``SnapcoordError``s; the interceptor maps them to status codes.
    """

    def __init__(self, services: Services) -> None:
        self._producers = services.producers

    def add_to(self, server: grpc.Server) -> None:
        producer_pb2_grpc.add_ProducerOffsetServiceServicer_to_server(self, server)

    def RegisterProducerOffsets(
        self, request: producer_pb2.RegisterProducerOffsetsRequest, context: grpc.ServicerContext
    ) -> producer_pb2.RegisterProducerOffsetsResponse:
        outcome = self._producers.register(
            request.producer_id, offsets_from_pb(request.offsets), request.ttl_ms
        )
        return producer_pb2.RegisterProducerOffsetsResponse(
            registered=outcome.registered, snapshot=producer_snapshot_to_pb(outcome.snapshot)
        )

    def GetProducerOffsets(
        self, request: producer_pb2.GetProducerOffsetsRequest, context: grpc.ServicerContext
    ) -> producer_pb2.ProducerSnapshot:
        return producer_snapshot_to_pb(self._producers.get(request.producer_id))

    def DeleteProducerOffsets(
        self, request: producer_pb2.DeleteProducerOffsetsRequest, context: grpc.ServicerContext
    ) -> producer_pb2.DeleteProducerOffsetsResponse:
        return producer_pb2.DeleteProducerOffsetsResponse(deleted=self._producers.delete(request.producer_id))

    def AdvanceProducerOffsets(
        self, request: producer_pb2.AdvanceProducerOffsetsRequest, context: grpc.ServicerContext
    ) -> producer_pb2.AdvanceProducerOffsetsResponse:
        outcome, deleted = self._producers.advance(
            request.producer_id,
            offsets_from_pb(request.offsets),
            request.ttl_ms,
            request.previous_producer_id,
        )
        return producer_pb2.AdvanceProducerOffsetsResponse(
            registered=outcome.registered,
            snapshot=producer_snapshot_to_pb(outcome.snapshot),
            previous_deleted=deleted,
        )

    def ListProducerOffsets(
        self, request: producer_pb2.ListProducerOffsetsRequest, context: grpc.ServicerContext
    ) -> producer_pb2.ListProducerOffsetsResponse:
        page, token = self._producers.list_page(request.page_size, request.page_token)
        return producer_pb2.ListProducerOffsetsResponse(
            snapshots=[producer_snapshot_to_pb(s) for s in page], next_page_token=token
        )
