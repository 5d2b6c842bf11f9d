"""The worst-case ZooKeeper request calculator: complete, on the registries' layout, and an
upper bound of what the registries really send to a real ZooKeeper."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from harness.isolation import chroot_of
from snapcoord.coordinator.backlog import layout as backlog_layout
from snapcoord.coordinator.config.settings import Config, ConfigError, load
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.leases import LeasePolicy, SnapshotRef
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import TRANSACTION_DATA_BYTES, SnapshotPolicy
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers import layout as producers_layout
from snapcoord.coordinator.server.worst_requests import (
    WORST_CASE,
    Limits,
    acquire_snapshots,
    check_lease_requests_fit,
    create_snapshot,
    delete_snapshot,
    mark_backlog,
    register_producer_offsets,
    worst_case_table,
)
from snapcoord.coordinator.snapshots import decide
from snapcoord.coordinator.snapshots import layout as snapshots_layout
from snapcoord.coordinator.snapshots.leases.registry import LeaseRegistry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.local.blob_files import LocalBlobStore
from snapcoord.coordinator.storage.metadata import MAX_NODE_BYTES, Check, Op, SetData
from snapcoord.coordinator.storage.uris import zk_chroot
from snapcoord.coordinator.storage.zookeeper.auth import MAX_USER_BYTES, digest_acl
from snapcoord.coordinator.storage.zookeeper.request_size import (
    MAX_CHROOT_BYTES,
    OPEN_ACL_UNSAFE,
    AclEntry,
    op_bytes,
    request_bytes,
)
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2

HOUR_MS = 3_600_000
_BIG = 2**63 - 1


def test_every_rpc_has_a_row() -> None:
    names = {
        f"{service.name}/{m.name}"
        for module in (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
    }
    assert set(WORST_CASE) == names
    rows = worst_case_table()
    assert [r.rpc for r in rows] == list(WORST_CASE)


#: The longest ACL a create may carry: the digest ACL of the longest user name accepted.
WIDEST_ACL = (digest_acl("u" * MAX_USER_BYTES, "password"),)


def _limits(max_request_bytes: int, acl: tuple[AclEntry, ...] = OPEN_ACL_UNSAFE, **leases: int) -> Limits:
    return Limits(
        snapshots=SnapshotPolicy(max_request_bytes=max_request_bytes),
        leases=LeasePolicy(max_request_bytes=max_request_bytes, **leases),
        acl=acl,
    )


@pytest.mark.parametrize(
    ("max_request_bytes", "leases"),
    [
        (1_048_575, {}),  # the defaults, on ZooKeeper's default jute.maxbuffer
        (4 * 1_048_576, {"max_snapshots": 1_000, "max_holders": 4}),
        (16 * 1_048_576, {"max_snapshots": 2_000, "max_holders": 8}),
    ],
)
@pytest.mark.parametrize("acl", [OPEN_ACL_UNSAFE, WIDEST_ACL], ids=["open-acl", "widest-digest-acl"])
def test_every_legal_request_fits_the_configured_limit(
    max_request_bytes: int, leases: dict[str, int], acl: tuple[AclEntry, ...]
) -> None:
    """At every maximum and maximum-length ids together, every RPC's largest
    transaction fits the limit (the config refuses lease limits where it would not), also when
    each create carries the longest digest ACL (``zk_auth.MAX_USER_BYTES``)."""
    limits = _limits(max_request_bytes, acl, **leases)
    misfits = [r for r in worst_case_table(limits, max_request_bytes) if not r.fits]
    assert misfits == []
    if max_request_bytes == 1_048_575:
        # The byte budgets bind at the default and are used, not left idle: the largest
        # completing report comes within 7% of the limit (a header keeps room for the widest
        # abort reason, 12 KB when each of its characters is stored as an escaped surrogate pair).
        rows = {r.rpc: r for r in worst_case_table(limits, max_request_bytes)}
        assert rows["SnapshotService/ReportTaskSnapshot"].request_bytes > 0.93 * max_request_bytes


def test_the_budgets_count_the_longest_chroot_a_store_accepts() -> None:
    """Every path is sent with the chroot: the worst cases are computed with the longest one
    config and the store accept (``MAX_CHROOT_BYTES``, refused beyond), and so are the per-op
    overheads the registries budget deletes and retired intents with."""
    chroot = Limits().chroot
    assert len(chroot.encode()) == MAX_CHROOT_BYTES
    assert zk_chroot(f"zk://h:2181{chroot}") == chroot
    with pytest.raises(ValueError, match="at most"):
        zk_chroot(f"zk://h:2181{chroot}c")
    path = intents.ROOT + "/" + "9" * 12 + "/" + "f" * 32
    assert len(path) == intents.MAX_PATH_BYTES
    delete = op_bytes(intents.commit_op(path, _BIG), chroot=chroot)
    assert delete - len(path) <= decide.DELETE_OP_OVERHEAD
    assert delete <= intents.RETIRE_OP_BYTES


def test_the_data_budget_matches_the_stores() -> None:
    assert TRANSACTION_DATA_BYTES == MAX_NODE_BYTES


def test_the_paths_are_the_registries_own() -> None:
    """zk_budget builds every path with the layout modules; spot-check a few ops against them."""
    limits = Limits()
    create = create_snapshot(limits)
    app = create[0].path.removeprefix(snapshots_layout.APPS + "/")
    assert create[0].path == snapshots_layout.app_path(app)
    assert {type(op) for op in acquire_snapshots(limits)} >= {Check, SetData}
    assert all(op.path.startswith(("/snapshots/", "/leases/")) for op in acquire_snapshots(limits))
    assert producers_layout.RECORDS in register_producer_offsets(limits)[0].path
    assert backlog_layout.JOBS in mark_backlog(limits)[0].path


# -- against the real registries on a real ZooKeeper --------------------------------------------

SKEW_MS = 5_000
N = 4  # snapshots per lease, tasks per snapshot: small, so that every transaction is legal


@pytest.fixture
def store(zk_uri: str) -> Iterator[ZooKeeperMetadataStore]:
    s = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield s
    s.close()


class Recorder:
    """Wraps ``store.transaction`` to remember the exact size of each request sent."""

    def __init__(self, store: ZooKeeperMetadataStore, chroot: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        inner: Callable[[Sequence[Op]], None] = store.transaction

        def transaction(ops: Sequence[Op]) -> None:
            self.sizes.append(request_bytes(list(ops), chroot=chroot))
            inner(ops)

        monkeypatch.setattr(store, "transaction", transaction)


def _id(tag: str, i: int) -> str:
    head = f"{tag}{i}-"
    return head + "y" * (200 - len(head))


def test_the_calculator_bounds_what_the_registries_send(
    store: ZooKeeperMetadataStore, zk_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AcquireSnapshots (an expired lease re-acquired on other snapshots) and DeleteSnapshot (all
    tasks reported), both at maximum-length ids: what the registries send is at most the computed
    worst case, and close to it (the calculator's generations are 19 digits wider)."""
    chroot = chroot_of(zk_uri)
    clock = ManualClock(SystemClock().now_ms())
    spolicy = SnapshotPolicy(max_tasks=N, max_clock_skew_ms=SKEW_MS)
    lpolicy = LeasePolicy(
        max_snapshots=N, max_holders=1, max_duration_ms=24 * HOUR_MS, max_clock_skew_ms=SKEW_MS
    )
    blobs = LocalBlobStore.from_uri((tmp_path / "blobs").as_uri())
    metrics = CoordinatorMetrics(new_registry())
    snaps = SnapshotRegistry(store, blobs, clock, spolicy, metrics)
    lease_registry = LeaseRegistry(store, clock, lpolicy, snaps.kernel, metrics)
    tasks = [_id("t", i) for i in range(N)]
    old: list[SnapshotRef] = []
    new: list[SnapshotRef] = []
    for i in range(N):
        for tag, refs in (("o", old), ("n", new)):
            app = _id(tag, i)
            created = snaps.create(app, tasks, 0, 0, {})
            refs.append(SnapshotRef(app, created.record.generation))
    lease_id = _id("l", 0)
    lease_registry.acquire(lease_id, HOUR_MS, old)
    clock.advance(HOUR_MS + SKEW_MS + 1)  # expired, not yet removed by a janitor

    recorder = Recorder(store, chroot, monkeypatch)
    lease_registry.acquire(lease_id, HOUR_MS, new)
    limits = Limits(snapshots=spolicy, leases=lpolicy, chroot=chroot)
    computed = request_bytes(acquire_snapshots(limits), chroot=chroot)
    assert len(recorder.sizes) == 1
    actual = recorder.sizes[0]
    assert actual <= computed <= actual + 60 * len(acquire_snapshots(limits)), (actual, computed)

    # DeleteSnapshot of a completed snapshot whose every task reported.
    app = old[0].app_id
    created = snaps.create(app, tasks, 0, 0, {})
    for t in tasks:
        snaps.report(app, created.record.generation, t, (Offset("s", 0, 1),), {})
    recorder.sizes.clear()
    assert snaps.delete(app, created.record.generation)
    computed = request_bytes(delete_snapshot(limits), chroot=chroot)
    assert len(recorder.sizes) == 3  # the mark, one batch of N tasks, the header
    assert max(recorder.sizes) <= computed, (recorder.sizes, computed)
    blobs.close()


def _load_checked(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> Config:
    """The config as ``snapcoord serve`` accepts it: loaded, then the lease limits checked."""
    cfg = load(flags, environ)
    check_lease_requests_fit(cfg)
    return cfg


def test_lease_limits_that_outgrow_a_zookeeper_request_are_refused() -> None:
    """A legal AcquireSnapshots must fit one ZooKeeper request, so limits under which one
    would not are a configuration error naming both lease limits; a larger limit admits them."""
    with pytest.raises(ConfigError, match=r"--lease-max-snapshots=1000 and --lease-max-holders=4.*lower one"):
        _load_checked({"lease_max_snapshots": "1000"}, {})
    cfg = _load_checked({"lease_max_snapshots": "1000", "zk_max_request_bytes": "4194304"}, {})
    assert cfg.leases.max_snapshots == 1000 and cfg.leases.max_request_bytes == 4_194_304
    assert cfg.snapshots.max_request_bytes == 4_194_304
    assert cfg.storage.metadata_options().zk_max_request_bytes == 4_194_304


def _zk_auth_file(tmp_path: Path, user: str) -> str:
    path = tmp_path / "zk-auth"
    path.write_text(f"{user}:zk-secret\n")
    return str(path)


def test_lease_limits_that_only_the_digest_acl_takes_over_a_zookeeper_request_are_refused(
    tmp_path: Path,
) -> None:
    """With --zk-auth-file every create carries the user's digest ACL (33 bytes more than
    world:anyone for this user, and AcquireSnapshots creates one node per snapshot): the most
    snapshots per lease that fit without it do not fit with it, so that configuration is refused."""
    zk = {"metadata": "zk://zk1:2181/sc"}

    def fits(n: int, **flags: str) -> bool:
        try:
            _load_checked({**zk, **flags, "lease_max_snapshots": str(n)}, {})
        except ConfigError:
            return False
        return True

    lo, hi = 256, 1000  # the default fits, 1000 does not (the test above)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    auth = _zk_auth_file(tmp_path, "snapcoord")
    refused = rf"--lease-max-snapshots={lo} .*digest ACL of --zk-auth-file.*lower one"
    with pytest.raises(ConfigError, match=refused):
        _load_checked({**zk, "zk_auth_file": auth, "lease_max_snapshots": str(lo)}, {})
    # The file matters to a zk:// store only: with embedded metadata it is not read nor counted.
    assert (
        _load_checked({"zk_auth_file": auth, "lease_max_snapshots": str(lo)}, {}).leases.max_snapshots == lo
    )
    assert _load_checked({**zk, "zk_auth_file": auth}, {}).storage.zk_auth_file == auth
