"""``snapcoordctl``, the installed command, against live coordinators: the module's in-process one
on the embedded store, and a ``snapcoord serve`` process on ZooKeeper and S3 with TLS and tokens.

Every delete is checked against neighbours it must leave alone: records of another producer,
application, job or lease whose id starts with the deleted one's. Usage errors are checked in
this process (``main``), since they are refused before any connection is made.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.access import ADMIN_TOKEN, TEAM_A_TOKEN, principals, write_auth_file
from harness.certs import CertificateAuthority
from harness.coordinator import CoordinatorProcess, InProcessCoordinator, embedded_deps, serve_in_process
from snapcoord.client import (
    CoordinatorClient,
    NotFound,
    Offset,
    Page,
    SnapshotRef,
    SnapshotState,
    TaskSnapshot,
    TlsConfig,
)
from snapcoord.client.ctl import main
from snapcoord.client.ctl._commands import COMMANDS, _collect

CTL = Path(sys.executable).parent / "snapcoordctl"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations" / "ctl.md"


def ctl(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed ``snapcoordctl`` with ``args``; no inherited ``SNAPCOORD_*`` variable."""
    assert CTL.exists(), f"{CTL} is missing: run scripts/install-test-deps (it installs the client's scripts)"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCOORD_")}
    environ.update(env or {})
    return subprocess.run([str(CTL), *args], capture_output=True, text=True, env=environ, timeout=120)


def ok_json(*args: str, env: Mapping[str, str] | None = None) -> Any:
    done = ctl(*args, "--output", "json", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


def refused(*args: str, env: Mapping[str, str] | None = None) -> str:
    """stderr of a call that must exit 1 (the coordinator refused it), with nothing on stdout."""
    done = ctl(*args, env=env)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    return done.stderr


def completed(client: CoordinatorClient, app_id: str, payload: bytes = b"state") -> int:
    """A COMPLETED snapshot of ``app_id`` with one task, one offset and one checkpoint; its generation."""
    snapshot = client.create_snapshot(app_id, ["t0"])
    task = TaskSnapshot("t0", (Offset("events", 0, 7),), {"store": payload})
    assert client.report_task_snapshot(app_id, snapshot.generation, task).state is SnapshotState.COMPLETED
    return snapshot.generation


def payload(client: CoordinatorClient, app_id: str, generation: int) -> bytes:
    return b"".join(client.read_checkpoint(app_id, generation, "t0", "store"))


# -- on the embedded store ------------------------------------------------------------------------


@pytest.fixture
def target(coordinator: InProcessCoordinator) -> str:
    return coordinator.target


@pytest.mark.process
def test_producers_get_list_and_delete_only_the_named_one(
    target: str, client: CoordinatorClient, uid: str
) -> None:
    offsets = [Offset("orders", 0, 42), Offset("orders", 1, 17)]
    for pid in (uid, f"{uid}-2", f"{uid}x"):
        client.register_producer_offsets(pid, offsets, ttl_ms=3_600_000)
    kept = {pid: client.get_producer_offsets(pid) for pid in (f"{uid}-2", f"{uid}x")}

    record = ok_json("producers", "get", uid, "--target", target)
    stored = client.get_producer_offsets(uid)
    assert record == {
        "producer_id": uid,
        "offsets": [
            {"stream": "orders", "partition": 0, "offset": 42},
            {"stream": "orders", "partition": 1, "offset": 17},
        ],
        "created_at_ms": stored.created_at_ms,
        "expires_at_ms": stored.expires_at_ms,
    }
    listed = ok_json("--target", target, "producers", "list")
    assert listed["next_page_token"] == ""
    assert [p["producer_id"] for p in listed["items"] if p["producer_id"].startswith(uid)] == sorted(
        [uid, f"{uid}-2", f"{uid}x"]
    )

    assert ok_json("producers", "delete", uid, "--yes", "--target", target) == {
        "deleted": True,
        "producer_id": uid,
    }
    with pytest.raises(NotFound):
        client.get_producer_offsets(uid)
    assert {pid: client.get_producer_offsets(pid) for pid in kept} == kept

    assert "NOT_FOUND" in refused("producers", "get", uid, "--target", target)
    assert "NOT_FOUND: no producer record" in refused("producers", "delete", uid, "--yes", "--target", target)
    assert {pid: client.get_producer_offsets(pid) for pid in kept} == kept


@pytest.mark.process
def test_a_delete_without_yes_is_a_usage_error_and_deletes_nothing(
    target: str, client: CoordinatorClient, uid: str
) -> None:
    client.register_producer_offsets(uid, [Offset("s", 0, 1)])
    generation = completed(client, uid)
    for args in (["producers", "delete", uid], ["snapshots", "delete", uid, str(generation)]):
        done = ctl(*args, "--target", target)
        assert done.returncode == 2, done
        assert "add --yes to confirm" in done.stderr
    assert client.get_producer_offsets(uid).producer_id == uid
    assert payload(client, uid, generation) == b"state"


@pytest.mark.process
def test_snapshots_list_get_abort_and_delete_only_the_named_generation(
    target: str, client: CoordinatorClient, uid: str
) -> None:
    app, neighbour = uid, f"{uid}-2"
    first, second = completed(client, app, b"first"), completed(client, app, b"second")
    other = completed(client, neighbour, b"neighbour")
    current = client.create_snapshot(app, ["t0", "t1"]).generation

    listed = ok_json("snapshots", "list", app, "--target", target)
    assert [(s["generation"], s["state"]) for s in listed["items"]] == [
        (current, "CREATED"),
        (second, "COMPLETED"),
        (first, "COMPLETED"),
    ]
    got = ok_json("snapshots", "get", app, str(first), "--target", target)
    assert (got["app_id"], got["generation"], got["state"], got["task_ids"]) == (
        app,
        first,
        "COMPLETED",
        ["t0"],
    )
    assert got["tasks"] == [
        {
            "task_id": "t0",
            "committed_offsets": [{"stream": "events", "partition": 0, "offset": 7}],
            "checkpoint_stores": ["store"],
        }
    ]
    assert ok_json("snapshots", "current", app, "--consistent", "--target", target)["generation"] == current

    # A CREATED snapshot is not deleted; abort it first.
    assert "SNAPSHOT_IN_PROGRESS" in refused(
        "snapshots", "delete", app, str(current), "--yes", "--target", target
    )
    aborted = ok_json("snapshots", "abort", app, str(current), "--reason", "ops", "--yes", "--target", target)
    assert (aborted["state"], aborted["abort_reason"]) == ("ABORTED", "ops")

    assert ok_json("snapshots", "delete", app, str(first), "--yes", "--target", target) == {
        "deleted": True,
        "app_id": app,
        "generation": first,
    }
    with pytest.raises(NotFound):
        client.get_snapshot(app, first)
    assert payload(client, app, second) == b"second"
    assert payload(client, neighbour, other) == b"neighbour"
    assert [s.generation for s in client.list_snapshots(app)] == [current, second]
    assert "NOT_FOUND: no snapshot" in refused(
        "snapshots", "delete", app, str(first), "--yes", "--target", target
    )
    assert "NOT_FOUND" in refused("snapshots", "get", app, str(first), "--target", target)


@pytest.mark.process
def test_leases_pin_release_and_drop_only_the_named_lease(
    target: str, client: CoordinatorClient, uid: str
) -> None:
    gen = completed(client, uid)
    ref = SnapshotRef(uid, gen)
    client.acquire_snapshots(uid, [ref], duration_ms=600_000)
    client.acquire_snapshots(f"{uid}-2", [ref], duration_ms=600_000)

    listed = ok_json("leases", "list", "--target", target)
    assert sorted(x["lease_id"] for x in listed["items"] if x["lease_id"].startswith(uid)) == [
        uid,
        f"{uid}-2",
    ]
    lease = ok_json("leases", "get", uid, "--target", target)
    assert (lease["lease_id"], lease["duration_ms"], lease["snapshots"]) == (
        uid,
        600_000,
        [{"app_id": uid, "generation": gen}],
    )
    assert "LEASE_HELD" in refused("snapshots", "delete", uid, str(gen), "--yes", "--target", target)

    released = ok_json("leases", "release", uid, f"{uid}@{gen}", "--yes", "--target", target)
    assert (released["lease_id"], released["snapshots"]) == (uid, [])
    assert ok_json("leases", "drop", uid, "--yes", "--target", target) == {"deleted": True, "lease_id": uid}
    assert "NOT_FOUND" in refused("leases", "get", uid, "--target", target)

    # The other lease still pins the snapshot, so it still cannot be deleted.
    assert client.get_lease(f"{uid}-2").snapshots == (ref,)
    assert "LEASE_HELD" in refused("snapshots", "delete", uid, str(gen), "--yes", "--target", target)
    assert payload(client, uid, gen) == b"state"


@pytest.mark.process
def test_backlog_get_and_clear_only_the_named_job(target: str, client: CoordinatorClient, uid: str) -> None:
    for job in (uid, f"{uid}-2"):
        client.mark_backlog(job, [Offset("orders", 0, 100)])
    client.report_progress(uid, [Offset("orders", 0, 100), Offset("orders", 1, 7)])
    kept = client.get_backlog_status(f"{uid}-2")

    status = ok_json("backlog", "get", uid, "--target", target)
    assert status == {
        "job_id": uid,
        "processing_backlog": False,
        "partitions": [
            {"stream": "orders", "partition": 0, "boundary": 100, "position": 100, "finished": True}
        ],
        "added": [],  # MarkBacklog's alone
        "unmarked_partitions": 1,  # orders/1
    }
    table = ctl("backlog", "get", uid, "--target", target)
    assert table.returncode == 0, table.stderr
    lines = [line.split() for line in table.stdout.splitlines() if "unmarked" in line]
    assert lines == [["unmarked_partitions", "1"]]
    assert ok_json("backlog", "clear", uid, "--yes", "--target", target) == {"deleted": True, "job_id": uid}
    with pytest.raises(NotFound):
        client.get_backlog_status(uid)
    assert client.get_backlog_status(f"{uid}-2") == kept
    assert "NOT_FOUND" in refused("backlog", "clear", uid, "--yes", "--target", target)


@pytest.mark.process
def test_claims_get_shows_the_fence_and_the_claims(target: str, client: CoordinatorClient, uid: str) -> None:
    client.claim_commit(uid, 0, 1, "b0")
    fence = client.fence_table(uid, 2, 0)
    listed = ok_json("claims", "get", uid, "--target", target)
    assert (listed["fence_epoch"], listed["next_seq"]) == (2, fence.from_seq + 1)
    assert [(c["seq"], c["epoch"], c["attempt"]) for c in listed["claims"]] == [(0, 1, "b0"), (1, 2, "fence")]
    assert [
        c["seq"] for c in ok_json("claims", "get", uid, "--from-seq", "1", "--target", target)["claims"]
    ] == [1]
    table = ctl("claims", "get", uid, "--limit", "1", "--target", target)
    assert table.returncode == 0, table.stderr
    assert [line.split()[:3] for line in table.stdout.splitlines() if line.split()[:1] == ["0"]] == [
        ["0", "1", "b0"]
    ]
    assert "NOT_FOUND" in refused("claims", "get", f"{uid}-none", "--target", target)
    assert "INVALID_ARGUMENT" in refused("claims", "get", uid, "--limit", "5000", "--target", target)


@pytest.mark.process
def test_a_listing_reads_every_page_or_stops_at_its_limit_and_continues_from_its_token(
    target: str, client: CoordinatorClient, uid: str
) -> None:
    """More snapshots than one page of ListSnapshots holds by default (50)."""
    generations = []
    for _ in range(55):
        generations.append(client.create_snapshot(uid, ["t0"]).generation)
        client.abort_snapshot(uid, generations[-1])
    newest_first = generations[::-1]

    every = ok_json("snapshots", "list", uid, "--target", target)
    assert ([s["generation"] for s in every["items"]], every["next_page_token"]) == (newest_first, "")
    head = ok_json("snapshots", "list", uid, "--limit", "2", "--target", target)
    assert [s["generation"] for s in head["items"]] == newest_first[:2]
    assert head["next_page_token"]
    tail = ok_json("snapshots", "list", uid, "--page-token", head["next_page_token"], "--target", target)
    assert ([s["generation"] for s in tail["items"]], tail["next_page_token"]) == (newest_first[2:], "")


@pytest.mark.process
def test_tables_show_records_and_their_parts(target: str, client: CoordinatorClient, uid: str) -> None:
    client.register_producer_offsets(uid, [Offset("orders", 3, 42)])
    done = ctl("producers", "get", uid, "--target", target)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["FIELD", "VALUE"] and lines[1].split() == ["producer_id", uid]
    assert ["orders", "3", "42"] in [line.split() for line in lines]
    assert lines[-4:-2] == ["", "offsets:"] and lines[-2].split() == ["STREAM", "PARTITION", "OFFSET"]

    done = ctl("snapshots", "list", f"{uid}-none", "--target", target)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == ["(none)"]


@pytest.mark.process
def test_a_reader_that_stops_early_gets_no_traceback(
    target: str, client: CoordinatorClient, uid: str
) -> None:
    """``snapcoordctl ... | head -1``: the pipe closes before the listing is written."""
    for n in range(3):
        client.register_producer_offsets(f"{uid}-{n}", [Offset("orders", 0, n)])
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCOORD_")}
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write raises EPIPE
    with os.fdopen(write, "wb") as stdout:
        done = subprocess.run(
            [str(CTL), "producers", "list", "--target", target, "--output", "json"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
            timeout=120,
        )
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.process
def test_an_unreachable_coordinator_exits_1_with_the_status() -> None:
    stderr = refused("leases", "list", "--target", "127.0.0.1:1", "--timeout", "2s")
    assert stderr.startswith("snapcoordctl: ") and ("UNAVAILABLE" in stderr or "DEADLINE_EXCEEDED" in stderr)


# -- usage errors (refused before any connection) -------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["leases", "list"], "--target is required"),
        (
            ["leases", "list", "--target", "h:1", "--timeout", "30"],
            "--timeout: a duration above 0 with a unit",
        ),
        (["leases", "list", "--target", "h:1", "--limit", "-1"], "--limit: 0 (all) or more"),
        (["snapshots", "get", "app", "first", "--target", "h:1"], "a generation is a positive integer"),
        (["leases", "release", "l", "app-1", "--yes", "--target", "h:1"], "a snapshot is APP_ID@GENERATION"),
        (["backlog", "clear", "job", "--target", "h:1"], "add --yes to confirm"),
        (["leases", "list", "--target", "h:1", "--output", "yaml"], "invalid choice: 'yaml'"),
        (["leases", "list", "--target", "h:1", "--cert", "c.pem"], "--cert needs its pair"),
        (
            ["leases", "list", "--target", "h:1", "--ca", "/nonexistent/ca.pem"],
            "--ca /nonexistent/ca.pem: cannot",
        ),
        (
            ["leases", "list", "--target", "h:1", "--token-file", "/nonexistent/t"],
            "--token-file /nonexistent/t",
        ),
    ],
)
def test_usage_errors_exit_2_naming_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("SNAPCOORD_"):
            monkeypatch.delenv(name)
    code: int | str | None
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code  # argparse's own refusals
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert message in captured.err


def test_a_certificate_from_the_environment_without_its_key_names_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPCOORD_CLIENT_CERT", "c.pem")
    monkeypatch.delenv("SNAPCOORD_CLIENT_KEY", raising=False)
    assert main(["leases", "list", "--target", "h:1"]) == 2
    assert "SNAPCOORD_CLIENT_CERT needs its pair" in capsys.readouterr().err


def test_a_limit_asks_for_pages_that_end_at_it() -> None:
    """Pure paging logic: 250 records, pages of at most what was asked (default 40)."""
    asked: list[int] = []

    def fetch(size: int, token: str) -> Page[int]:
        asked.append(size)
        start = int(token or 0)
        end = min(start + (size or 40), 250)
        return Page(tuple(range(start, end)), str(end) if end < 250 else "")

    assert _collect(fetch, argparse.Namespace(limit=230, page_token="")) == (list(range(230)), "230")
    assert asked == [100, 100, 30]
    asked.clear()
    assert _collect(fetch, argparse.Namespace(limit=0, page_token="200")) == (list(range(200, 250)), "")
    assert asked == [0, 0]


def test_the_command_imports_the_standard_library_and_the_client_only() -> None:
    """It ships in the client's distribution, which depends on grpcio and protobuf alone."""
    package = Path(main.__code__.co_filename).parent
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or name.startswith("snapcoord.client"), (source, name)


def test_the_docs_list_every_command_in_order() -> None:
    documented = re.findall(r"^\| `(\w+) (\w+)[ `]", DOCS.read_text(), flags=re.M)
    assert documented == [(c.resource, c.verb) for c in COMMANDS]


# -- on ZooKeeper and S3, with TLS and tokens -----------------------------------------------------


@pytest.fixture
def secured(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> Iterator[tuple[CoordinatorProcess, CertificateAuthority]]:
    """``snapcoord serve`` on ZooKeeper and S3 with TLS and the auth file of ``principals()``."""
    pki = tmp_path / "pki"
    ca = CertificateAuthority.create(pki, "snapcoord-test")
    server = ca.issue(pki, "coordinator", file_stem="server")
    auth = write_auth_file(tmp_path / "auth.json", principals())
    args = ["--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    args += ["--tls-cert", str(server.cert), "--tls-key", str(server.key), "--auth-file", str(auth)]
    health = grpc.ssl_channel_credentials(root_certificates=ca.pem)
    with CoordinatorProcess(tmp_path / "coordinator", args=args, health_credentials=health) as proc:
        yield proc, ca


@pytest.mark.process
def test_over_tls_with_tokens_on_zookeeper_and_s3(
    tmp_path: Path, secured: tuple[CoordinatorProcess, CertificateAuthority]
) -> None:
    proc, ca = secured
    target = f"localhost:{proc.grpc_port}"
    tls = TlsConfig.from_files(ca.pem_path)
    with CoordinatorClient(target, tls=tls, token=ADMIN_TOKEN, timeout_s=60) as admin:
        for pid in ("team-a-p", "team-a-p2", "team-b-p"):
            admin.register_producer_offsets(pid, [Offset("orders", 0, 5)])
        a_gen, b_gen = completed(admin, "team-a-app", b"a-state"), completed(admin, "team-b-app", b"b-state")
        kept = {pid: admin.get_producer_offsets(pid) for pid in ("team-a-p2", "team-b-p")}

        team_a_token = tmp_path / "team-a.token"
        team_a_token.write_text(TEAM_A_TOKEN + "\n")
        team_a = ["--target", target, "--ca", str(ca.pem_path), "--token-file", str(team_a_token)]

        # Without a token the coordinator refuses; a scoped token sees and deletes its own only.
        assert "UNAUTHENTICATED" in refused("producers", "list", "--target", target, "--ca", str(ca.pem_path))
        listed = ok_json("producers", "list", *team_a)
        assert [p["producer_id"] for p in listed["items"]] == ["team-a-p", "team-a-p2"]
        assert "PERMISSION_DENIED" in refused("producers", "delete", "team-b-p", "--yes", *team_a)
        assert ok_json("producers", "delete", "team-a-p", "--yes", *team_a)["deleted"] is True
        with pytest.raises(NotFound):
            admin.get_producer_offsets("team-a-p")
        assert {pid: admin.get_producer_offsets(pid) for pid in kept} == kept

        # The client's variables alone connect too (TLS and token), as they do for the library.
        env = {"SNAPCOORD_CLIENT_CA": str(ca.pem_path), "SNAPCOORD_TOKEN": ADMIN_TOKEN}
        assert "NOT_FOUND" in refused("snapshots", "get", "team-a-app", "7", "--target", target, env=env)
        deleted = ok_json(
            "snapshots", "delete", "team-a-app", str(a_gen), "--yes", "--target", target, env=env
        )
        assert deleted == {"deleted": True, "app_id": "team-a-app", "generation": a_gen}
        with pytest.raises(NotFound):
            admin.get_snapshot("team-a-app", a_gen)
        assert payload(admin, "team-b-app", b_gen) == b"b-state"
        # A flag wins over its variable: team A's token file replaces the admin's SNAPCOORD_TOKEN.
        assert "PERMISSION_DENIED" in refused(
            "backlog",
            "clear",
            "team-b-job",
            "--yes",
            "--target",
            target,
            "--token-file",
            str(team_a_token),
            env=env,
        )


@pytest.mark.process
def test_mutual_tls_with_a_server_name_from_flags_and_variables(tmp_path: Path) -> None:
    """A coordinator whose certificate names only coordinator.internal, requiring client
    certificates: the client certificate's identity (team-a-driver) decides what it may do."""
    pki = tmp_path / "pki"
    ca = CertificateAuthority.create(pki, "snapcoord-test")
    server = ca.issue(pki, "coordinator", dns_names=("coordinator.internal",), ips=(), file_stem="server")
    team_a = ca.issue(pki, "team-a-driver", client=True, dns_names=(), ips=())
    auth = write_auth_file(tmp_path / "auth.json", principals())
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(
            deps,
            tls_cert=str(server.cert),
            tls_key=str(server.key),
            tls_client_ca=str(ca.pem_path),
            auth_file=str(auth),
        ) as coordinator,
    ):
        admin_tls = TlsConfig.from_files(
            ca.pem_path, team_a.key, team_a.cert, server_name="coordinator.internal"
        )
        with CoordinatorClient(coordinator.target, tls=admin_tls, token=ADMIN_TOKEN, timeout_s=30) as admin:
            admin.register_producer_offsets("team-a-p", [Offset("s", 0, 1)])
            admin.register_producer_offsets("team-b-p", [Offset("s", 0, 1)])
        flags = ["--target", coordinator.target, "--ca", str(ca.pem_path)]
        flags += [
            "--cert",
            str(team_a.cert),
            "--key",
            str(team_a.key),
            "--server-name",
            "coordinator.internal",
        ]

        listed = ok_json("producers", "list", *flags)
        assert [p["producer_id"] for p in listed["items"]] == ["team-a-p"]
        assert "PERMISSION_DENIED" in refused("producers", "get", "team-b-p", *flags)
        # Each setting from its variable where no flag gives it; the name checked is the flag's.
        env = {
            "SNAPCOORD_CLIENT_CA": str(ca.pem_path),
            "SNAPCOORD_CLIENT_CERT": str(team_a.cert),
            "SNAPCOORD_CLIENT_KEY": str(team_a.key),
            "SNAPCOORD_CLIENT_SERVER_NAME": "wrong.internal",
        }
        target = ["--target", coordinator.target]
        by_env = ok_json(
            "producers", "get", "team-a-p", *target, "--server-name", "coordinator.internal", env=env
        )
        assert by_env["producer_id"] == "team-a-p"
        # The certificate names coordinator.internal only: another name fails the handshake.
        stderr = refused("producers", "get", "team-a-p", *target, "--timeout", "3s", env=env)
        assert "UNAVAILABLE" in stderr or "DEADLINE_EXCEEDED" in stderr
