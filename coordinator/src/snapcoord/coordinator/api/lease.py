"""LeaseService: leases that pin snapshots against deletion while a reader needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.coordinator.api.convert import lease_to_pb, refs_from_pb, refs_to_pb
from snapcoord.v1 import lease_pb2, lease_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


class LeaseService(lease_pb2_grpc.LeaseServiceServicer):
    """snapcoord.v1.LeaseService (docs/api.md): converts, calls the lease registry, converts back."""

    def __init__(self, services: Services) -> None:
        self._leases = services.leases

    def add_to(self, server: grpc.Server) -> None:
        lease_pb2_grpc.add_LeaseServiceServicer_to_server(self, server)

    def AcquireSnapshots(
        self, request: lease_pb2.AcquireSnapshotsRequest, context: grpc.ServicerContext
    ) -> lease_pb2.AcquireSnapshotsResponse:
        acquired = self._leases.acquire(
            request.lease_id, request.duration_ms, refs_from_pb(request.snapshots)
        )
        return lease_pb2.AcquireSnapshotsResponse(
            lease=lease_to_pb(acquired.lease), unavailable=refs_to_pb(acquired.unavailable)
        )

    def ReleaseSnapshots(
        self, request: lease_pb2.ReleaseSnapshotsRequest, context: grpc.ServicerContext
    ) -> lease_pb2.ReleaseSnapshotsResponse:
        lease = self._leases.release(request.lease_id, refs_from_pb(request.snapshots))
        return lease_pb2.ReleaseSnapshotsResponse(lease=lease_to_pb(lease))

    def RenewLease(
        self, request: lease_pb2.RenewLeaseRequest, context: grpc.ServicerContext
    ) -> lease_pb2.RenewLeaseResponse:
        return lease_pb2.RenewLeaseResponse(
            lease=lease_to_pb(self._leases.renew(request.lease_id, request.duration_ms))
        )

    def DropLease(
        self, request: lease_pb2.DropLeaseRequest, context: grpc.ServicerContext
    ) -> lease_pb2.DropLeaseResponse:
        return lease_pb2.DropLeaseResponse(dropped=self._leases.drop(request.lease_id))

    def GetLease(self, request: lease_pb2.GetLeaseRequest, context: grpc.ServicerContext) -> lease_pb2.Lease:
        return lease_to_pb(self._leases.get(request.lease_id))

    def ListLeases(
        self, request: lease_pb2.ListLeasesRequest, context: grpc.ServicerContext
    ) -> lease_pb2.ListLeasesResponse:
        page, token = self._leases.list_page(request.page_size, request.page_token)
        return lease_pb2.ListLeasesResponse(leases=[lease_to_pb(x) for x in page], next_page_token=token)
