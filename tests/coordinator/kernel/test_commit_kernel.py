"""The commit kernel on both backends: re-reading after lost and doubtful commits, uploads and their
cleanup, the one Aborted error, expiry buckets, dependent reads, and the conflicts metric.

The ``decide`` functions here are the tests' own; some of them play a rival writer on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from harness.faults import call_while_blob_deletes_fail
from harness.stores import Stores
from snapcoord.coordinator.errors import Aborted, CommitOutcomeUnknown, Reason, StoreUnavailable
from snapcoord.coordinator.kernel.commit import CommitKernel, Reread, RetryPolicy
from snapcoord.coordinator.kernel.decision import Commit, Done, More, ReadChildren, ReadNode, Reads, landed
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.storage.metadata import Create, Node, Op, SetData

KEY = "kernel-test/payload"


class Setup:
    def __init__(self, stores: Stores, attempts: int = 64) -> None:
        self.stores = stores
        self.registry: CollectorRegistry = new_registry()
        self.pauses: list[float] = []
        self.kernel = CommitKernel(
            stores.metadata,
            stores.blobs,
            CoordinatorMetrics(self.registry),
            RetryPolicy(attempts=attempts, per_contender=0),
            sleep=self.pauses.append,
        )

    def conflicts(self, operation: str) -> float:
        return (
            self.registry.get_sample_value("snapcoord_commit_conflicts_total", {"operation": operation})
            or 0.0
        )

    def objects(self) -> list[str]:
        return [b.key for b in self.stores.blobs.list("kernel-test/")]


def bump(reads: Reads, payload: bytes = b"x") -> Commit[int]:
    """Increment the counter at /n by compare-and-set, uploading ``payload`` first."""
    current = reads.node("/n")
    assert current is not None
    value = int(current.data)
    return Commit(
        [SetData("/n", str(value + 1).encode(), current.version)], value + 1, uploads={KEY: payload}
    )


def test_a_lost_commit_is_decided_again_on_fresh_reads(stores: Stores) -> None:
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    rounds: list[int] = []

    def decide(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
        rounds.append(int(reads.node("/n").data))  # type: ignore[union-attr]
        if len(rounds) == 1:
            stores.metadata.set("/n", b"10", version=0)  # a rival commits after our read
        return bump(reads)

    assert s.kernel.run("bump", {"counter": "n"}, [ReadNode("/n")], decide) == 11
    assert rounds == [0, 10]
    assert stores.metadata.get("/n").data == b"11"  # type: ignore[union-attr]
    assert s.conflicts("bump") == 1 and len(s.pauses) == 1 and 0 <= s.pauses[0] <= 0.05
    assert s.objects() == [KEY]  # uploaded once, owned by the commit that landed


def test_contention_beyond_the_policy_is_one_aborted_and_removes_the_upload(stores: Stores) -> None:
    s = Setup(stores, attempts=3)
    stores.metadata.create("/n", b"0")

    def always_beaten(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
        node = reads.node("/n")
        assert node is not None
        stores.metadata.set("/n", node.data, version=node.version)
        return bump(reads)

    with pytest.raises(Aborted) as raised:
        s.kernel.run("bump", {"app_id": "a", "generation": 3}, [ReadNode("/n")], always_beaten)
    assert str(raised.value) == "app_id 'a' generation 3 is heavily contended; retry"
    assert raised.value.reason is Reason.CONTENDED
    assert raised.value.metadata == {"app_id": "a", "generation": "3"}
    assert s.conflicts("bump") == 3
    assert s.objects() == []  # nothing references it: removed at once, not left to the sweep


def test_a_refusal_after_an_upload_removes_it(stores: Stores) -> None:
    s = Setup(stores)
    stores.metadata.create("/n", b"0")

    def refuse_second(reads: Reads, pending: Commit[int] | None) -> Done[int] | Commit[int]:
        node = reads.node("/n")
        assert node is not None
        if node.version == 0:
            stores.metadata.set("/n", b"5", version=0)  # lose the first round
            return bump(reads)
        return Done(-1)  # then decide there is nothing to write

    assert s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], refuse_second) == -1
    assert s.objects() == []


def test_a_commit_in_doubt_that_landed_is_recognised_and_keeps_its_upload(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    stores.blobs.put("kernel-test/old", b"replaced")
    real = stores.metadata.transaction

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real(ops)
        raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    pendings: list[Commit[int] | None] = []

    def decide(reads: Reads, pending: Commit[int] | None) -> Done[int] | Commit[int]:
        pendings.append(pending)
        if pending is not None and reads.node("/n").data == b"1":  # type: ignore[union-attr]
            return landed(pending)
        commit = bump(reads)
        return Commit(commit.ops, commit.result, uploads=commit.uploads, cleanup=("kernel-test/old",))

    assert s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], decide) == 1
    monkeypatch.undo()
    assert pendings[0] is None and pendings[1] is not None and len(pendings) == 2
    assert stores.metadata.get("/n").data == b"1"  # type: ignore[union-attr]
    assert s.objects() == [KEY]  # ours stays; what the commit unreferenced went
    assert s.conflicts("bump") == 0


def test_an_upload_in_doubt_stays_when_the_reread_fails(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data loss guard: the commit may have landed, so its payload must stay (the sweep decides later)."""
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    real_transaction, real_get_many = stores.metadata.transaction, stores.metadata.get_many
    calls = 0

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real_transaction(ops)
        raise CommitOutcomeUnknown("connection lost after the commit (test)")

    def down_after_first(paths: Sequence[str]) -> dict[str, Node | None]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise StoreUnavailable("metadata store down (test)")
        return real_get_many(paths)

    def down(sync_path: str, paths: Sequence[str]) -> dict[str, Node | None]:
        raise StoreUnavailable("metadata store down (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    monkeypatch.setattr(stores.metadata, "get_many", down_after_first)
    monkeypatch.setattr(stores.metadata, "synced_get_many", down)
    with pytest.raises(StoreUnavailable):
        s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], lambda reads, pending: bump(reads))
    monkeypatch.undo()
    assert stores.metadata.get("/n").data == b"1"  # type: ignore[union-attr]
    assert s.objects() == [KEY]


def landed_or_bump(reads: Reads, pending: Commit[int] | None) -> Done[int] | Commit[int]:
    """``bump``, or, when the read shows the commit in doubt landed (/n is 1), Done keeping it."""
    if pending is not None and reads.node("/n").data == b"1":  # type: ignore[union-attr]
        return landed(pending)
    return bump(reads)


def test_the_reread_after_a_commit_in_doubt_is_synced(
    zk_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a lost reply, kazoo may reconnect to a ZooKeeper server that has not applied the
    commit yet: a plain read there would decide again as if it never landed. Here plain reads stay
    behind (they show /n before the commit); the synced one settles it. (ZooKeeper only: the
    embedded store has no server to lag, and its synced read is a plain one.)"""
    stores = zk_stores
    s = Setup(stores, attempts=4)
    stores.metadata.create("/n", b"0")
    before = stores.metadata.get("/n")
    real_transaction, real_get_many = stores.metadata.transaction, stores.metadata.get_many
    transactions = 0

    def applied_but_first_reply_lost(ops: Sequence[Op]) -> None:
        nonlocal transactions
        transactions += 1
        real_transaction(ops)
        if transactions == 1:
            raise CommitOutcomeUnknown("connection lost after the commit (test)")

    def behind(paths: Sequence[str]) -> dict[str, Node | None]:
        nodes = real_get_many(paths)
        return {**nodes, "/n": before} if "/n" in nodes and transactions else nodes

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_first_reply_lost)
    monkeypatch.setattr(stores.metadata, "get_many", behind)
    assert s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], landed_or_bump) == 1
    monkeypatch.undo()
    assert transactions == 1 and stores.metadata.get("/n").data == b"1"  # type: ignore[union-attr]
    assert s.objects() == [KEY]


def test_an_upload_in_doubt_stays_when_a_later_commit_fails(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data loss guard: a new decision after a commit in doubt (made on reads that missed it)
    settles nothing. When that next commit fails, the objects of the one in doubt must stay."""
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    before = stores.metadata.get("/n")
    real_transaction = stores.metadata.transaction
    transactions = 0

    def applied_then_down(ops: Sequence[Op]) -> None:
        nonlocal transactions
        transactions += 1
        if transactions > 1:
            raise StoreUnavailable("metadata store down (test)")
        real_transaction(ops)
        raise CommitOutcomeUnknown("connection lost after the commit (test)")

    def missed_it(sync_path: str, paths: Sequence[str]) -> dict[str, Node | None]:
        return {p: before if p == "/n" else None for p in paths}

    monkeypatch.setattr(stores.metadata, "transaction", applied_then_down)
    monkeypatch.setattr(stores.metadata, "synced_get_many", missed_it)
    with pytest.raises(StoreUnavailable):
        s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], landed_or_bump)
    monkeypatch.undo()
    assert transactions == 2 and stores.metadata.get("/n").data == b"1"  # type: ignore[union-attr]
    assert s.objects() == [KEY]


def test_an_unused_upload_whose_delete_failed_keeps_its_intent(stores: Stores) -> None:
    """An upload the landed commit does not reference is deleted at once; if that delete fails,
    its intent must stay, or nothing would name the object for the orphan sweep."""
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    unused = "kernel-test/first-round"

    def decide(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
        node = reads.node("/n")
        assert node is not None
        if node.version == 0:
            stores.metadata.set("/n", b"5", version=0)  # lose the first round, which uploaded ``unused``
            return Commit([SetData("/n", b"6", 0)], 6, uploads={unused: b"u"})
        return bump(reads)

    result = call_while_blob_deletes_fail(
        stores.blobs, "unavailable", lambda: s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], decide)
    )
    assert result == 6
    assert sorted(s.objects()) == sorted([KEY, unused])
    assert s.kernel.intents.announced_keys() == frozenset({unused})


def test_dependent_reads_and_listings(stores: Stores) -> None:
    s = Setup(stores)
    stores.metadata.create("/ptr", b"/target")
    stores.metadata.create("/target", b"t", make_parents=True)
    stores.metadata.create("/dir/a", b"", make_parents=True)
    seen: list[Reads] = []

    def decide(reads: Reads, pending: Commit[str] | None) -> Done[str] | More:
        seen.append(reads)
        target = reads.node("/ptr").data.decode()  # type: ignore[union-attr]
        if not reads.has(ReadNode(target)):
            return More([ReadNode(target)])
        return Done(reads.node(target).data.decode() + ",".join(reads.children("/dir")))  # type: ignore[union-attr]

    assert s.kernel.run("follow", {"n": "n"}, [ReadNode("/ptr"), ReadChildren("/dir")], decide) == "ta"
    assert len(seen) == 2 and seen[1].children("/dir") == ("a",)


def test_a_stale_finish_reads_and_decides_again(stores: Stores) -> None:
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    finished: list[int] = []

    def finish(value: int) -> str:
        finished.append(value)
        if len(finished) == 1:
            stores.metadata.set("/n", b"7", version=0)
            raise Reread
        return f"value {value}"

    result = s.kernel.run(
        "read",
        {"n": "n"},
        [ReadNode("/n")],
        lambda reads, pending: Done(int(reads.node("/n").data)),  # type: ignore[union-attr]
        finish=finish,
    )
    assert result == "value 7" and finished == [0, 7]


def test_a_vanished_expiry_bucket_is_made_again(stores: Stores) -> None:
    s = Setup(stores)
    index = s.kernel.expiry("/idx")
    created: list[int] = []

    def decide(reads: Reads, pending: Commit[None] | None) -> Done[None] | Commit[None]:
        if reads.node("/idx/1/entry") is not None:
            return Done(None)
        created.append(1)
        return Commit([Create("/idx/1/entry", b"")], None, buckets=(("/idx", 60_000),), ensure=("/idx",))

    index.prepare(60_000)  # cached as existing...
    stores.metadata.delete("/idx/1")  # ...then removed by a janitor pass (an empty past bucket)
    s.kernel.run("index", {"n": "n"}, [ReadNode("/idx/1/entry")], decide)
    assert stores.metadata.get("/idx/1/entry") is not None
    assert created == [1, 1] and s.conflicts("index") == 1


def test_assumed_reads_stand_in_for_the_first_round(stores: Stores) -> None:
    s = Setup(stores)
    stores.metadata.create("/n", b"3")
    seen: list[Node | None] = []

    def create_if_absent(reads: Reads, pending: Commit[str] | None) -> Done[str] | Commit[str]:
        seen.append(reads.node("/n"))
        if reads.node("/n") is not None:
            return Done("exists")
        return Commit([Create("/n", b"0")], "created")

    assert (
        s.kernel.run("c", {"n": "n"}, [ReadNode("/n")], create_if_absent, assume=Reads({"/n": None}))
        == "exists"
    )
    assert seen[0] is None and seen[1] is not None  # the guess, then what the failed create told


def test_deferred_reads_are_left_out_of_the_first_round_only(stores: Stores) -> None:
    """A deferred read is not made in the first round (decide finds it not read); after a lost
    commit every read is made."""
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    stores.metadata.create("/m", b"rival")
    seen: list[bool] = []

    def decide(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
        seen.append(reads.has(ReadNode("/m")))
        # Assumes /m absent when not read, as a report assumes its task's node; the Create checks.
        if reads.has(ReadNode("/m")):
            return bump(reads)
        return Commit([Create("/m", b"ours"), *bump(reads).ops], -1, uploads={KEY: b"x"})

    result = s.kernel.run(
        "bump", {"n": "n"}, [ReadNode("/n"), ReadNode("/m")], decide, defer=[ReadNode("/m")]
    )
    assert (result, seen) == (1, [False, True])
    assert stores.metadata.get("/m").data == b"rival"  # type: ignore[union-attr]
    # The create of the deferred node failed: a wrong guess, counted apart from contention.
    assert stale_copies(s, "bump") == 1 and s.conflicts("bump") == 0 and len(s.pauses) == 1


def stale_copies(s: Setup, operation: str) -> float:
    return s.registry.get_sample_value("snapcoord_commit_stale_copies_total", {"operation": operation}) or 0.0


def test_a_stale_copy_is_decided_again_and_counted_apart_from_contention(stores: Stores) -> None:
    """``assume`` is this process's copy (here: an old one); the commit's version check refuses
    it, and the next round reads. It counts as a stale copy, not a conflict; it pauses all the
    same (another process writing the same record is what makes a copy stale)."""
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    copy = stores.metadata.get("/n")
    stores.metadata.set("/n", b"7", version=0)  # another process moved it on since the copy
    seen: list[bytes] = []

    def decide(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
        seen.append(reads.node("/n").data)  # type: ignore[union-attr]
        return bump(reads, b"y")

    assert s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], decide, assume=Reads({"/n": copy})) == 8
    assert seen == [b"0", b"7"]  # the copy, then a fresh read
    assert stores.metadata.get("/n").data == b"8"  # type: ignore[union-attr]
    assert stale_copies(s, "bump") == 1 and s.conflicts("bump") == 0 and len(s.pauses) == 1
    assert s.objects() == [KEY]


def test_a_race_lost_after_a_stale_copy_counts_as_a_conflict(stores: Stores) -> None:
    """Only the round decided on the copy is a stale copy: a rival that wins the fresh round is contention."""
    s = Setup(stores)
    stores.metadata.create("/n", b"0")
    copy = stores.metadata.get("/n")
    stores.metadata.set("/n", b"1", version=0)
    rounds: list[bytes] = []

    def decide(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
        node = reads.node("/n")
        assert node is not None
        rounds.append(node.data)
        if len(rounds) == 2:
            stores.metadata.set("/n", b"5", version=node.version)  # a rival commits after our read
        return bump(reads)

    assert s.kernel.run("bump", {"n": "n"}, [ReadNode("/n")], decide, assume=Reads({"/n": copy})) == 6
    assert rounds == [b"0", b"1", b"5"]
    assert stale_copies(s, "bump") == 1 and s.conflicts("bump") == 1 and len(s.pauses) == 2
