"""CommitClaimService through the client against a real coordinator (the module's, on the embedded
stores): answers, status codes and ErrorInfo reasons, the client's exceptions, the metrics, and
the janitor's step as the server runs it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from snapcoord.client import (
    CommitClaim,
    CommitClaimResult,
    CommitClaims,
    CoordinatorClient,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    TableFence,
    TableFenced,
)
from snapcoord.client.errors import error_info
from snapcoord.v1 import commit_pb2, commit_pb2_grpc


def counted(coordinator: InProcessCoordinator, name: str, outcome: str) -> float:
    return coordinator.server.registry.get_sample_value(f"{name}_total", {"outcome": outcome}) or 0.0


def test_fence_claim_and_list_through_the_client(
    client: CoordinatorClient, coordinator: InProcessCoordinator
) -> None:
    granted_before = counted(coordinator, "snapcoord_commit_claims", "granted")
    first = client.claim_commit("svc-orders", 0, 1, "run1-b0")
    assert isinstance(first, CommitClaimResult) and first.granted and first.fence_epoch == 0
    assert isinstance(first.holder, CommitClaim) and (first.holder.seq, first.holder.attempt) == (
        0,
        "run1-b0",
    )
    assert client.claim_commit("svc-orders", 0, 1, "run1-b0") == first  # a retry
    held = client.claim_commit("svc-orders", 0, 1, "someone-else")
    assert not held.granted and held.holder == first.holder
    fence = client.fence_table("svc-orders", 2, 0)
    assert fence == TableFence(2, 1)
    assert client.fence_table("svc-orders", 2, 5) == fence
    listed = client.get_commit_claims("svc-orders")
    assert isinstance(listed, CommitClaims) and (listed.fence_epoch, listed.next_seq) == (2, 2)
    assert [(c.seq, c.epoch, c.attempt) for c in listed.claims] == [(0, 1, "run1-b0"), (1, 2, "fence")]
    assert [c.seq for c in client.get_commit_claims("svc-orders", from_seq=1, limit=1).claims] == [1]
    assert counted(coordinator, "snapcoord_commit_claims", "granted") == granted_before + 2
    assert counted(coordinator, "snapcoord_commit_claims", "held") >= 1
    assert counted(coordinator, "snapcoord_commit_fences", "raised") >= 1
    assert counted(coordinator, "snapcoord_commit_fences", "existing") >= 1


def test_a_fenced_writer_gets_table_fenced_with_the_fence_epoch(
    client: CoordinatorClient, coordinator: InProcessCoordinator
) -> None:
    client.fence_table("svc-fenced", 7, 0)
    refused_before = counted(coordinator, "snapcoord_commit_claims", "refused")
    with pytest.raises(TableFenced) as e:
        client.claim_commit("svc-fenced", 3, 6, "zombie")
    assert isinstance(e.value, FailedPrecondition) and e.value.code == "FAILED_PRECONDITION"
    assert (e.value.reason, e.value.fence_epoch) == ("TABLE_FENCED", 7)
    assert e.value.metadata == {"table_id": "svc-fenced", "epoch": "6", "fence_epoch": "7"}
    assert e.value.attempts == 1  # FAILED_PRECONDITION is never retried
    with pytest.raises(TableFenced):
        client.fence_table("svc-fenced", 6, 0)
    assert counted(coordinator, "snapcoord_commit_claims", "refused") == refused_before + 1
    assert [c.attempt for c in client.get_commit_claims("svc-fenced").claims] == ["fence"]


def test_error_info_on_the_wire(coordinator: InProcessCoordinator) -> None:
    """Without the client: the reason and metadata travel as a google.rpc.ErrorInfo."""
    with coordinator.channel() as channel:
        stub = commit_pb2_grpc.CommitClaimServiceStub(channel)
        stub.FenceTable(commit_pb2.FenceTableRequest(table_id="svc-wire", epoch=3, seq=0), timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            stub.ClaimCommit(
                commit_pb2.ClaimCommitRequest(table_id="svc-wire", seq=1, epoch=2, attempt="a"), timeout=30
            )
    assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(e.value.trailing_metadata())
    assert info is not None and info.reason == "TABLE_FENCED" and info.metadata["fence_epoch"] == "3"


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.claim_commit("", 0, 1, "a"), "table_id"),
        (lambda c: c.claim_commit("t", -1, 1, "a"), "seq"),
        (lambda c: c.claim_commit("t", 0, 0, "a"), "epoch"),
        (lambda c: c.claim_commit("t", 0, 1, "a b"), "attempt"),
        (lambda c: c.fence_table("t", -3, 0), "epoch"),
        (lambda c: c.get_commit_claims("t", limit=5000), "limit"),
    ],
)
def test_bad_input_is_invalid_argument(client: CoordinatorClient, call: object, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field) as e:
        call(client)  # type: ignore[operator]
    assert e.value.code == "INVALID_ARGUMENT"


def test_an_unknown_table_is_not_found(client: CoordinatorClient) -> None:
    with pytest.raises(NotFound) as e:
        client.get_commit_claims("svc-never-used")
    assert e.value.code == "NOT_FOUND"


def test_the_janitor_step_runs_with_the_configured_retention(tmp_path: Path) -> None:
    """``--commit-claim-retention`` reaches the janitor's step: with 1h, claims made now stay."""
    with embedded_deps(tmp_path) as deps, serve_in_process(deps, commit_claim_retention="1h") as coord:
        assert coord.config.claims.retention_ms == 3_600_000
        with CoordinatorClient(coord.target, timeout_s=30) as client:
            for seq in range(3):
                assert client.claim_commit("svc-janitor", seq, 1, f"b{seq}").granted
        assert coord.server.services.janitor.run_once()["commit-claims"] == 0
        assert [c.seq for c in coord.server.services.claims.claims("svc-janitor", 0, 0).claims] == [0, 1, 2]
