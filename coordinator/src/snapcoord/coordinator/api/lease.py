"""LeaseService: leases that pin snapshots against deletion while a reader needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.v1 import lease_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


class LeaseService(lease_pb2_grpc.LeaseServiceServicer):
    """snapcoord.v1.LeaseService (API.md "LeaseService").

    Not built yet: the snapshot leases issue brings it (AcquireSnapshots, renew, release, pin index).
    Until then every RPC is the generated base class's, which the interceptor answers with UNIMPLEMENTED
    naming the RPC; nothing pretends to work.
    """

    def __init__(self, services: Services) -> None:
        self._services = services

    def add_to(self, server: grpc.Server) -> None:
        lease_pb2_grpc.add_LeaseServiceServicer_to_server(self, server)
