"""Every payload object is announced by an upload intent in the metadata store before its put
starts, whichever path writes it (an intent created in the first read round trip, or one of its
own), and a call that ends up writing nothing leaves neither intent nor object behind. On both
backends; the request counts on real ZooKeeper.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pytest

from harness.stores import Stores
from harness.zk_requests import count_requests
from snapcoord.coordinator.backlog.registry import BacklogRegistry
from snapcoord.coordinator.domain.backlog import BacklogPolicy
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerPolicy
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.errors import Aborted, FailedPrecondition, InvalidArgument, Reason
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers.registry import ProducerRegistry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore, Node
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

HOUR_MS = 3_600_000
FAR_FUTURE_MS = 10 * 365 * 24 * HOUR_MS


class AnnouncedBlobs:
    """The blob store, checking at the start of every put that a live (unclaimed) intent in the
    metadata store announces the key; a put that is not announced is recorded, then done anyway
    (so that the call under test runs to its end and the test reports every violation)."""

    def __init__(self, inner: BlobStore, metadata: MetadataStore) -> None:
        self._inner = inner
        self._metadata = metadata
        self.puts: list[str] = []
        self.unannounced: list[str] = []

    def _check(self, key: str) -> None:
        self.puts.append(key)
        if key not in live_announced_keys(self._metadata):
            self.unannounced.append(key)

    def put(self, key: str, data: bytes) -> None:
        self._check(key)
        self._inner.put(key, data)

    def put_stream(self, key: str, pieces: Iterable[bytes]) -> None:
        self._check(key)
        self._inner.put_stream(key, pieces)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def live_announced_keys(metadata: MetadataStore) -> set[str]:
    keys: set[str] = set()
    for path in intent_paths(metadata):
        node = metadata.get(path)
        if node is not None:
            intent = intents.decode(node.data)
            if not intent.swept:
                keys.update(intent.keys)
    return keys


def intent_paths(metadata: MetadataStore) -> list[str]:
    return [
        f"{intents.ROOT}/{b}/{n}"
        for b in metadata.children(intents.ROOT)
        for n in metadata.children(f"{intents.ROOT}/{b}")
    ]


def objects(stores: Stores, prefix: str) -> list[str]:
    return sorted(info.key for info in stores.blobs.list(prefix))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


def snapshot_registry(stores: Stores, blobs: object, clock: ManualClock) -> SnapshotRegistry:
    return SnapshotRegistry(
        stores.metadata,
        blobs,  # type: ignore[arg-type]
        clock,
        SnapshotPolicy(inline_checkpoint_max_bytes=0),  # payloads in the blob store
        CoordinatorMetrics(new_registry()),
    )


# --- every path that puts: the intent is there first -------------------------------------------------


def test_a_reports_inline_payloads_are_announced_before_their_puts(
    stores: Stores, clock: ManualClock
) -> None:
    blobs = AnnouncedBlobs(stores.blobs, stores.metadata)
    snapshots = snapshot_registry(stores, blobs, clock)
    generation = snapshots.create("order", ["t1", "t2"], 0, 0, {}).record.generation

    snapshots.report("order", generation, "t1", (), {"a": b"one"})
    up = snapshots.upload("order", generation, "t2", "big", [b"streamed"])
    snapshots.report("order", generation, "t2", (), {"b": b"two", "c": b"three"}, {"big": up.upload_id})

    assert len(blobs.puts) == 4 and blobs.unannounced == []
    # The commits retired every intent; every object is referenced.
    assert intent_paths(stores.metadata) == []
    found = snapshots.get("order", generation, include_checkpoints=True).payloads
    assert found == {
        ("t1", "a"): b"one",
        ("t2", "b"): b"two",
        ("t2", "c"): b"three",
        ("t2", "big"): b"streamed",
    }


def test_backlog_marks_announce_their_boundaries_before_the_put(stores: Stores, clock: ManualClock) -> None:
    blobs = AnnouncedBlobs(stores.blobs, stores.metadata)
    backlog = BacklogRegistry(
        stores.metadata,
        blobs,  # type: ignore[arg-type]
        clock,
        BacklogPolicy(max_partitions=100),
        CoordinatorMetrics(new_registry()),
        shard_size=4,
    )
    first = [Offset("s", p, 10) for p in range(6)]
    backlog.mark("job", first, reset=False)  # a first mark: its intent is made before the put
    backlog.mark("job", [Offset("s", 0, 99)], reset=False)  # existing: nothing put
    backlog.mark("job", [Offset("s", 0, 5)], reset=True)  # a reset: its intent rides with the read

    assert len(blobs.puts) == 2 and blobs.unannounced == []
    assert intent_paths(stores.metadata) == []
    status = backlog.status("job")
    assert [(p.stream, p.partition, p.boundary) for p in status.partitions] == [("s", 0, 5)]
    assert len(objects(stores, "backlog/")) == 1  # the reset removed the first mark's boundaries


def test_producer_registrations_announce_their_payload_before_the_put(
    stores: Stores, clock: ManualClock
) -> None:
    blobs = AnnouncedBlobs(stores.blobs, stores.metadata)
    # Payloads in the blob store (inline records make no intent at all).
    policy = ProducerPolicy(
        default_ttl_ms=HOUR_MS, max_ttl_ms=24 * HOUR_MS, max_offsets=1000, inline_max_bytes=0
    )
    producers = ProducerRegistry(
        stores.metadata,
        blobs,  # type: ignore[arg-type]
        clock,
        policy,
        CoordinatorMetrics(new_registry()),
    )
    assert producers.register("p", [Offset("s", 0, 1)], 0).registered
    assert not producers.register("p", [Offset("s", 0, 2)], 0).registered  # live: its put is removed
    for name in "qrs":
        assert producers.register(name, [Offset("s", 0, 3)], 0).registered

    # Every put went to a key its intent (made ahead, in the pool) announced; the commits retired
    # theirs, the refused one withdrew its own, and the pool holds the rest (no object: unused)
    # until close().
    assert len(blobs.puts) == 5 and blobs.unannounced == []
    left = intent_paths(stores.metadata)
    assert left
    for path in left:
        node = stores.metadata.get(path)
        assert node is not None
        assert [k for k in intents.decode(node.data).keys if k in objects(stores, "producers/")] == []
    producers.close()
    assert intent_paths(stores.metadata) == []
    assert len(objects(stores, "producers/")) == 4
    assert producers.get("p").offsets == (Offset("s", 0, 1),)
    assert producers.get("s").offsets == (Offset("s", 0, 3),)


# --- refusals leave nothing behind ---------------------------------------------------------------


def intents_tree(metadata: MetadataStore) -> dict[str, tuple[bytes, int]]:
    """Every node under the intents root (buckets and intents), with data and version."""
    tree: dict[str, tuple[bytes, int]] = {}
    for bucket in metadata.children(intents.ROOT):
        paths = [
            f"{intents.ROOT}/{bucket}",
            *(f"{intents.ROOT}/{bucket}/{n}" for n in metadata.children(f"{intents.ROOT}/{bucket}")),
        ]
        for path, node in metadata.get_many(paths).items():
            assert node is not None
            tree[path] = (node.data, node.version)
    return tree


class CountingAnnounces:
    """The metadata store, counting ``create_and_get_many`` calls (early announces)."""

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self.early = 0

    def create_and_get_many(self, path: str, data: bytes, paths: Sequence[str]) -> dict[str, Node | None]:
        self.early += 1
        return self._inner.create_and_get_many(path, data, paths)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_refused_reports_and_uploads_leave_the_stores_as_they_were(
    stores: Stores, clock: ManualClock
) -> None:
    """The intent is created with the first reads, before the call is decided: a refusal
    withdraws it, nothing was put, and the intents' tree is as before (bucket included)."""
    blobs = AnnouncedBlobs(stores.blobs, stores.metadata)
    metadata = CountingAnnounces(stores.metadata)
    snapshots = SnapshotRegistry(
        metadata,  # type: ignore[arg-type]
        blobs,  # type: ignore[arg-type]
        clock,
        SnapshotPolicy(inline_checkpoint_max_bytes=0),  # payloads in the blob store
        CoordinatorMetrics(new_registry()),
    )
    # Created through another process: this one holds no copies of the headers (from copies, a
    # report sends no read, so nothing to announce with: ``test_report_copies``).
    creator = snapshot_registry(stores, stores.blobs, clock)
    first = creator.create("refused", ["t1", "t2"], 0, 0, {}).record.generation
    creator.abort("refused", first, "test")
    current = creator.create("refused", ["t1", "t2"], 0, 0, {}).record.generation
    # The first payload of the minute: its intent waits for the commit (the bucket is made then).
    warm = snapshots.create("warm", ["t"], 0, 0, {}).record.generation
    snapshots.report("warm", warm, "t", (), {"s": b"warm"})
    assert metadata.early == 0 and len(blobs.puts) == 1

    refusals = [
        (first, "t1", FailedPrecondition, Reason.SNAPSHOT_FENCED),  # a stale generation
        (current + 1, "t1", FailedPrecondition, Reason.SNAPSHOT_FENCED),  # not created yet
        (current, "t9", InvalidArgument, Reason.INVALID_ARGUMENT),  # not in the task set
    ]
    for generation, task, error, reason in refusals:
        before = intents_tree(stores.metadata)
        with pytest.raises(error) as raised:
            snapshots.report("refused", generation, task, (), {"s": b"payload"})
        assert raised.value.reason is reason
        if reason is Reason.SNAPSHOT_FENCED:
            # The pointer, read only for the refusal, still names the current generation.
            assert raised.value.metadata["current_generation"] == str(current)
        assert intents_tree(stores.metadata) == before
        assert objects(stores, "snapshots/refused/") == []
        # An upload for the same target is refused alike: its intent, made with the check's
        # reads, is withdrawn, and not a byte was read or put.
        stream = iter([b"x"])
        with pytest.raises(error) as raised:
            snapshots.upload("refused", generation, task, "s", stream)
        assert raised.value.reason is reason
        assert next(stream, None) == b"x"  # not a byte was taken from the stream
        assert intents_tree(stores.metadata) == before
    assert metadata.early == 2 * len(refusals)  # every refused call did announce early
    assert len(blobs.puts) == 1

    # In a minute whose bucket this process has not made yet, a refused call writes nothing.
    clock.advance(60_000)
    before = intents_tree(stores.metadata)
    with pytest.raises(FailedPrecondition):
        snapshots.report("refused", first, "t1", (), {"s": b"payload"})
    with pytest.raises(FailedPrecondition):
        snapshots.upload("refused", first, "t1", "s", [b"x"])
    assert intents_tree(stores.metadata) == before and metadata.early == 2 * len(refusals)

    # The same report twice (a retry after a lost reply). The second call assumes a first report
    # (the task's node is not read before the commit), so it announces and puts its own object;
    # its commit meets the stored report, and it answers as the first did, removing its object
    # and its intent. Only the first call's object exists, and it is the one referenced.
    first_report = snapshots.report("refused", current, "t1", (), {"s": b"payload"})
    again = snapshots.report("refused", current, "t1", (), {"s": b"payload"})
    assert again.tasks == first_report.tasks
    assert objects(stores, "snapshots/refused/") == [first_report.tasks[0].checkpoints[0].object_key]
    assert len(blobs.puts) == 3 and blobs.unannounced == []
    assert intent_paths(stores.metadata) == []


class SweepAfterAnnounce:
    """The metadata store, running the most aggressive orphan sweep right after the first
    ``create_and_get_many`` (the report's announce + reads), before the report's put."""

    def __init__(self, inner: MetadataStore, blobs: BlobStore, now_ms: int) -> None:
        self._inner = inner
        self._blobs = blobs
        self._now_ms = now_ms
        self.swept: list[int] = []

    def create_and_get_many(self, path: str, data: bytes, paths: Sequence[str]) -> dict[str, Node | None]:
        nodes = self._inner.create_and_get_many(path, data, paths)
        if not self.swept:
            index = IntentIndex(self._inner)
            self.swept.append(index.sweep(self._blobs, self._now_ms + FAR_FUTURE_MS, HOUR_MS, 100))
        return nodes

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_a_report_whose_intent_the_sweep_takes_before_its_put_commits_nothing(
    stores: Stores, clock: ManualClock
) -> None:
    """The sweep claims (and removes) the intent between the report's first round trip and its
    put: the put then lands an object no intent announces, and the commit, which retires the
    intent by version, must fail; the call removes its object and refers to nothing."""
    metadata = SweepAfterAnnounce(stores.metadata, stores.blobs, clock.now_ms())
    snapshots = SnapshotRegistry(
        metadata,  # type: ignore[arg-type]
        stores.blobs,
        clock,
        SnapshotPolicy(inline_checkpoint_max_bytes=0),  # payloads in the blob store
        CoordinatorMetrics(new_registry()),
    )
    # Created through another process: this one reads first (the read its intent rides with).
    creator = snapshot_registry(stores, stores.blobs, clock)
    generation = creator.create("swept", ["t"], 0, 0, {}).record.generation
    warm = snapshots.create("warm", ["t"], 0, 0, {}).record.generation
    snapshots.report("warm", warm, "t", (), {"s": b"warm"})  # makes the minute's bucket: early from now
    assert metadata.swept == []

    with pytest.raises(Aborted, match="collected by the orphan sweep"):
        snapshots.report("swept", generation, "t", (), {"s": b"payload"})

    assert metadata.swept == [1]  # the sweep took our intent, before anything was put
    assert snapshots.get("swept", generation, include_checkpoints=False).snapshot.tasks == ()
    assert objects(stores, "snapshots/swept/") == []
    assert intent_paths(stores.metadata) == []
    # The task reports again (a new call, a new intent), and that one commits.
    snapshots.report("swept", generation, "t", (), {"s": b"again"})
    assert snapshots.get("swept", generation, include_checkpoints=True).payloads == {("t", "s"): b"again"}


# --- the request count on ZooKeeper --------------------------------------------------------------


@pytest.fixture
def zk_stores(zk_uri: str, s3_uri: str) -> Iterator[Stores]:
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(s3_uri)
    yield Stores("zk+s3", metadata, blobs)
    blobs.close()
    metadata.close()


def test_a_report_sends_its_intent_with_its_reads_or_from_copies_none(
    zk_stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's first report of a snapshot it did not create: the intent's create and the reads
    of the header and the report counter go in one pipeline, the commit is one multi; nothing
    else (the app's pointer is read only to refuse, the task's node only on a repeat). Its next
    reports decide on its copies of the header and counter: the intent, then the commit."""
    metadata = zk_stores.metadata
    assert isinstance(metadata, ZooKeeperMetadataStore)
    creator = snapshot_registry(zk_stores, zk_stores.blobs, clock)
    snapshots = snapshot_registry(zk_stores, zk_stores.blobs, clock)
    generation = creator.create("counted", ["t1", "t2", "t3", "t4", "t5", "t6"], 0, 0, {}).record.generation
    warm = snapshots.create("warm", ["t"], 0, 0, {}).record.generation
    snapshots.report("warm", warm, "t", (), {"s": b"warm"})  # the intent bucket exists now
    log = count_requests(metadata, monkeypatch)

    log.reset()
    snapshots.report("counted", generation, "t2", (Offset("s", 0, 1),), {"s": b"payload"})

    # The task's node is not read (absent on a first report: the multi's Create checks it).
    assert log.log == ["Create", "MultiRead", "Transaction"]
    assert log.rounds == 2  # the create and the reads were sent together: one round trip

    log.reset()
    snapshots.report("counted", generation, "t5", (Offset("s", 0, 1),), {"s": b"payload"})
    assert log.log == ["Create2", "Transaction"]  # from the copies: the intent before the put
    assert log.rounds == 2

    # A report without a payload announces nothing: its commit. (None of these completes the
    # snapshot: the first completion of a minute makes its retention bucket.)
    log.reset()
    snapshots.report("counted", generation, "t3", (Offset("s", 0, 2),), {})
    assert log.log == ["Transaction"]
    # A repeat (a retry after a lost reply) meets the stored node in the commit, reads it and
    # answers as the first call did.
    log.reset()
    again = snapshots.report("counted", generation, "t3", (Offset("s", 0, 2),), {})
    assert again.tasks[0].committed_offsets == (Offset("s", 0, 2),)
    assert log.log == ["Transaction", "MultiRead"]  # then header, counter and task node

    # UploadCheckpoint: its intent is created with the check's reads (header and pointer), then
    # completed once the stream is stored.
    log.reset()
    snapshots.upload("counted", generation, "t4", "big", [b"streamed"])
    assert log.log == ["Create", "MultiRead", "SetData"]
