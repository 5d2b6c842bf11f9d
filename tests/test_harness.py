"""The test harness does what the rest of the suite relies on, against the real servers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError
from kazoo.client import KazooClient, KazooState
from kazoo.retry import KazooRetry

import harness.seaweed
import harness.zookeeper
from harness import (
    HarnessError,
    SeaweedS3Server,
    ServerStartError,
    TcpProxy,
    ZooKeeperServer,
    drop_zk_connection,
    expire_zk_session,
    free_port_block,
    is_port_free,
)
from harness.isolation import chroot_of, s3_prefix, zk_chroot
from harness.ports import SEAWEED_MAX_BASE, seaweed_ports
from harness.process import wait_until

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

TESTS_DIR = Path(__file__).resolve().parent


def _client(hosts: str, timeout: float = 10.0, reconnect_max_delay_s: float | None = None) -> KazooClient:
    """A started client; ``reconnect_max_delay_s`` caps kazoo's reconnect backoff (default: an hour, so
    after a long outage the next attempt may come long after the server is back)."""
    retry = (
        None if reconnect_max_delay_s is None else KazooRetry(max_tries=-1, max_delay=reconnect_max_delay_s)
    )
    client = KazooClient(hosts=hosts, timeout=timeout, connection_retry=retry)
    client.start(timeout=60)
    return client


@pytest.fixture
def root_zk(zk_hosts: str) -> Iterator[KazooClient]:
    client = _client(zk_hosts)
    yield client
    client.stop()
    client.close()


def _record_states(client: KazooClient) -> list[str]:
    states: list[str] = []
    client.add_listener(states.append)  # runs on kazoo's thread; list.append is atomic
    return states


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may linger if PID 1 does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


# -- ZooKeeper ------------------------------------------------------------------------------------------


def test_zk_uri_is_a_private_chroot(
    zk_uri: str, zk_hosts: str, kazoo_client: KazooClient, root_zk: KazooClient
) -> None:
    assert re.fullmatch(rf"zk://{zk_hosts}/t/test_zk_uri_is_a_private_chroot-[0-9a-f]{{8}}", zk_uri)
    chroot = chroot_of(zk_uri)
    kazoo_client.create("/app/record", b"mine", makepath=True)

    # The raw client is rooted at the chroot: the same node is /<chroot>/app/record for everyone else.
    assert root_zk.get(f"{chroot}/app/record")[0] == b"mine"
    assert kazoo_client.get_children("/") == ["app"]

    # Another test's chroot on the same server sees none of it, and writes there do not show up here.
    with zk_chroot(root_zk, "other-test") as other:
        root_zk.ensure_path(other)
        neighbour = _client(f"{zk_hosts}{other}")
        try:
            assert neighbour.get_children("/") == []
            assert neighbour.exists("/app/record") is None
            neighbour.create("/app/record", b"theirs", makepath=True)
        finally:
            neighbour.stop()
            neighbour.close()
        assert kazoo_client.get("/app/record")[0] == b"mine"
    # Leaving the namespace deletes its whole tree (what the fixtures do at teardown).
    assert root_zk.exists(other) is None


def test_zk_chroot_not_created_up_front(zk_uri: str, root_zk: KazooClient) -> None:
    """The store under test must create its chroot, as it must in production."""
    assert root_zk.exists(chroot_of(zk_uri)) is None


def test_drop_zk_connection_suspends_and_keeps_the_session(kazoo_client: KazooClient) -> None:
    kazoo_client.create("/eph", ephemeral=True)
    session_id = kazoo_client.client_id[0]
    states = _record_states(kazoo_client)

    drop_zk_connection(kazoo_client)

    assert states[:2] == [KazooState.SUSPENDED, KazooState.CONNECTED], states
    assert KazooState.LOST not in states
    assert kazoo_client.client_id[0] == session_id
    assert kazoo_client.exists("/eph") is not None  # same session: its ephemeral node is still there


def test_expire_zk_session_loses_the_session(kazoo_client: KazooClient) -> None:
    kazoo_client.create("/eph", ephemeral=True)
    session_id = kazoo_client.client_id[0]
    states = _record_states(kazoo_client)

    old = expire_zk_session(kazoo_client)

    assert old == session_id
    assert KazooState.LOST in states, states
    assert states[-1] == KazooState.CONNECTED  # kazoo went on with a fresh session
    assert kazoo_client.client_id[0] != session_id
    assert kazoo_client.exists("/eph") is None  # the server really expired it: ephemerals are gone


def _session_kept_or_renewed(client: KazooClient, session_id: int, states: list[str]) -> bool:
    """After an outage a client is back on its session, or ZooKeeper expired it (LOST) and kazoo made a
    new one. Which of the two depends on how long the outage took against the session timeout, which a
    loaded machine decides, so tests accept both but never a silent change of session."""
    if client.client_id[0] == session_id:
        return True
    return KazooState.LOST in states


def test_zk_stop_start_and_crash_keep_data_and_port(private_zk_server: ZooKeeperServer) -> None:
    zk = private_zk_server
    hosts, pid = zk.hosts, zk.pid
    # A long session and a short reconnect backoff make "same session" the usual outcome even when the
    # JVM restart is slow; the assertions hold either way (see _session_kept_or_renewed).
    client = _client(hosts, timeout=30, reconnect_max_delay_s=0.5)
    try:
        client.create("/kept", b"1")
        states = _record_states(client)

        for outage in ("stop", "crash"):
            session_id = client.client_id[0]
            del states[:]
            if outage == "stop":
                zk.stop()
                assert pid is not None and not _pid_alive(pid)
            else:
                zk.kill()
            assert not zk.running
            wait_until(lambda: KazooState.SUSPENDED in states, timeout=60, what=f"SUSPENDED after {outage}")
            assert not client.connected

            zk.start()
            assert zk.hosts == hosts  # the same port: clients' connection strings stay valid
            wait_until(lambda: client.connected, timeout=120, what=f"reconnect after {outage}")
            assert client.retry(client.get, "/kept")[0] == b"1"  # the data dir survived
            assert _session_kept_or_renewed(client, session_id, states), (outage, states)
            client.retry(client.set, "/kept", b"1")  # and the server takes writes again
    finally:
        client.stop()
        client.close()


@pytest.mark.zookeeper
def test_zk_start_failure_reports_log_tail(tmp_path: Path) -> None:
    zk = ZooKeeperServer(tmp_path / "zk", heap_mb=1)  # the JVM refuses -Xms32m with -Xmx1m
    with pytest.raises(ServerStartError) as err:
        zk.start()
    message = str(err.value)
    assert str(zk.log_path) in message
    assert "heap" in message.lower()  # the JVM's own complaint, from the log tail
    assert not zk.running


def test_missing_zookeeper_fails_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness.zookeeper, "ZOOKEEPER_JAR", tmp_path / "nope.jar")
    with pytest.raises(HarnessError, match="scripts/install-test-deps"):
        ZooKeeperServer(tmp_path / "zk").start()


# -- S3 -------------------------------------------------------------------------------------------------


def test_s3_uri_is_a_private_prefix_removed_afterwards(
    s3_uri: str, s3_server: SeaweedS3Server, s3_client: S3Client
) -> None:
    bucket = s3_server.bucket
    assert re.fullmatch(rf"s3://{bucket}/t/test_s3_uri_is_a_private_prefix_[a-z_]*-[0-9a-f]{{8}}", s3_uri)
    with s3_prefix(s3_client, bucket, "other-test") as prefix:
        for i in range(3):
            s3_client.put_object(Bucket=bucket, Key=f"{prefix}/dir/{i}", Body=b"x")
        s3_client.put_object(Bucket=bucket, Key=f"{prefix}-sibling", Body=b"not mine")
        listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
        assert listed["KeyCount"] == 3
    assert s3_client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")["KeyCount"] == 0
    # Only that prefix: a key that merely starts alike survives.
    assert s3_client.get_object(Bucket=bucket, Key=f"{prefix}-sibling")["Body"].read() == b"not mine"
    s3_client.delete_object(Bucket=bucket, Key=f"{prefix}-sibling")


def test_s3_credentials_are_enforced(s3_server: SeaweedS3Server, s3_uri: str, s3_client: S3Client) -> None:
    key = s3_uri.split("/", 3)[3] + "/secret"
    s3_client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"payload")

    wrong_secret = s3_server.client(secret_key="not-the-secret", retries={"max_attempts": 1})
    with pytest.raises(ClientError) as err:
        wrong_secret.get_object(Bucket=s3_server.bucket, Key=key)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert err.value.response["Error"]["Code"] in {"AccessDenied", "SignatureDoesNotMatch"}
    with pytest.raises(ClientError) as err:
        wrong_secret.put_object(Bucket=s3_server.bucket, Key=key, Body=b"overwritten")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    anonymous = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name="us-east-1",
        config=Config(
            signature_version=UNSIGNED, s3={"addressing_style": "path"}, retries={"max_attempts": 1}
        ),
    )
    with pytest.raises(ClientError) as err:
        anonymous.get_object(Bucket=s3_server.bucket, Key=key)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    assert s3_client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"payload"


def test_s3_env_reaches_boto3_default_chain_in_process_and_subprocess(
    s3_server: SeaweedS3Server, s3_uri: str
) -> None:
    assert os.environ["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint_url
    assert os.environ["AWS_DEFAULT_REGION"] == "us-east-1"
    key = s3_uri.split("/", 3)[3] + "/from-env"
    # No endpoint, no keys, no region: exactly how the coordinator builds its client.
    boto3.client("s3").put_object(Bucket=s3_server.bucket, Key=key, Body=b"env")
    code = (
        "import boto3, json, sys\n"
        "b = boto3.client('s3').get_object(Bucket=sys.argv[1], Key=sys.argv[2])['Body'].read()\n"
        "print(json.dumps(b.decode()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, s3_server.bucket, key], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == "env"


def test_s3_stop_fails_calls_and_start_brings_data_back(
    private_s3_server: SeaweedS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = private_s3_server
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint_url)  # as tests of the store under test do
    client = boto3.client(
        "s3", config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=20)
    )
    endpoint, bucket = s3.endpoint_url, s3.bucket
    client.put_object(Bucket=bucket, Key="before-stop", Body=b"1")

    s3.stop()
    assert not s3.running
    assert all(is_port_free(p) for p in seaweed_ports(s3.port))  # stop() returns after the ports are free
    with pytest.raises(EndpointConnectionError):
        client.get_object(Bucket=bucket, Key="before-stop")

    s3.start()
    assert s3.endpoint_url == endpoint
    assert client.get_object(Bucket=bucket, Key="before-stop")["Body"].read() == b"1"
    client.put_object(Bucket=bucket, Key="after-start", Body=b"2")

    s3.kill()  # a crash: objects are on disk all the same
    with pytest.raises(EndpointConnectionError):
        client.get_object(Bucket=bucket, Key="after-start")
    s3.start()
    assert client.get_object(Bucket=bucket, Key="before-stop")["Body"].read() == b"1"
    assert client.get_object(Bucket=bucket, Key="after-start")["Body"].read() == b"2"
    client.put_object(Bucket=bucket, Key="after-crash", Body=b"3")


def _weed_sockets(base_port: int) -> list[Path]:
    """The unix sockets weed creates in /tmp for the instance whose S3 port is ``base_port``."""
    names = {f"-{p + 10000}.sock" for p in range(base_port, base_port + 5)}
    return sorted(p for p in Path("/tmp").glob("seaweedfs-*.sock") if any(p.name.endswith(n) for n in names))


def test_s3_kill_removes_its_unix_sockets(private_s3_server: SeaweedS3Server) -> None:
    s3 = private_s3_server
    assert _weed_sockets(s3.port), "expected weed to create its gRPC sockets in /tmp"
    s3.kill()  # SIGKILL leaves every socket behind unless the harness removes them
    assert _weed_sockets(s3.port) == []
    assert not list(s3.workdir.glob("*.sock"))


def test_missing_weed_fails_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness.seaweed, "weed_binary", lambda: tmp_path / "weed")
    with pytest.raises(HarnessError, match="scripts/install-test-deps"):
        SeaweedS3Server(tmp_path / "s3").start()


# -- TcpProxy -------------------------------------------------------------------------------------------


def test_tcp_proxy_cut_and_restore_zookeeper(zk_server: ZooKeeperServer) -> None:
    with TcpProxy(zk_server.host, zk_server.port) as proxy:
        client = _client(proxy.address, timeout=30, reconnect_max_delay_s=0.5)
        try:
            node = client.create(f"/proxy-{uuid.uuid4().hex}", ephemeral=True)
            session_id = client.client_id[0]
            states = _record_states(client)

            proxy.cut()
            wait_until(lambda: KazooState.SUSPENDED in states, timeout=60, what="SUSPENDED after cut")
            with pytest.raises(ConnectionRefusedError):  # new connections are refused, not hung
                socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=2).close()
            assert not client.connected

            proxy.restore()
            wait_until(lambda: client.connected, timeout=120, what="reconnect after restore")
            assert _session_kept_or_renewed(client, session_id, states), states
            # The ephemeral node lives exactly as long as the session it was made in.
            if client.client_id[0] == session_id:
                assert client.retry(client.exists, node) is not None
            else:
                wait_until(
                    lambda: client.retry(client.exists, node) is None, timeout=60, what="ephemeral gone"
                )
        finally:
            client.stop()
            client.close()


def test_tcp_proxy_cut_and_restore_s3(s3_server: SeaweedS3Server, s3_uri: str) -> None:
    key = s3_uri.split("/", 3)[3] + "/via-proxy"
    with TcpProxy("127.0.0.1", s3_server.port) as proxy:
        client = boto3.client(
            "s3",
            endpoint_url=f"http://{proxy.address}",
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"through")
        proxy.cut()
        with pytest.raises(EndpointConnectionError):
            client.get_object(Bucket=s3_server.bucket, Key=key)
        proxy.restore()
        assert client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"through"


def test_tcp_proxy_relays_bulk_data_and_half_close() -> None:
    """Byte-exact relay under backpressure, EOF propagated in both directions."""
    payload = os.urandom(8 * 1024 * 1024)
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            chunks = []
            while chunk := conn.recv(1 << 16):
                chunks.append(chunk)
            data = b"".join(chunks)
            received.append(data)
            conn.sendall(data[::-1][:1024])  # reply after the client's EOF, then close

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with TcpProxy("127.0.0.1", server.getsockname()[1]) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=30) as c:
                c.sendall(payload)
                c.shutdown(socket.SHUT_WR)
                reply = b""
                while chunk := c.recv(1 << 16):
                    reply += chunk
            thread.join(30)
            assert received == [payload]
            assert reply == payload[::-1][:1024]
            wait_until(lambda: proxy.connection_count == 0, timeout=10, what="the pipe to close")
    finally:
        server.close()


def test_tcp_proxy_cut_resets_open_connections() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        with TcpProxy("127.0.0.1", server.getsockname()[1]) as proxy:
            c = socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=10)
            upstream, _ = server.accept()
            c.sendall(b"ping")
            assert upstream.recv(4) == b"ping"
            proxy.cut()
            with pytest.raises(ConnectionResetError):  # an abrupt failure, not an orderly close
                c.recv(1)
            upstream.settimeout(5)
            with pytest.raises(ConnectionResetError):
                upstream.recv(1)
            assert proxy.connection_count == 0
            c.close()
            upstream.close()
    finally:
        server.close()


# -- ports and processes --------------------------------------------------------------------------------


def test_free_port_block_fits_seaweed() -> None:
    bases = {free_port_block() for _ in range(5)}
    assert len(bases) == 5  # never handed out twice
    for base in bases:
        assert base < SEAWEED_MAX_BASE
        assert all(is_port_free(p) for p in seaweed_ports(base))


_CHILD_WITH_A_SERVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import harness.process
if {no_watchdog!r}:
    harness.process._WATCHDOG_CODE = "import sys; sys.stdin.buffer.read(1)"  # a watchdog that never kills
harness.process.install_sigterm_cleanup()
from harness import SeaweedS3Server, ZooKeeperServer
server = (ZooKeeperServer if {kind!r} == "zk" else SeaweedS3Server)(Path(sys.argv[1])).start()
print(server.pid, server.port, flush=True)
sys.stdin.readline()  # the test checks the server first
if {then!r} == "exit":
    sys.exit(0)  # no stop(): only the atexit hook stands between the server and an orphan
# Short sleeps, not one long one: a signal that lands just before a long C-level sleep starts only runs
# its Python handler once that sleep returns (CPython checks for pending handlers between bytecodes).
for _ in range(6000):
    time.sleep(0.1)
"""


@pytest.mark.parametrize(
    ("kind", "how", "no_watchdog"),
    [
        ("zk", "SIGKILL", False),  # no Python code runs in the parent: the watchdog does it
        ("s3", "SIGKILL", False),  # ... and removes weed's sockets from /tmp too
        ("zk", "SIGTERM", True),  # the signal handler does it (watchdog disabled to prove that)
        ("zk", "exit", True),  # the atexit hook does it (watchdog disabled)
    ],
)
@pytest.mark.process
def test_servers_do_not_outlive_the_test_process(
    tmp_path: Path, kind: str, how: str, no_watchdog: bool
) -> None:
    code = _CHILD_WITH_A_SERVER.format(tests=str(TESTS_DIR), no_watchdog=no_watchdog, kind=kind, then=how)
    parent = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "server")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    server_pid = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().split()
        assert len(line) == 2, f"child did not start its server: {line!r}"
        server_pid, port = int(line[0]), int(line[1])
        assert _pid_alive(server_pid)
        if kind == "s3":
            assert _weed_sockets(port)
        assert parent.stdin is not None
        parent.stdin.write("go\n")
        parent.stdin.flush()
        if how != "exit":
            parent.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
        status = parent.wait(30)
        if how == "SIGTERM":
            assert status == -signal.SIGTERM  # the handler re-raises: the exit status still says SIGTERM
        wait_until(lambda: not _pid_alive(server_pid), timeout=20, what=f"the server to die after {how}")
        if kind == "s3":
            wait_until(lambda: not _weed_sockets(port), timeout=10, what="weed's sockets to be removed")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if server_pid is not None and _pid_alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)  # do not leak it even when the test fails
