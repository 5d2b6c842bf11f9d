"""ProducerOffsetService: create-if-absent producer offset records with a TTL."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.v1 import producer_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.server import Deps


class ProducerOffsetService(producer_pb2_grpc.ProducerOffsetServiceServicer):
    """snapcoord.v1.ProducerOffsetService (API.md "ProducerOffsetService").

    Not built yet: the producer offsets issue brings it (RegisterProducerOffsets and friends on the
    metadata and blob stores). Until then every RPC is the generated base class's, which the interceptor
    answers with UNIMPLEMENTED naming the RPC; nothing pretends to work.
    """

    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    def add_to(self, server: grpc.Server) -> None:
        producer_pb2_grpc.add_ProducerOffsetServiceServicer_to_server(self, server)  # type: ignore[no-untyped-call]
