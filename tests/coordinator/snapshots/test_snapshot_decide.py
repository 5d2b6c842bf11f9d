"""Table tests of ``snapshots.decide``: read results + request in, Done/Commit/More with ops out, or
the refusal (with its reason and metadata). No store."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from snapcoord.coordinator.domain.leases import Lease, SnapshotRef, encode_lease, encode_pins
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import (
    encode_app,
    encode_reported,
    encode_retention,
    encode_snapshot,
    encode_task_report,
)
from snapcoord.coordinator.domain.snapshots import (
    CheckpointRef,
    RetentionPolicy,
    Snapshot,
    SnapshotPolicy,
    SnapshotRecord,
    State,
    TaskReport,
)
from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, NotFound, Reason
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.decision import Commit, Decision, Done, More, ReadNode, Reads
from snapcoord.coordinator.snapshots import decide
from snapcoord.coordinator.snapshots.decide import CreateRequest, Outcome, ReportRequest
from snapcoord.coordinator.snapshots.layout import APPS, DEADLINES, RETENTION
from snapcoord.coordinator.snapshots.leases.layout import record_path
from snapcoord.coordinator.snapshots.pins import PINS, pin_path
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, Op, SetData

NOW = 6_000_000
#: The policy of the deletion tests: a clock-skew margin of one second.
SKEW_1S = SnapshotPolicy(max_clock_skew_ms=1_000)
MINUTE = 60_000
APP = f"{APPS}/app"
GENS = f"{APP}/gens"


def gen(g: int) -> str:
    return f"{GENS}/{g:020d}"


def node(data: bytes, version: int = 0) -> Node:
    return Node(data, version, 0, 0)


def header(
    g: int, state: State = State.CREATED, *, reported: int = 0, tasks: tuple[str, ...] = ("t1", "t2")
) -> SnapshotRecord:
    ended = NOW - 10 if state is not State.CREATED else 0
    return SnapshotRecord(
        "app",
        g,
        state,
        tasks,
        reported,
        NOW - 100,
        ended if state is State.COMPLETED else 0,
        ended,
        NOW + 900,
        0,
        (),
        "",
    )


def read(*pairs: tuple[str, Node | None]) -> Reads:
    return Reads(dict(pairs))


# --- create ---------------------------------------------------------------------------------------

CREATE = CreateRequest("app", ("t1", "t2"), 0, 1_000, ())
NEW1 = replace(header(1), created_at_ms=NOW, deadline_ms=NOW + 1_000)
NEW3 = replace(NEW1, generation=3)


def creation(record: SnapshotRecord) -> list[Create]:
    g = record.generation
    return [
        Create(gen(g), encode_snapshot(record)),
        Create(f"{gen(g)}/tasks", b""),
        Create(f"{DEADLINES}/{(NOW + 1_000) // MINUTE}/app@{g}", b""),
    ]


CREATE_CASES: list[tuple[str, Reads, Decision[Outcome]]] = [
    (
        "a new app: pointer, gens and generation 1 in one commit",
        read((APP, None)),
        Commit(
            [Create(APP, encode_app(1)), Create(GENS, b""), *creation(NEW1)],
            Outcome(Snapshot(NEW1, ()), True),
            buckets=((DEADLINES, NOW + 1_000),),
            ensure=(APPS,),
        ),
    ),
    (
        "an app at generation 2: read its header too",
        read((APP, node(encode_app(2), 5))),
        More([ReadNode(gen(2))]),
    ),
    (
        "the current snapshot is CREATED: return it (a retry is safe)",
        read((APP, node(encode_app(2), 5)), (gen(2), node(encode_snapshot(header(2))))),
        Done(Outcome(Snapshot(header(2), ()), False)),
    ),
    (
        "the current snapshot ended: generation + 1, moving the pointer by version",
        read((APP, node(encode_app(2), 5)), (gen(2), node(encode_snapshot(header(2, State.COMPLETED))))),
        Commit(
            [SetData(APP, encode_app(3), 5), *creation(NEW3)],
            Outcome(Snapshot(NEW3, ()), True),
            buckets=((DEADLINES, NOW + 1_000),),
            ensure=(APPS,),
        ),
    ),
]


@pytest.mark.parametrize(("case", "reads", "expected"), CREATE_CASES, ids=[c[0] for c in CREATE_CASES])
def test_create(case: str, reads: Reads, expected: Decision[Outcome]) -> None:
    assert decide.create(CREATE, reads, None, NOW) == expected


# --- report ---------------------------------------------------------------------------------------

OFFSETS = (Offset("orders", 0, 42),)
REF = CheckpointRef("state", "snapshots/app/2/t1/" + "a" * 32, 7, "sha")
REPORT = ReportRequest("app", 2, "t1", OFFSETS, "digest-1", (REF,), {REF.object_key: b"payload"})
MINE = TaskReport("t1", OFFSETS, (REF,), "digest-1")
TASK = f"{gen(2)}/tasks/t1"


COUNTER = f"{gen(2)}/tasks"


def report_reads(
    record: SnapshotRecord | None, current: int, existing: TaskReport | None = None, counted: int | None = 0
) -> Reads:
    """The reads of a report: the header, the counter node (``counted``: its count, b"" for 0 as
    CreateSnapshot makes it; None: absent), the task's node and the app's pointer."""
    counter = (
        None if counted is None or record is None else node(encode_reported(counted) if counted else b"", 9)
    )
    return read(
        (gen(2), node(encode_snapshot(record), 4) if record is not None else None),
        (COUNTER, counter),
        (TASK, node(encode_task_report(existing)) if existing is not None else None),
        (APP, node(encode_app(current))),
    )


def test_a_report_reads_the_pointer_only_to_refuse() -> None:
    """A report reads the header, the counter and the task; the app's pointer only names the
    current generation in a refusal, so it is read (a second round) only then."""
    assert REPORT.reads() == [ReadNode(gen(2)), ReadNode(COUNTER), ReadNode(TASK)]
    assert REPORT.task_read() == ReadNode(TASK) and REPORT.counter_read() == ReadNode(COUNTER)
    first = read((gen(2), node(encode_snapshot(header(2)), 4)), (COUNTER, node(b"", 9)), (TASK, None))
    assert isinstance(decide.report(REPORT, first, None, NOW), Commit)
    fenced = read(
        (gen(2), node(encode_snapshot(header(2, State.ABORTED)), 4)), (COUNTER, node(b"")), (TASK, None)
    )
    assert decide.report(REPORT, fenced, None, NOW) == More([ReadNode(APP)])
    gone = read((gen(2), None), (COUNTER, None), (TASK, None))
    assert decide.report(REPORT, gone, None, NOW) == More([ReadNode(APP)])
    # A round without the counter (not a report's own first round) asks for it.
    without_counter = read((gen(2), node(encode_snapshot(header(2)), 4)), (TASK, None))
    assert decide.report(REPORT, without_counter, None, NOW) == More([ReadNode(COUNTER)])


def test_a_report_without_the_task_read_commits_on_an_open_header_and_asks_otherwise() -> None:
    """The first round may leave the task's node out (deferred): on a CREATED header the report
    commits as a first report, its Create checking the node is absent; on any other header the
    answer depends on the node (a repeat after completion is idempotent), so it asks for it."""
    without_task = read((gen(2), node(encode_snapshot(header(2)), 4)), (COUNTER, node(b"", 9)))
    assert decide.report(REPORT, without_task, None, NOW) == decide.report(
        REPORT, report_reads(header(2), 2), None, NOW
    )
    for ended in (LAST_OF_TWO, header(2, State.ABORTED), None):
        first = read((gen(2), node(encode_snapshot(ended), 4) if ended is not None else None))
        assert decide.report(REPORT, first, None, NOW) == More([ReadNode(TASK), ReadNode(APP)])
    # A refusal on an open header waits for the node too: a stored report answers first.
    outside = read((gen(2), node(encode_snapshot(header(2, tasks=("t9",))), 4)), (COUNTER, node(b"", 9)))
    assert decide.report(REPORT, outside, None, NOW) == More([ReadNode(TASK)])
    # With both read, a repeat after completion is answered as before.
    done = decide.report(REPORT, report_reads(LAST_OF_TWO, 2, MINE), None, NOW)
    assert done == Done(Outcome(Snapshot(LAST_OF_TWO, (MINE,)), False), keep=frozenset({REF.object_key}))


FIRST_OF_TWO = replace(header(2), reported=1)
LAST_OF_TWO = replace(header(2), reported=2, state=State.COMPLETED, completed_at_ms=NOW, ended_at_ms=NOW)
LAST_OF_THREE = replace(
    header(2, tasks=("t1", "t2", "t3")),
    reported=3,
    state=State.COMPLETED,
    completed_at_ms=NOW,
    ended_at_ms=NOW,
)
ENDED_OPS: list[Op] = [
    Delete(f"{DEADLINES}/{(NOW + 900) // MINUTE}/app@2", None),
    Create(f"{RETENTION}/{NOW // MINUTE}/app@2", b""),
]


def completing(reads: Reads, after: SnapshotRecord, counter: int) -> tuple[Reads, Decision[Outcome]]:
    return (
        reads,
        Commit(
            [
                Create(TASK, encode_task_report(MINE)),
                SetData(COUNTER, encode_reported(counter), 9),
                SetData(gen(2), encode_snapshot(after), 4),
                *ENDED_OPS,
            ],
            Outcome(Snapshot(after, (MINE,)), True),
            uploads={REF.object_key: b"payload"},
            buckets=((RETENTION, NOW),),
        ),
    )


REPORT_CASES: list[tuple[str, Reads, Decision[Outcome]]] = [
    (
        "the first report: create the task node, count it in the counter node by version, and "
        "check the header's version (a few bytes written, not the task set)",
        report_reads(header(2), 2),
        Commit(
            [
                Create(TASK, encode_task_report(MINE)),
                SetData(COUNTER, encode_reported(1), 9),
                Check(gen(2), 4),
            ],
            Outcome(Snapshot(header(2), (MINE,)), False),
            uploads={REF.object_key: b"payload"},
        ),
    ),
    (
        "the last report completes the snapshot: the header is written, its deadline dropped, "
        "retention triggered",
        *completing(report_reads(header(2), 2, counted=1), LAST_OF_TWO, 2),
    ),
    (
        "reports counted by servers before the counter node (in the header) count as well",
        *completing(
            report_reads(replace(header(2, tasks=("t1", "t2", "t3")), reported=1), 2, counted=1),
            LAST_OF_THREE,
            2,
        ),
    ),
    (
        "one report short of the task set, counting both: not complete",
        report_reads(replace(header(2, tasks=("t1", "t2", "t3")), reported=1), 2, counted=0),
        Commit(
            [
                Create(TASK, encode_task_report(MINE)),
                SetData(COUNTER, encode_reported(1), 9),
                Check(gen(2), 4),
            ],
            Outcome(Snapshot(replace(header(2, tasks=("t1", "t2", "t3")), reported=1), (MINE,)), False),
            uploads={REF.object_key: b"payload"},
        ),
    ),
    (
        "no counter node: the header counts, as before it",
        report_reads(header(2), 2, counted=None),
        Commit(
            [Create(TASK, encode_task_report(MINE)), SetData(gen(2), encode_snapshot(FIRST_OF_TWO), 4)],
            Outcome(Snapshot(FIRST_OF_TWO, (MINE,)), False),
            uploads={REF.object_key: b"payload"},
        ),
    ),
    (
        "no counter node, the last report: the header completes",
        report_reads(FIRST_OF_TWO, 2, counted=None),
        Commit(
            [
                Create(TASK, encode_task_report(MINE)),
                SetData(gen(2), encode_snapshot(LAST_OF_TWO), 4),
                *ENDED_OPS,
            ],
            Outcome(Snapshot(LAST_OF_TWO, (MINE,)), True),
            uploads={REF.object_key: b"payload"},
            buckets=((RETENTION, NOW),),
        ),
    ),
    (
        "the same report again (a commit of ours landed): idempotent, keeping our upload",
        report_reads(FIRST_OF_TWO, 2, MINE),
        Done(Outcome(Snapshot(FIRST_OF_TWO, (MINE,)), False), keep=frozenset({REF.object_key})),
    ),
    (
        "the same report, stored by an earlier call (other uploads): idempotent, ours go",
        report_reads(LAST_OF_TWO, 3, replace(MINE, checkpoints=(replace(REF, object_key="other"),))),
        Done(
            Outcome(
                Snapshot(LAST_OF_TWO, (replace(MINE, checkpoints=(replace(REF, object_key="other"),)),)),
                False,
            )
        ),
    ),
]


@pytest.mark.parametrize(("case", "reads", "expected"), REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_report(case: str, reads: Reads, expected: Decision[Outcome]) -> None:
    assert decide.report(REPORT, reads, None, NOW) == expected


REFUSED_REPORTS: list[tuple[str, Reads, type[Exception], Reason, dict[str, str]]] = [
    (
        "a different report of the task",
        report_reads(FIRST_OF_TWO, 2, replace(MINE, digest="other")),
        FailedPrecondition,
        Reason.REPORT_CONFLICT,
        {"app_id": "app", "generation": "2", "task_id": "t1"},
    ),
    (
        "an older generation",
        report_reads(header(2, State.ABORTED), 3),
        FailedPrecondition,
        Reason.SNAPSHOT_FENCED,
        {"app_id": "app", "generation": "2", "current_generation": "3"},
    ),
    (
        "a generation that does not exist yet",
        report_reads(None, 1),
        FailedPrecondition,
        Reason.SNAPSHOT_FENCED,
        {"app_id": "app", "generation": "2", "current_generation": "1"},
    ),
    (
        "the current generation, completed",
        report_reads(LAST_OF_TWO, 2),
        FailedPrecondition,
        Reason.SNAPSHOT_NOT_CREATED,
        {"app_id": "app", "generation": "2", "current_generation": "2", "state": "COMPLETED"},
    ),
    (
        "a task outside the task set",
        report_reads(header(2, tasks=("t9",)), 2),
        InvalidArgument,
        Reason.INVALID_ARGUMENT,
        {},
    ),
]


@pytest.mark.parametrize(
    ("case", "reads", "error", "reason", "metadata"), REFUSED_REPORTS, ids=[c[0] for c in REFUSED_REPORTS]
)
def test_refused_report(
    case: str, reads: Reads, error: type[Exception], reason: Reason, metadata: dict[str, str]
) -> None:
    with pytest.raises(error) as raised:
        decide.report(REPORT, reads, None, NOW)
    assert raised.value.reason is reason  # type: ignore[attr-defined]
    assert raised.value.metadata == metadata  # type: ignore[attr-defined]


# --- abort ----------------------------------------------------------------------------------------


def test_abort_table() -> None:
    aborted = replace(header(2), state=State.ABORTED, ended_at_ms=NOW, abort_reason="stop")
    assert decide.abort(
        "app", 2, "stop", read((gen(2), node(encode_snapshot(header(2)), 6))), None, NOW
    ) == Commit(
        [
            SetData(gen(2), encode_snapshot(aborted), 6),
            Delete(f"{DEADLINES}/{(NOW + 900) // MINUTE}/app@2", None),
            Create(f"{RETENTION}/{NOW // MINUTE}/app@2", b""),
        ],
        Outcome(Snapshot(aborted, ()), True),
        buckets=((RETENTION, NOW),),
    )
    default = decide.abort("app", 2, "", read((gen(2), node(encode_snapshot(header(2))))), None, NOW)
    assert (
        isinstance(default, Commit)
        and default.result.snapshot.record.abort_reason == decide.DEFAULT_ABORT_REASON
    )
    already = header(2, State.ABORTED)
    assert decide.abort("app", 2, "x", read((gen(2), node(encode_snapshot(already)))), None, NOW) == Done(
        Outcome(Snapshot(already, ()), False)
    )
    with pytest.raises(NotFound):
        decide.abort("app", 2, "x", read((gen(2), None)), None, NOW)
    with pytest.raises(NotFound):
        decide.abort("app", 0, "x", Reads(), None, NOW)  # nothing to read for generation 0
    with pytest.raises(FailedPrecondition) as raised:
        decide.abort(
            "app", 2, "x", read((gen(2), node(encode_snapshot(header(2, State.COMPLETED))))), None, NOW
        )
    assert raised.value.reason is Reason.SNAPSHOT_NOT_CREATED
    assert raised.value.metadata == {"app_id": "app", "generation": "2", "state": "COMPLETED"}


# --- delete ---------------------------------------------------------------------------------------

PIN = pin_path("app", 2)
TASKS = f"{gen(2)}/tasks"
ENDED = header(2, State.COMPLETED)
REPORTED = TaskReport("t1", OFFSETS, (REF,), "d")


TRIGGER = decide.deleting_trigger("app", 2, NOW)


def delete_reads(
    record: SnapshotRecord | None, pins: dict[str, int] | None, leases: dict[str, Lease | None] | None = None
) -> Reads:
    """The first round's reads; with ``leases``, also the records of those holders (None: none)."""
    holders = {
        record_path(k): (node(encode_lease(v), 5) if v is not None else None)
        for k, v in (leases or {}).items()
    }
    return Reads(
        {
            gen(2): node(encode_snapshot(record), 8) if record is not None else None,
            PIN: node(encode_pins(pins), 3) if pins is not None else None,
            TRIGGER: None,
            **holders,
        }
    )


HELD_REF = SnapshotRef("app", 2)


MARKED = replace(ENDED, state=State.DELETING)
MARK = Commit(
    [Create(PIN, b""), Delete(PIN, None), SetData(gen(2), encode_snapshot(MARKED), 8), Create(TRIGGER, b"")],
    True,
    buckets=((RETENTION, NOW),),
    ensure=(PINS,),
)
MARK_CASES: list[tuple[str, Reads, Commit[bool] | None, Decision[bool]]] = [
    ("no snapshot", delete_reads(None, None), None, Done(False)),
    (
        "unpinned, no pin index: guard by creating and deleting it; mark DELETING with a trigger",
        delete_reads(ENDED, None),
        None,
        MARK,
    ),
    (
        "a pin index whose holders are all listed as expired: read their records first",
        delete_reads(ENDED, {"lease": NOW - 10_000, "gone": NOW - 20_000}),
        None,
        More([ReadNode(record_path("gone")), ReadNode(record_path("lease"))]),
    ),
    (
        "their records show them expired (or gone): guard by the index's version, rewrite each record",
        delete_reads(
            ENDED,
            {"lease": NOW - 10_000, "gone": NOW - 20_000},
            {"lease": Lease("lease", 1_000, NOW - 10_000, (HELD_REF,)), "gone": None},
        ),
        None,
        Commit(
            [
                Check(PIN, 3),
                # Rewritten as it was: a renewal racing this mark fails one of the two, also one
                # decided before the mark read the record (a check would let it land after).
                SetData(
                    record_path("lease"), encode_lease(Lease("lease", 1_000, NOW - 10_000, (HELD_REF,))), 5
                ),
                SetData(gen(2), encode_snapshot(MARKED), 8),
                Create(TRIGGER, b""),
            ],
            True,
            buckets=((RETENTION, NOW),),
        ),
    ),
    ("already DELETING: carry on", delete_reads(MARKED, {"lease": NOW + 10_000}), None, Done(True)),
    ("a mark in doubt whose snapshot is gone meanwhile", delete_reads(None, None), MARK, Done(True)),
]


@pytest.mark.parametrize(("case", "reads", "pending", "expected"), MARK_CASES, ids=[c[0] for c in MARK_CASES])
def test_delete_mark(case: str, reads: Reads, pending: Commit[bool] | None, expected: Decision[bool]) -> None:
    assert decide.delete_mark("app", 2, reads, pending, NOW, SKEW_1S) == expected


@pytest.mark.parametrize(
    ("case", "reads", "reason"),
    [
        ("still CREATED", delete_reads(header(2), None), Reason.SNAPSHOT_IN_PROGRESS),
        ("pinned by a live lease", delete_reads(ENDED, {"lease": NOW + 10_000}), Reason.LEASE_HELD),
        ("pinned within the clock-skew margin", delete_reads(ENDED, {"lease": NOW - 500}), Reason.LEASE_HELD),
        (
            "listed as expired, but renewed since it pinned",
            delete_reads(
                ENDED, {"lease": NOW - 10_000}, {"lease": Lease("lease", 60_000, NOW + 50_000, (HELD_REF,))}
            ),
            Reason.LEASE_HELD,
        ),
        (
            "renewed, within the clock-skew margin",
            delete_reads(
                ENDED, {"lease": NOW - 10_000}, {"lease": Lease("lease", 60_000, NOW - 500, (HELD_REF,))}
            ),
            Reason.LEASE_HELD,
        ),
    ],
)
def test_refused_delete(case: str, reads: Reads, reason: Reason) -> None:
    with pytest.raises(FailedPrecondition) as raised:
        decide.delete_mark("app", 2, reads, None, NOW, SKEW_1S)
    assert raised.value.reason is reason
    assert raised.value.metadata == {"app_id": "app", "generation": "2"}


def with_newer(reads: Reads, record: SnapshotRecord | None) -> Reads:
    """``reads`` and the header of generation 3, the newer completed one retention keeps."""
    return reads.merged(Reads({gen(3): node(encode_snapshot(record), 11) if record is not None else None}))


def test_a_retention_mark_checks_the_newer_completed_snapshot_it_keeps() -> None:
    """Retention never deletes the newest completed snapshot: its mark of generation 2 checks that
    generation 3 is still COMPLETED, at the version read, in the same transaction."""
    reads = with_newer(delete_reads(ENDED, None), replace(ENDED, generation=3))
    assert decide.delete_mark("app", 2, reads, None, NOW, SKEW_1S, 3) == Commit(
        [*MARK.ops[:2], Check(gen(3), 11), *MARK.ops[2:]], True, buckets=((RETENTION, NOW),), ensure=(PINS,)
    )


@pytest.mark.parametrize(
    "newer", [None, replace(ENDED, generation=3, state=State.DELETING)], ids=["gone", "deleting"]
)
def test_a_retention_mark_is_refused_once_the_newer_completed_snapshot_went(
    newer: SnapshotRecord | None,
) -> None:
    with pytest.raises(FailedPrecondition) as raised:
        decide.delete_mark("app", 2, with_newer(delete_reads(ENDED, None), newer), None, NOW, SKEW_1S, 3)
    assert "generation 3, the newer completed snapshot" in str(raised.value)


def step_reads(record: SnapshotRecord | None, tasks: tuple[str, ...] = ()) -> Reads:
    return Reads({gen(2): node(encode_snapshot(record), 9) if record is not None else None}, {TASKS: tasks})


def task(name: str) -> str:
    return f"{TASKS}/{name}"


REPORT_T2 = replace(REPORTED, task_id="t2", checkpoints=(replace(REF, object_key="k2"),))
BOTH = step_reads(MARKED, ("t1", "t2")).merged(
    read((task("t1"), node(encode_task_report(REPORTED))), (task("t2"), node(encode_task_report(REPORT_T2))))
)
ONE_OP = len(task("t1")) + decide.DELETE_OP_OVERHEAD
#: What a task's keys add to its cost: they are listed in the batch's intent.
T1_KEYS = len(REF.object_key) + decide.INTENT_KEY_OVERHEAD


def batch(tasks: tuple[str, ...], keys: tuple[str, ...]) -> Commit[decide.Step]:
    """The step that deletes ``tasks`` (checked against the header) and makes the intent of their
    objects ``keys`` (this minute's bucket; named after the header and the batch's first task),
    which are deleted after the commit, and the intent then."""
    unique = hashlib.sha256(f"{MARKED.created_at_ms}/{task(tasks[0])}".encode()).hexdigest()[:32]
    doomed = f"{intents.ROOT}/{NOW // 60_000}/{unique}"
    data = b'{"created_ms":%d,"keys":[%s],"swept":false,"version":1}' % (
        NOW,
        b",".join(b'"%s"' % k.encode() for k in keys),
    )
    return Commit(
        [Check(gen(2), 9), *(Delete(task(t), None) for t in tasks), Create(doomed, data)],
        decide.Step.MORE,
        cleanup=keys,
        withdraw=(doomed,),
        buckets=((intents.ROOT, NOW),),
    )


NO_CHECKPOINTS = step_reads(MARKED, ("t1",)).merged(
    read((task("t1"), node(encode_task_report(replace(REPORTED, checkpoints=())))))
)
STEP_CASES: list[tuple[str, Reads, int, Decision[decide.Step]]] = [
    ("no snapshot: someone finished", step_reads(None, ("t1",)), 10_000, Done(decide.Step.GONE)),
    ("not DELETING (recreated): never touched", step_reads(ENDED, ("t1",)), 10_000, Done(decide.Step.GONE)),
    (
        "tasks to delete: read them",
        step_reads(MARKED, ("t1", "t2")),
        10_000,
        More([ReadNode(task("t1")), ReadNode(task("t2"))]),
    ),
    (
        "a batch: the tasks, checked against the header, then their objects",
        BOTH,
        10_000,
        batch(("t1", "t2"), (REF.object_key, "k2")),
    ),
    (
        "the batch stops at its byte budget (one task at least)",
        BOTH,
        ONE_OP + 1,
        batch(("t1",), (REF.object_key,)),
    ),
    (
        "the budget counts the keys the intent lists",
        BOTH,
        2 * ONE_OP + T1_KEYS,  # both tasks' deletes fit, but not t2's key as well
        batch(("t1",), (REF.object_key,)),
    ),
    (
        "tasks without objects: no intent",
        NO_CHECKPOINTS,
        10_000,
        Commit([Check(gen(2), 9), Delete(task("t1"), None)], decide.Step.MORE),
    ),
    (
        "no tasks left: the tasks node and the header, last",
        step_reads(MARKED),
        10_000,
        Commit([Delete(TASKS, None), Delete(gen(2), 9)], decide.Step.FINISHED),
    ),
]


@pytest.mark.parametrize(("case", "reads", "budget", "expected"), STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_delete_step(case: str, reads: Reads, budget: int, expected: Decision[decide.Step]) -> None:
    assert decide.delete_step("app", 2, reads, None, budget, NOW) == expected


IN_DOUBT = batch(("t1", "t2"), (REF.object_key, "k2"))
STEP_IN_DOUBT_CASES: list[tuple[str, Reads, Decision[decide.Step]]] = [
    (
        "a batch in doubt that landed (its tasks are no longer listed): its objects, then its intent",
        step_reads(MARKED, ("t3",)),
        Done(decide.Step.MORE, keep=frozenset(), cleanup=IN_DOUBT.cleanup, withdraw=IN_DOUBT.withdraw),
    ),
    ("a batch in doubt that did not land: again", BOTH, IN_DOUBT),
    (
        "the header went meanwhile: landed (the last step was someone's)",
        step_reads(None),
        Done(decide.Step.MORE, keep=frozenset(), cleanup=IN_DOUBT.cleanup, withdraw=IN_DOUBT.withdraw),
    ),
]


@pytest.mark.parametrize(
    ("case", "reads", "expected"), STEP_IN_DOUBT_CASES, ids=[c[0] for c in STEP_IN_DOUBT_CASES]
)
def test_delete_step_in_doubt(case: str, reads: Reads, expected: Decision[decide.Step]) -> None:
    assert decide.delete_step("app", 2, reads, IN_DOUBT, 10_000, NOW) == expected


# --- set_retention --------------------------------------------------------------------------------


def test_set_retention_table() -> None:
    policy = RetentionPolicy(3, 0)
    trigger = f"{RETENTION}/{NOW // MINUTE}/app@policy"
    first = read((APP, None), (f"{APP}/retention", None), (trigger, None))
    assert decide.set_retention("app", policy, first, None, NOW) == Commit(
        [
            Create(APP, encode_app(0)),
            Create(GENS, b""),
            Create(f"{APP}/retention", encode_retention(policy)),
            Create(trigger, b""),
        ],
        policy,
        buckets=((RETENTION, NOW),),
        ensure=(APPS,),
    )
    again = read((APP, node(encode_app(4))), (f"{APP}/retention", node(b"{}", 2)), (trigger, node(b"")))
    assert decide.set_retention("app", policy, again, None, NOW) == Commit(
        [SetData(f"{APP}/retention", encode_retention(policy), 2)],
        policy,
        buckets=((RETENTION, NOW),),
        ensure=(APPS,),
    )


def test_a_report_encoded_by_the_caller_is_stored_as_it_is_unless_uploads_join_it() -> None:
    """The registry encodes the report to size it; without uploads those are the stored bytes.
    Refs the reads add (uploads) make another report: then it is encoded here."""
    given = b'{"given":1}'
    decision = decide.report(replace(REPORT, encoded=given), report_reads(header(2), 2), None, NOW)
    assert isinstance(decision, Commit) and decision.ops[0] == Create(TASK, given)
    plain = decide.report(REPORT, report_reads(header(2), 2), None, NOW)
    assert isinstance(plain, Commit) and plain.ops[0] == Create(TASK, encode_task_report(MINE))
    assert decision.ops[1:] == plain.ops[1:]
