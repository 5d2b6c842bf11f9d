"""The gRPC servicers of snapcoord.v1: convert requests, call one domain operation, convert back.

``add_servicers`` registers all five on a server; ``SERVICE_NAMES`` lists their full names for
health and reflection. A servicer not built yet is the generated base class: its RPCs raise
NotImplementedError, which the interceptor turns into UNIMPLEMENTED with a clear message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from snapcoord.coordinator.api.backlog import BacklogService
from snapcoord.coordinator.api.commit import CommitClaimService
from snapcoord.coordinator.api.lease import LeaseService
from snapcoord.coordinator.api.producer import ProducerOffsetService
from snapcoord.coordinator.api.snapshot import SnapshotService
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2

if TYPE_CHECKING:
    from snapcoord.coordinator.services import Services

#: Full names of the snapcoord.v1 services, from the descriptors (so a rename cannot drift).
SERVICE_NAMES: tuple[str, ...] = (
    producer_pb2.DESCRIPTOR.services_by_name["ProducerOffsetService"].full_name,
    snapshot_pb2.DESCRIPTOR.services_by_name["SnapshotService"].full_name,
    lease_pb2.DESCRIPTOR.services_by_name["LeaseService"].full_name,
    backlog_pb2.DESCRIPTOR.services_by_name["BacklogService"].full_name,
    commit_pb2.DESCRIPTOR.services_by_name["CommitClaimService"].full_name,
)


def add_servicers(server: grpc.Server, services: Services) -> None:
    """Register the five snapcoord.v1 servicers on ``server``."""
    ProducerOffsetService(services).add_to(server)
    SnapshotService(services).add_to(server)
    LeaseService(services).add_to(server)
    BacklogService(services).add_to(server)
    CommitClaimService(services).add_to(server)
