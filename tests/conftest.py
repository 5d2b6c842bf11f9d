"""Real servers for the whole suite: one ZooKeeper and one S3-compatible store (SeaweedFS) per session.

Fixture contract (other test modules code against these names):

- ``zk_server`` / ``zk_hosts`` (session): the shared ZooKeeper and its ``127.0.0.1:PORT``.
- ``zk_uri`` (function): ``zk://127.0.0.1:PORT/t/<test>-<uuid8>``, a chroot of this test's own. The chroot
  znode does not exist up front (the store under test must create it, as in production) unless
  ``kazoo_client`` is also used; teardown deletes it recursively.
- ``kazoo_client`` (function): a started KazooClient rooted at ``zk_uri``'s chroot, for raw assertions.
- ``s3_server`` (session): the shared SeaweedFS. While it runs, ``os.environ`` carries
  AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION=us-east-1, so boto3's
  standard chain (the only way the coordinator finds S3) works in-process and in subprocesses alike.
- ``s3_uri`` (function): ``s3://<bucket>/t/<test>-<uuid8>``; teardown deletes the objects under it.
- ``s3_client`` (session): a boto3 S3 client (path-style) on the shared server.
- ``private_s3_server`` / ``private_zk_server`` (function): dedicated servers for tests that stop, kill or
  restart them, so the shared ones are never disturbed. The private S3 server has the same credentials and
  bucket name as the shared one; point the code under test at it with
  ``monkeypatch.setenv("AWS_ENDPOINT_URL_S3", private_s3_server.endpoint_url)`` and
  ``private_s3_server.uri("some/prefix")``; for ZooKeeper use ``f"zk://{private_zk_server.hosts}/chroot"``.

Every boto3 client in the session (and in subprocesses) sees a hermetic AWS environment: the session's
keys (fixture ``s3_credentials``), us-east-1, no profile, no ~/.aws files, no instance metadata lookups.
Fault helpers (drop or expire a ZooKeeper session, cut a TCP path) are in ``harness.faults``.

Tests that use these servers (or Spark, or start a process) carry the markers of ``harness.markers``,
mostly given here from the fixtures they use; ``pytest --fast`` (``scripts/test --fast``) runs the rest.

A server that cannot start fails every test that needs it, with the log path and the install command in
the error: nothing here skips. The servers' logs stay in the session's temp dir (named in the summary).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kazoo.client import KazooClient

from harness.isolation import chroot_of, s3_prefix, zk_chroot
from harness.markers import SpawnGuard, check_registered, fast_subset, mark_by_fixtures
from harness.process import install_sigterm_cleanup
from harness.seaweed import DEFAULT_BUCKET, REGION, SeaweedS3Server
from harness.zookeeper import ZooKeeperServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# -- markers and the fast subset --------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    install_sigterm_cleanup()
    check_registered(config)
    guard = SpawnGuard(all_threads=config.getoption("fast"))
    guard.install()
    config.stash[_GUARD_KEY] = guard


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = config.stash.get(_GUARD_KEY, None)
    if guard is not None:
        guard.uninstall()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="only the tests that need no server, no Spark and no other process (see harness.markers)",
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by the server- and process-starting fixtures it uses (``harness.markers``)."""
    mark_by_fixtures(items)
    if config.getoption("fast"):
        fast_subset(config, items)
    long_modules_first(items)


def long_modules_first(items: list[pytest.Item]) -> None:
    """Order the modules that drive Spark or start processes before the others, each module's tests
    kept together and in their order. ``scripts/test`` runs the whole suite on two pytest-xdist
    workers with ``--dist loadfile`` (a module runs whole on one worker, so its module-scoped
    servers start once), and a worker takes the next module when it is done with one: the long
    modules then run while the other worker has plenty of short ones left, rather than one of
    them last, alone."""
    long_markers = {"spark", "process"}
    is_long: dict[Path, bool] = {}
    for item in items:
        is_long[item.path] = is_long.get(item.path, False) or any(
            item.get_closest_marker(name) is not None for name in long_markers
        )
    items.sort(key=lambda item: not is_long[item.path])  # stable: collection order otherwise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """An unmarked test that starts a process fails: its marker is missing (``harness.markers``)."""
    with item.config.stash[_GUARD_KEY].refusing(item):
        return (yield)


_GUARD_KEY = pytest.StashKey[SpawnGuard]()


# -- summary ----------------------------------------------------------------------------------------------


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """One line saying where the shared servers' logs are and how long they took to start."""
    servers = config.stash.get(_SERVERS_KEY, None)
    if servers is not None and servers.start_seconds:
        started = ", ".join(f"{kind} {secs:.2f}s" for kind, secs in sorted(servers.start_seconds.items()))
        terminalreporter.write_line(f"harness: shared servers started ({started}); logs in {servers.root}")


# -- shared servers ---------------------------------------------------------------------------------------


class _SharedServers:
    """Starts the session's servers at most once each, in background threads so that they boot together.

    The first fixture that needs any server kicks off every server the selected tests will need (known
    from the collected items' fixture closures), so ZooKeeper and SeaweedFS start concurrently; a server
    no selected test uses is never started.
    """

    def __init__(self, root: Path, access_key: str, secret_key: str, guard: SpawnGuard) -> None:
        self.root = root
        self._guard = guard
        self._access_key = access_key
        self._secret_key = secret_key
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="harness-start")
        self._lock = threading.Lock()
        self._servers: dict[str, ZooKeeperServer | SeaweedS3Server] = {}
        self._futures: dict[str, Future[Any]] = {}
        self.start_seconds: dict[str, float] = {}

    def _launch(self, kind: str) -> Future[Any]:
        with self._lock:
            if kind not in self._futures:
                self._guard.check(f"the shared {kind} server")  # it starts in a thread the guard spares
                server: ZooKeeperServer | SeaweedS3Server
                if kind == "zk":
                    server = ZooKeeperServer(self.root / "zookeeper")
                else:
                    server = SeaweedS3Server(
                        self.root / "seaweedfs",
                        bucket=DEFAULT_BUCKET,
                        access_key=self._access_key,
                        secret_key=self._secret_key,
                    )
                self._servers[kind] = server
                self._futures[kind] = self._pool.submit(self._timed_start, kind, server)
            return self._futures[kind]

    def _timed_start(self, kind: str, server: ZooKeeperServer | SeaweedS3Server) -> None:
        t0 = time.monotonic()
        server.start()
        self.start_seconds[kind] = time.monotonic() - t0

    def prestart(self, kinds: set[str]) -> None:
        for kind in sorted(kinds):
            self._launch(kind)

    def zk(self) -> ZooKeeperServer:
        self._launch("zk").result()  # re-raises the start error (with log tail) in every test that asks
        server = self._servers["zk"]
        assert isinstance(server, ZooKeeperServer)
        return server

    def s3(self) -> SeaweedS3Server:
        self._launch("s3").result()
        server = self._servers["s3"]
        assert isinstance(server, SeaweedS3Server)
        return server

    def close(self) -> None:
        # Wait for starts still in flight (bounded by their start timeouts) so that nothing is left half
        # started, then kill: the data is throwaway, and SIGKILL spares weed's ~3.5 s graceful shutdown.
        for future in list(self._futures.values()):
            with contextlib.suppress(Exception):
                future.exception()
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                server.kill()
        self._pool.shutdown(wait=True)


_SERVERS_KEY = pytest.StashKey[_SharedServers]()


def _needed_kinds(session: pytest.Session) -> set[str]:
    kinds = set()
    for item in session.items:
        names = getattr(item, "fixturenames", ())
        if "zk_server" in names:
            kinds.add("zk")
        if "s3_server" in names:
            kinds.add("s3")
    return kinds


@pytest.fixture(scope="session")
def s3_credentials() -> tuple[str, str]:
    """(access key, secret key) enforced by every SeaweedFS of this session, shared and private."""
    return f"snapcoordtest{secrets.token_hex(4)}", secrets.token_urlsafe(24)


@pytest.fixture(scope="session")
def _aws_env(tmp_path_factory: pytest.TempPathFactory, s3_credentials: tuple[str, str]) -> Iterator[None]:
    """Hermetic boto3 environment: our keys and region only, no profiles, no IMDS, no ~/.aws files."""
    mp = pytest.MonkeyPatch()
    aws_dir = tmp_path_factory.mktemp("aws-config")
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ENDPOINT_URL_S3",
    ):
        mp.delenv(name, raising=False)
    mp.setenv("AWS_ACCESS_KEY_ID", s3_credentials[0])
    mp.setenv("AWS_SECRET_ACCESS_KEY", s3_credentials[1])
    mp.setenv("AWS_DEFAULT_REGION", REGION)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")  # a missing credential must not hang on 169.254.169.254
    mp.setenv("AWS_CONFIG_FILE", str(aws_dir / "config"))  # files that do not exist
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws_dir / "credentials"))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def _shared_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, s3_credentials: tuple[str, str]
) -> Iterator[_SharedServers]:
    guard = request.config.stash[_GUARD_KEY]
    servers = _SharedServers(tmp_path_factory.mktemp("servers"), *s3_credentials, guard)
    request.config.stash[_SERVERS_KEY] = servers
    request.addfinalizer(servers.close)  # registered before any start: runs even if a start fails
    servers.prestart(_needed_kinds(request.session))
    yield servers


@pytest.fixture(scope="session")
def zk_server(_shared_servers: _SharedServers) -> ZooKeeperServer:
    """The session's ZooKeeper. Never stop it in a test: use ``private_zk_server`` for that."""
    return _shared_servers.zk()


@pytest.fixture(scope="session")
def zk_hosts(zk_server: ZooKeeperServer) -> str:
    return zk_server.hosts


@pytest.fixture(scope="session")
def _zk_admin(zk_hosts: str) -> Iterator[KazooClient]:
    """An unrooted client for creating and deleting the per-test chroots."""
    client = KazooClient(hosts=zk_hosts, timeout=10)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def zk_uri(request: pytest.FixtureRequest, zk_hosts: str, _zk_admin: KazooClient) -> Iterator[str]:
    with zk_chroot(_zk_admin, request.node.name) as chroot:
        yield f"zk://{zk_hosts}{chroot}"


@pytest.fixture
def kazoo_client(zk_uri: str, zk_hosts: str, _zk_admin: KazooClient) -> Iterator[KazooClient]:
    chroot = chroot_of(zk_uri)
    _zk_admin.retry(_zk_admin.ensure_path, chroot)  # kazoo warns and fails requests under a missing chroot
    client = KazooClient(hosts=f"{zk_hosts}{chroot}", timeout=10)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture(scope="session")
def s3_server(_aws_env: None, _shared_servers: _SharedServers) -> Iterator[SeaweedS3Server]:
    """The session's SeaweedFS; its endpoint is exported as AWS_ENDPOINT_URL_S3 while it runs."""
    server = _shared_servers.s3()
    mp = pytest.MonkeyPatch()
    mp.setenv("AWS_ENDPOINT_URL_S3", server.endpoint_url)
    yield server
    mp.undo()


@pytest.fixture(scope="session")
def s3_client(s3_server: SeaweedS3Server) -> S3Client:
    return s3_server.client()


@pytest.fixture
def s3_uri(request: pytest.FixtureRequest, s3_server: SeaweedS3Server, s3_client: S3Client) -> Iterator[str]:
    with s3_prefix(s3_client, s3_server.bucket, request.node.name) as prefix:
        yield f"s3://{s3_server.bucket}/{prefix}"


# -- private servers --------------------------------------------------------------------------------------


def _private(factory: Callable[[], Any]) -> Iterator[Any]:
    server = factory()
    try:
        server.start()
        yield server
    finally:
        server.kill()  # throwaway data: no need for a graceful stop


@pytest.fixture
def private_s3_server(
    _aws_env: None, tmp_path_factory: pytest.TempPathFactory, s3_credentials: tuple[str, str]
) -> Iterator[SeaweedS3Server]:
    """A SeaweedFS of this test's own (same keys and bucket name as the shared one) to stop and start.

    The environment still points at the shared server: a test that wants the code under test on this one
    sets ``monkeypatch.setenv("AWS_ENDPOINT_URL_S3", private_s3_server.endpoint_url)``.
    """
    workdir = tmp_path_factory.mktemp("private-s3")
    yield from _private(
        lambda: SeaweedS3Server(
            workdir, bucket=DEFAULT_BUCKET, access_key=s3_credentials[0], secret_key=s3_credentials[1]
        )
    )


@pytest.fixture
def private_zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test's own, to stop, kill and start again (same port and data dir)."""
    workdir = tmp_path_factory.mktemp("private-zk")
    yield from _private(lambda: ZooKeeperServer(workdir))
