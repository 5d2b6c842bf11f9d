"""Tokens, roles and scopes against a real coordinator over TLS: who may call what, on which ids.

Every refusal is checked twice: the caller gets the right code and a message that names what was
missing (never a secret), and the stored records are exactly as before.
"""

from __future__ import annotations

import base64
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from harness.access import (
    ADMIN_TOKEN,
    READER_TOKEN,
    TEAM_A_TOKEN,
    TEAM_B_TOKEN,
    Pki,
    principals,
    tls_channel,
    write_auth_file,
)
from harness.coordinator import InProcessCoordinator, serve_in_process
from harness.process import wait_until
from harness.stores import Stores
from snapcoord.coordinator.auth.audit import LOGGER_NAME
from snapcoord.coordinator.auth.rules import RULES
from snapcoord.coordinator.observability.logging_setup import STRUCTURED_FIELDS
from snapcoord.coordinator.services import Deps
from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    commit_pb2,
    commit_pb2_grpc,
    common_pb2,
    error_details_pb2,
    lease_pb2,
    lease_pb2_grpc,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

#: The real grpcurl, installed next to this interpreter (the ``tour`` dependency group).
GRPCURL = Path(sys.executable).parent / "grpcurl"
ROOT = Path(__file__).resolve().parents[3]
ALL_TOKENS = (ADMIN_TOKEN, TEAM_A_TOKEN, TEAM_B_TOKEN, READER_TOKEN)


class Api:
    """The five stubs on one channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.producers = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
        self.snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        self.leases = lease_pb2_grpc.LeaseServiceStub(channel)
        self.backlog = backlog_pb2_grpc.BacklogServiceStub(channel)
        self.claims = commit_pb2_grpc.CommitClaimServiceStub(channel)


@pytest.fixture
def as_(secured: InProcessCoordinator, pki: Pki) -> Iterator[Any]:
    """``as_(token)``: the API as the principal of ``token`` (None: no credentials)."""
    channels: list[grpc.Channel] = []

    def make(token: str | None) -> Api:
        channel = tls_channel(secured.target, ca=pki.ca.pem, token=token)
        channels.append(channel)
        return Api(channel)

    yield make
    for channel in channels:
        channel.close()


def refused(call: Any, code: grpc.StatusCode) -> str:
    """Run ``call``; assert it fails with ``code``; return the message (checked for secrets)."""
    with pytest.raises(grpc.RpcError) as e:
        call()
    err = e.value
    assert isinstance(err, grpc.Call)
    assert err.code() == code, (err.code(), err.details())
    message = err.details() or ""
    for token in ALL_TOKENS:
        assert token not in message
    return message


def error_info(err: grpc.Call) -> error_details_pb2.ErrorInfo:
    raw = dict(err.trailing_metadata() or ())["grpc-status-details-bin"]
    status = error_details_pb2.Status.FromString(raw)
    assert status.details[0].type_url == "type.googleapis.com/google.rpc.ErrorInfo"
    return error_details_pb2.ErrorInfo.FromString(status.details[0].value)


def offsets(n: int) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream="s", partition=i, offset=100 + i) for i in range(n)]


def test_health_is_open_and_the_api_is_not(as_: Any, secured: InProcessCoordinator, pki: Pki) -> None:
    channel = tls_channel(secured.target, ca=pki.ca.pem)
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    channel.close()
    api = as_(None)
    message = refused(
        lambda: api.snapshots.GetCurrentSnapshot(
            snapshot_pb2.GetCurrentSnapshotRequest(app_id="a"), timeout=30
        ),
        grpc.StatusCode.UNAUTHENTICATED,
    )
    assert "no credentials" in message and "authorization: Bearer" in message


def test_a_wrong_token_is_unauthenticated_and_not_echoed(as_: Any) -> None:
    wrong = "not-a-token-anyone-has-" + "x" * 20
    api = as_(wrong)
    with pytest.raises(grpc.RpcError) as e:
        api.producers.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id="team-a-p", offsets=offsets(1)),
            timeout=30,
        )
    err = e.value
    assert isinstance(err, grpc.Call)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not in the auth file" in (err.details() or "")
    assert wrong not in (err.details() or "")
    info = error_info(err)
    assert info.reason == "UNAUTHENTICATED"
    assert wrong not in str(info)
    # Nothing was stored.
    admin = as_(ADMIN_TOKEN)
    refused(
        lambda: admin.producers.GetProducerOffsets(
            producer_pb2.GetProducerOffsetsRequest(producer_id="team-a-p"), timeout=30
        ),
        grpc.StatusCode.NOT_FOUND,
    )


def test_a_revoked_token_stops_working_without_a_restart(as_: Any, tmp_path: Path) -> None:
    team_b = as_(TEAM_B_TOKEN)
    team_b.producers.RegisterProducerOffsets(
        producer_pb2.RegisterProducerOffsetsRequest(producer_id="team-b-p", offsets=offsets(1)), timeout=30
    )
    auth = tmp_path / "auth.json"
    # A change that does not parse keeps the previous file in force: nobody is locked out.
    auth.write_text("principals: [")
    get = producer_pb2.GetProducerOffsetsRequest(producer_id="team-b-p")
    assert team_b.producers.GetProducerOffsets(get, timeout=30).producer_id == "team-b-p"
    write_auth_file(auth, [p for p in principals() if p["name"] != "team-b-driver"])

    def revoked() -> bool:
        try:
            team_b.producers.GetProducerOffsets(get, timeout=30)
        except grpc.RpcError as e:
            assert isinstance(e, grpc.Call)
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e.details()
            return True
        return False

    wait_until(revoked, timeout=30, interval=0.05, what="the revoked token to be refused")
    message = refused(
        lambda: team_b.producers.GetProducerOffsets(get, timeout=30), grpc.StatusCode.UNAUTHENTICATED
    )
    assert "unknown or revoked" in message
    # The others still work, and team B's record is still there for the admin.
    assert as_(ADMIN_TOKEN).producers.GetProducerOffsets(get, timeout=30).producer_id == "team-b-p"


def test_a_reader_cannot_call_a_mutating_rpc(as_: Any) -> None:
    reader = as_(READER_TOKEN)
    message = refused(
        lambda: reader.producers.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id="team-a-p", offsets=offsets(1)),
            timeout=30,
        ),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert "role writer or admin" in message and "'dashboard'" in message
    refused(
        lambda: reader.producers.GetProducerOffsets(
            producer_pb2.GetProducerOffsetsRequest(producer_id="team-a-p"), timeout=30
        ),
        grpc.StatusCode.NOT_FOUND,  # a reader may read: and nothing was registered
    )


def test_admin_rpcs_need_an_admin(as_: Any) -> None:
    team_a, admin = as_(TEAM_A_TOKEN), as_(ADMIN_TOKEN)
    policy = snapshot_pb2.SetRetentionPolicyRequest(app_id="team-a-app", keep_last_completed=1)
    message = refused(
        lambda: team_a.snapshots.SetRetentionPolicy(policy, timeout=30), grpc.StatusCode.PERMISSION_DENIED
    )
    assert "needs role admin" in message
    clear = backlog_pb2.ClearBacklogRequest(job_id="team-a-job")
    refused(lambda: team_a.backlog.ClearBacklog(clear, timeout=30), grpc.StatusCode.PERMISSION_DENIED)
    assert admin.snapshots.SetRetentionPolicy(policy, timeout=30).keep_last_completed == 1
    admin.backlog.ClearBacklog(clear, timeout=30)


def test_list_calls_return_only_what_the_scopes_cover(as_: Any) -> None:
    team_a, team_b, admin, reader = as_(TEAM_A_TOKEN), as_(TEAM_B_TOKEN), as_(ADMIN_TOKEN), as_(READER_TOKEN)
    for api, pid in ((team_a, "team-a-p1"), (team_a, "team-a-p2"), (team_b, "team-b-p1")):
        api.producers.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id=pid, offsets=offsets(1)), timeout=30
        )
    for api, lid in ((team_a, "team-a-lease"), (team_b, "team-b-lease")):
        api.leases.AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(lease_id=lid, duration_ms=60_000), timeout=30
        )

    def producers(api: Api) -> set[str]:
        page = api.producers.ListProducerOffsets(producer_pb2.ListProducerOffsetsRequest(), timeout=30)
        return {s.producer_id for s in page.snapshots}

    def leases(api: Api) -> set[str]:
        return {
            lease.lease_id
            for lease in api.leases.ListLeases(lease_pb2.ListLeasesRequest(), timeout=30).leases
        }

    assert producers(team_a) == {"team-a-p1", "team-a-p2"}
    assert producers(team_b) == {"team-b-p1"}
    assert producers(admin) == producers(reader) == {"team-a-p1", "team-a-p2", "team-b-p1"}
    assert leases(team_a) == {"team-a-lease"}
    assert leases(admin) == {"team-a-lease", "team-b-lease"}


def test_a_scoped_list_page_token_names_no_id_outside_the_scopes(as_: Any) -> None:
    """The token of a scoped caller's page names the last record it was shown, never the registry's
    last id (another team's record); paging still returns every covered record exactly once."""
    team_a, admin = as_(TEAM_A_TOKEN), as_(ADMIN_TOKEN)
    ids = ["aaa-other", "team-a-1", "team-a-2", "team-b-secret-restore", "team-c-other"]
    for id_ in ids:
        admin.producers.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id=id_, offsets=offsets(1)), timeout=30
        )
        admin.leases.AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(lease_id=id_, duration_ms=60_000), timeout=30
        )

    def pages(list_page: Any, decode: Any) -> tuple[list[str], list[str]]:
        listed: list[str] = []
        tokens: list[str] = []
        token = ""
        while True:
            page_ids, token = list_page(token)
            listed += page_ids
            if not token:
                return listed, tokens
            tokens.append(decode(token))
            assert len(tokens) < 10

    def leases(token: str) -> tuple[list[str], str]:
        page = team_a.leases.ListLeases(
            lease_pb2.ListLeasesRequest(page_size=1, page_token=token), timeout=30
        )
        return [lease.lease_id for lease in page.leases], page.next_page_token

    def producers(token: str) -> tuple[list[str], str]:
        page = team_a.producers.ListProducerOffsets(
            producer_pb2.ListProducerOffsetsRequest(page_size=1, page_token=token), timeout=30
        )
        return [s.producer_id for s in page.snapshots], page.next_page_token

    def unbase64(token: str) -> str:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()

    for listing, decode in ((leases, str), (producers, unbase64)):
        listed, tokens = pages(listing, decode)
        assert listed == ["team-a-1", "team-a-2"]
        assert tokens and all(t.startswith("team-a-") for t in tokens), tokens


def test_reflection_needs_an_authenticated_principal(as_: Any) -> None:
    def services(api: Api) -> list[str]:
        stub = reflection_pb2_grpc.ServerReflectionStub(api.channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30
        )
        return [s.name for reply in replies for s in reply.list_services_response.service]

    refused(lambda: services(as_(None)), grpc.StatusCode.UNAUTHENTICATED)
    assert "snapcoord.v1.SnapshotService" in services(as_(READER_TOKEN))


@pytest.mark.parametrize(
    "values",
    [
        [""],
        ["Bearer"],
        ["Bearer "],
        ["Basic dXNlcjpwYXNz"],
        ["bearer " + "x" * 5000],
        ["Bearer  " + ADMIN_TOKEN + " x"],
        ["Bearer " + ADMIN_TOKEN, "Bearer " + ADMIN_TOKEN],
        ["Bearer x"] * 40,
        ["Bearer " + "%ff%00~!@#$%^&*()"],
        ["Bearer " + "\\xff\\x00" * 200],
    ],
    ids=[
        "empty",
        "scheme-only",
        "scheme-space",
        "basic",
        "huge",
        "token-and-junk",
        "two-good",
        "forty",
        "escapes",
        "long-escapes",
    ],
)
def test_fuzzed_authorization_headers_are_unauthenticated_never_internal(
    secured: InProcessCoordinator, pki: Pki, values: list[str]
) -> None:
    """Header values Python's grpc lets through (printable ASCII; others are refused client-side,
    see the grpcurl test below)."""
    channel = tls_channel(secured.target, ca=pki.ca.pem)
    stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
    try:
        with pytest.raises(grpc.RpcError) as e:
            stub.GetCurrentSnapshot(
                snapshot_pb2.GetCurrentSnapshotRequest(app_id="team-a-app"),
                metadata=[("authorization", v) for v in values],
                timeout=30,
            )
        assert isinstance(e.value, grpc.Call)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
        assert ADMIN_TOKEN not in (e.value.details() or "")
    finally:
        channel.close()


@pytest.mark.process
def test_non_ascii_and_oversized_headers_through_grpcurl_are_never_internal(
    secured: InProcessCoordinator, pki: Pki
) -> None:
    """Python's grpc refuses non-ASCII header values on the client side; grpcurl (Go) sends them."""
    for header in (
        "authorization: Bearer é中文",
        "authorization: Bearer \x7f\x01",
        # Under the 16 KiB header list the server advertises (over it the client refuses to send).
        "authorization: Bearer " + "B" * 12000,
        "authorization:",
    ):
        result = subprocess.run(
            [
                str(GRPCURL),
                "-import-path",
                str(ROOT / "proto"),
                "-proto",
                "snapcoord/v1/snapshot.proto",
                "-cacert",
                str(pki.ca.pem_path),
                "-H",
                header,
                "-d",
                '{"app_id": "team-a-app"}',
                secured.target,
                "snapcoord.v1.SnapshotService/GetCurrentSnapshot",
            ],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
            check=False,
        )
        assert result.returncode != 0
        out = result.stdout + result.stderr
        codes = set(re.findall(r"(?:Code: |code = )(\w+)", out))
        assert codes, (header, out)
        assert codes <= {"Unauthenticated", "ResourceExhausted"}, (header, out)


@pytest.fixture
def scoped(stores: Stores, tmp_path: Path, pki: Pki) -> Iterator[Any]:
    """A TLS coordinator with the standard principals on ``stores`` (both backends)."""
    auth = write_auth_file(tmp_path / "auth.json", principals())
    deps = Deps(metadata=stores.metadata, blobs=stores.blobs)
    with serve_in_process(
        deps, tls_cert=str(pki.server.cert), tls_key=str(pki.server.key), auth_file=str(auth)
    ) as server:
        channels: list[grpc.Channel] = []

        def make(token: str | None) -> Api:
            channel = tls_channel(server.target, ca=pki.ca.pem, token=token)
            channels.append(channel)
            return Api(channel)

        yield make
        for channel in channels:
            channel.close()


def test_a_scoped_writer_cannot_touch_another_teams_records(scoped: Any) -> None:
    team_a, team_b = scoped(TEAM_A_TOKEN), scoped(TEAM_B_TOKEN)
    # Team B's records: producer offsets, a completed snapshot under a lease, a backlog mark.
    team_b.producers.RegisterProducerOffsets(
        producer_pb2.RegisterProducerOffsetsRequest(producer_id="team-b-p", offsets=offsets(2)), timeout=30
    )
    snap = team_b.snapshots.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(app_id="team-b-app", task_ids=["t0"]), timeout=30
    )
    team_b.snapshots.ReportTaskSnapshot(
        snapshot_pb2.ReportTaskSnapshotRequest(
            app_id="team-b-app",
            generation=snap.generation,
            task=snapshot_pb2.TaskSnapshot(task_id="t0", committed_offsets=offsets(1)),
        ),
        timeout=30,
    )
    ref = common_pb2.SnapshotRef(app_id="team-b-app", generation=snap.generation)
    team_b.leases.AcquireSnapshots(
        lease_pb2.AcquireSnapshotsRequest(lease_id="team-b-lease", duration_ms=600_000, snapshots=[ref]),
        timeout=30,
    )
    team_b.backlog.MarkBacklog(
        backlog_pb2.MarkBacklogRequest(job_id="team-b-job", boundaries=offsets(2)), timeout=30
    )
    team_b.claims.FenceTable(
        commit_pb2.FenceTableRequest(table_id="team-b-table", epoch=2, seq=0), timeout=30
    )

    def team_b_state() -> tuple[bytes, ...]:
        return (
            team_b.producers.GetProducerOffsets(
                producer_pb2.GetProducerOffsetsRequest(producer_id="team-b-p"), timeout=30
            ).SerializeToString(deterministic=True),
            team_b.snapshots.GetCurrentSnapshot(
                snapshot_pb2.GetCurrentSnapshotRequest(app_id="team-b-app"), timeout=30
            ).SerializeToString(deterministic=True),
            team_b.leases.GetLease(lease_pb2.GetLeaseRequest(lease_id="team-b-lease"), timeout=30)
            .snapshots[0]
            .SerializeToString(deterministic=True),
            team_b.backlog.GetBacklogStatus(
                backlog_pb2.GetBacklogStatusRequest(job_id="team-b-job"), timeout=30
            ).SerializeToString(deterministic=True),
            team_b.claims.GetCommitClaims(
                commit_pb2.GetCommitClaimsRequest(table_id="team-b-table"), timeout=30
            ).SerializeToString(deterministic=True),
        )

    before = team_b_state()
    attempts = {
        "RegisterProducerOffsets": lambda: team_a.producers.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id="team-b-p", offsets=offsets(3)),
            timeout=30,
        ),
        "DeleteProducerOffsets": lambda: team_a.producers.DeleteProducerOffsets(
            producer_pb2.DeleteProducerOffsetsRequest(producer_id="team-b-p"), timeout=30
        ),
        "GetProducerOffsets": lambda: team_a.producers.GetProducerOffsets(
            producer_pb2.GetProducerOffsetsRequest(producer_id="team-b-p"), timeout=30
        ),
        "CreateSnapshot": lambda: team_a.snapshots.CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(app_id="team-b-app", task_ids=["x"]), timeout=30
        ),
        "AbortSnapshot": lambda: team_a.snapshots.AbortSnapshot(
            snapshot_pb2.AbortSnapshotRequest(app_id="team-b-app", generation=snap.generation), timeout=30
        ),
        "DeleteSnapshot": lambda: team_a.snapshots.DeleteSnapshot(
            snapshot_pb2.DeleteSnapshotRequest(app_id="team-b-app", generation=snap.generation), timeout=30
        ),
        "AcquireSnapshots": lambda: team_a.leases.AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(lease_id="team-a-lease", duration_ms=600_000, snapshots=[ref]),
            timeout=30,
        ),
        # A streamed request: decided on its first message, before the server reads any data.
        "UploadCheckpoint": lambda: team_a.snapshots.UploadCheckpoint(
            iter(
                [
                    snapshot_pb2.UploadCheckpointRequest(
                        app_id="team-b-app", generation=snap.generation, task_id="t0", store="s", data=b"x"
                    )
                ]
            ),
            timeout=30,
        ),
        "ReleaseSnapshots": lambda: team_a.leases.ReleaseSnapshots(
            lease_pb2.ReleaseSnapshotsRequest(lease_id="team-b-lease", snapshots=[ref]), timeout=30
        ),
        "RenewLease": lambda: team_a.leases.RenewLease(
            lease_pb2.RenewLeaseRequest(lease_id="team-b-lease", duration_ms=1000), timeout=30
        ),
        "DropLease": lambda: team_a.leases.DropLease(
            lease_pb2.DropLeaseRequest(lease_id="team-b-lease"), timeout=30
        ),
        "MarkBacklog": lambda: team_a.backlog.MarkBacklog(
            backlog_pb2.MarkBacklogRequest(job_id="team-b-job", boundaries=offsets(1), reset=True), timeout=30
        ),
        "ReportProgress": lambda: team_a.backlog.ReportProgress(
            backlog_pb2.ReportProgressRequest(job_id="team-b-job", positions=offsets(2)), timeout=30
        ),
        "FenceTable": lambda: team_a.claims.FenceTable(
            commit_pb2.FenceTableRequest(table_id="team-b-table", epoch=3, seq=0), timeout=30
        ),
        "ClaimCommit": lambda: team_a.claims.ClaimCommit(
            commit_pb2.ClaimCommitRequest(table_id="team-b-table", seq=5, epoch=2, attempt="a"), timeout=30
        ),
        "GetCommitClaims": lambda: team_a.claims.GetCommitClaims(
            commit_pb2.GetCommitClaimsRequest(table_id="team-b-table"), timeout=30
        ),
    }
    for name, attempt in attempts.items():
        message = refused(attempt, grpc.StatusCode.PERMISSION_DENIED)
        assert "outside the scopes of principal 'team-a-driver'" in message, (name, message)
        assert "team-b-" in message, (name, message)
    assert team_b_state() == before
    # The refused AcquireSnapshots created no lease under team A's own id either.
    refused(
        lambda: scoped(ADMIN_TOKEN).leases.GetLease(
            lease_pb2.GetLeaseRequest(lease_id="team-a-lease"), timeout=30
        ),
        grpc.StatusCode.NOT_FOUND,
    )


def test_a_scoped_writer_uploads_checkpoints_for_its_own_apps_only(scoped: Any) -> None:
    """UploadCheckpoint is an app-scoped write like ReportTaskSnapshot, not admin-only: the ids come
    from the stream's first message."""
    team_a, team_b, reader = scoped(TEAM_A_TOKEN), scoped(TEAM_B_TOKEN), scoped(READER_TOKEN)
    snap = team_a.snapshots.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(app_id="team-a-app", task_ids=["t0"]), timeout=30
    )

    def upload(api: Api) -> snapshot_pb2.CheckpointUpload:
        header = snapshot_pb2.UploadCheckpointRequest(
            app_id="team-a-app", generation=snap.generation, task_id="t0", store="s", data=b"abc"
        )
        result: snapshot_pb2.CheckpointUpload = api.snapshots.UploadCheckpoint(
            iter([header, snapshot_pb2.UploadCheckpointRequest(data=b"def")]), timeout=30
        )
        return result

    stored = upload(team_a)
    assert stored.size == 6
    assert "outside the scopes" in refused(lambda: upload(team_b), grpc.StatusCode.PERMISSION_DENIED)
    refused(lambda: upload(reader), grpc.StatusCode.PERMISSION_DENIED)
    refused(lambda: upload(scoped(None)), grpc.StatusCode.UNAUTHENTICATED)
    team_a.snapshots.ReportTaskSnapshot(
        snapshot_pb2.ReportTaskSnapshotRequest(
            app_id="team-a-app",
            generation=snap.generation,
            task=snapshot_pb2.TaskSnapshot(task_id="t0", uploaded_checkpoints={"s": stored.upload_id}),
        ),
        timeout=30,
    )


# --- the audit trail ---------------------------------------------------------------------------------

_IDS = {
    "producer_id": "audit-p",
    "app_id": "audit-app",
    "lease_id": "audit-lease",
    "job_id": "audit-job",
    "table_id": "audit-table",
}


def _request_for(method: str) -> Any:
    """A request for ``method`` (``/pkg.Service/Name``) naming the ``_IDS`` it has fields for."""
    service, name = method.lstrip("/").split("/")
    desc = descriptor_pool.Default().FindServiceByName(service).methods_by_name[name]
    request: Any = message_factory.GetMessageClass(desc.input_type)()
    for field, value in _IDS.items():
        if field in desc.input_type.fields_by_name:
            setattr(request, field, value)
    if "snapshots" in desc.input_type.fields_by_name:
        request.snapshots.add(app_id="audit-app", generation=1)
    return request


def test_every_mutating_rpc_writes_one_audit_line(
    as_: Any, secured: InProcessCoordinator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    admin = as_(ADMIN_TOKEN)
    outcomes: dict[str, str] = {}
    mutating = sorted(m for m, rule in RULES.items() if rule.access.mutates)
    for method in mutating:
        serializer = lambda r: r.SerializeToString()  # noqa: E731
        try:
            if RULES[method].first_message:  # a streamed request: the ids ride on its first message
                admin.channel.stream_unary(method, request_serializer=serializer)(
                    iter([_request_for(method)]), timeout=30
                )
            else:
                admin.channel.unary_unary(method, request_serializer=serializer)(
                    _request_for(method), timeout=30
                )
            outcomes[method] = "OK"
        except grpc.RpcError as e:
            assert isinstance(e, grpc.Call)
            outcomes[method] = e.code().name
    # Refusals leave a line too; reads (below, a NOT_FOUND) do not.
    team_a = as_(TEAM_A_TOKEN)
    refused(
        lambda: team_a.producers.DeleteProducerOffsets(
            producer_pb2.DeleteProducerOffsetsRequest(producer_id="team-b-p"), timeout=30
        ),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    anonymous = as_(None)
    refused(
        lambda: anonymous.backlog.ClearBacklog(backlog_pb2.ClearBacklogRequest(job_id="j"), timeout=30),
        grpc.StatusCode.UNAUTHENTICATED,
    )
    refused(
        lambda: team_a.producers.GetProducerOffsets(
            producer_pb2.GetProducerOffsetsRequest(producer_id="team-a-nothing"), timeout=30
        ),
        grpc.StatusCode.NOT_FOUND,
    )

    # The record's keys are fields of the log record (a JSON log's keys), repeated in the message.
    lines = [
        {k: v for k, v in r.__dict__.items() if k in STRUCTURED_FIELDS}
        for r in caplog.records
        if r.name == LOGGER_NAME
    ]
    assert all(r.getMessage().startswith("audit principal=") for r in caplog.records if r.name == LOGGER_NAME)
    for token in ALL_TOKENS:
        assert token not in caplog.text
    by_method: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_method.setdefault("/" + line["method"], []).append(line)
    assert "/snapcoord.v1.ProducerOffsetService/GetProducerOffsets" not in by_method  # reads: no line
    for method in mutating:
        own = [line for line in by_method.get(method, []) if line["principal"] == "ops"]
        assert len(own) == 1, (method, by_method.get(method))
        line = own[0]
        assert line["code"] == outcomes[method]
        assert isinstance(line["latency_ms"], float | int) and line["latency_ms"] >= 0
        rule = RULES[method]
        named = {kind.value for kind, _ in rule.ids(_request_for(method))}
        assert set(line["ids"]) == named, (method, line)
        for kind in named:
            assert _IDS[kind] in line["ids"][kind]
        assert set(line) >= {"principal", "method", "ids", "code", "latency_ms", "peer"}
    denied = by_method["/snapcoord.v1.ProducerOffsetService/DeleteProducerOffsets"]
    assert any(
        d["principal"] == "team-a-driver"
        and d["code"] == "PERMISSION_DENIED"
        and d["ids"] == {"producer_id": ["team-b-p"]}
        for d in denied
    )
    cleared = by_method["/snapcoord.v1.BacklogService/ClearBacklog"]
    assert any(d["principal"] == "-" and d["code"] == "UNAUTHENTICATED" for d in cleared)


def test_malformed_request_bytes_are_checked_for_credentials_then_invalid(as_: Any) -> None:
    """Bytes that are no request name no ids: a caller without credentials is still refused, one
    with them gets INVALID_ARGUMENT from the servicer, never INTERNAL."""
    method = "/snapcoord.v1.ProducerOffsetService/DeleteProducerOffsets"
    garbage = b"\xff\xff\xff\xff"
    for api, code in (
        (as_(None), grpc.StatusCode.UNAUTHENTICATED),
        (as_(TEAM_A_TOKEN), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        call = api.channel.unary_unary(method)
        refused(lambda call=call: call(garbage, timeout=30), code)
