"""CommitClaimService: the commit point of sinks whose store has no atomic create-if-absent."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.coordinator.domain.claims import CommitClaim
from snapcoord.v1 import commit_pb2, commit_pb2_grpc

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services


def claim_to_pb(claim: CommitClaim) -> commit_pb2.CommitClaim:
    return commit_pb2.CommitClaim(
        seq=claim.seq, epoch=claim.epoch, attempt=claim.attempt, claimed_at_ms=claim.claimed_at_ms
    )


class CommitClaimService(commit_pb2_grpc.CommitClaimServiceServicer):
    """snapcoord.v1.CommitClaimService (docs/api.md, "CommitClaimService"): converts, calls the
    registry, converts back. Errors are the registry's ``SnapcoordError``s; the interceptor maps
    them to status codes."""

    def __init__(self, services: Services) -> None:
        self._claims = services.claims

    def add_to(self, server: grpc.Server) -> None:
        commit_pb2_grpc.add_CommitClaimServiceServicer_to_server(self, server)

    def FenceTable(
        self, request: commit_pb2.FenceTableRequest, context: grpc.ServicerContext
    ) -> commit_pb2.FenceTableResponse:
        fence = self._claims.fence(request.table_id, request.epoch, request.seq)
        return commit_pb2.FenceTableResponse(fence_epoch=fence.fence_epoch, from_seq=fence.from_seq)

    def ClaimCommit(
        self, request: commit_pb2.ClaimCommitRequest, context: grpc.ServicerContext
    ) -> commit_pb2.ClaimCommitResponse:
        result = self._claims.claim(request.table_id, request.seq, request.epoch, request.attempt)
        return commit_pb2.ClaimCommitResponse(
            granted=result.granted, holder=claim_to_pb(result.holder), fence_epoch=result.fence_epoch
        )

    def GetCommitClaims(
        self, request: commit_pb2.GetCommitClaimsRequest, context: grpc.ServicerContext
    ) -> commit_pb2.GetCommitClaimsResponse:
        listed = self._claims.claims(request.table_id, request.from_seq, request.limit)
        return commit_pb2.GetCommitClaimsResponse(
            fence_epoch=listed.fence_epoch,
            claims=[claim_to_pb(c) for c in listed.claims],
            next_seq=listed.next_seq,
        )
