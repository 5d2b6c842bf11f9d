"""The checker on hand-written histories: each anomaly kind is caught, good concurrent histories
(including ones whose only linearization reorders operations) pass, info operations are optional."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from robustness.checker import (
    DELETED_WHILE_LEASED,
    DOUBLE_WINNER,
    LOST_WRITE,
    NOT_LINEARIZABLE,
    RESURRECTED_LEASE,
    STALE_READ,
    UNKNOWN,
    check,
)
from robustness.history import History, Op
from snapcoord.client import NotFound, SnapshotFenced, Unavailable

MS = 1_000_000


class Builder:
    """Operations with times in milliseconds (invoke, return)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def __call__(
        self,
        op: str,
        key: str,
        span: tuple[float, float | None],
        outcome: str = "ok",
        result: Any = None,
        process: str = "p",
        **args: Any,
    ) -> Op:
        ret = span[1] if span[1] is not None else span[0] + 1
        o = Op(len(self.ops), process, op, key, args, int(span[0] * MS), int(ret * MS), outcome, result)  # type: ignore[arg-type]
        self.ops.append(o)
        return o

    def history(self) -> History:
        return History(list(self.ops))


def refused(reason: str, code: str = "FAILED_PRECONDITION") -> dict[str, Any]:
    return {"code": code, "reason": reason, "metadata": {}}


NOT_FOUND = refused("NOT_FOUND", "NOT_FOUND")
UNAVAILABLE = refused("UNAVAILABLE", "UNAVAILABLE")
P = "producer/p"


def reg(value: str, registered: bool, stored: str | None = None) -> dict[str, Any]:
    return {"registered": registered, "value": stored if stored is not None else value}


def final_of(ops: list[Op]) -> Any:
    return lambda _history: History(ops)


# -- producers: create-if-absent ------------------------------------------------------------------


def test_concurrent_registrations_with_one_winner_pass() -> None:
    b = Builder()
    b("register", P, (0, 10), result=reg("a", True), value="a", process="1")
    b("register", P, (2, 12), result=reg("b", False, "a"), value="b", process="2")
    b("get", P, (13, 14), result={"value": "a"})
    assert check(b.history()).ok


def test_a_later_invoked_winner_linearizes_first() -> None:
    """The search must not reject a history whose only linearization reorders concurrent ops."""
    b = Builder()
    b("register", P, (0, 10), result=reg("a", False, "b"), value="a", process="1")
    b("register", P, (1, 9), result=reg("b", True), value="b", process="2")
    b("get", P, (2, 3), outcome="fail", result=NOT_FOUND, process="3")  # before either took effect
    report = check(b.history())
    assert report.ok, report


def test_two_winners_without_a_delete_are_a_double_winner() -> None:
    b = Builder()
    b("register", P, (0, 10), result=reg("a", True), value="a", process="1")
    b("register", P, (20, 30), result=reg("b", True), value="b", process="2")
    report = check(b.history())
    assert DOUBLE_WINNER in report.kinds() and NOT_LINEARIZABLE in report.kinds(), report
    assert "register" in str(report) and P in str(report)


def test_a_delete_between_two_winners_makes_both_legal() -> None:
    b = Builder()
    b("register", P, (0, 10), result=reg("a", True), value="a")
    b("delete", P, (11, 12), result={"deleted": True})
    b("register", P, (20, 30), result=reg("b", True), value="b")
    assert check(b.history()).ok


def test_a_delete_separates_winners_whose_later_invoked_one_took_effect_first() -> None:
    """The first-invoked winner spans the other and the delete: the order short winner, delete,
    long winner is legal."""
    b = Builder()
    b("register", P, (151, 832), result=reg("a", True), value="a", process="1")
    b("register", P, (278, 341), result=reg("b", True), value="b", process="2")
    b("delete", P, (461, 462), result={"deleted": True}, process="3")
    report = check(b.history())
    assert report.ok, report


def test_an_info_write_may_or_may_not_have_happened() -> None:
    for read in ({"value": "a"}, None):
        b = Builder()
        b("register", P, (0, 10), outcome="info", result=UNAVAILABLE, value="a")
        if read is None:
            b("get", P, (20, 21), outcome="fail", result=NOT_FOUND)
        else:
            b("get", P, (20, 21), result=read)
        assert check(b.history()).ok


def test_an_info_write_takes_effect_once() -> None:
    """Seen, then gone with no delete: not linearizable whether or not the write happened."""
    b = Builder()
    b("register", P, (0, 10), outcome="info", result=UNAVAILABLE, value="a")
    b("get", P, (20, 21), result={"value": "a"})
    b("get", P, (30, 31), outcome="fail", result=NOT_FOUND)
    assert not check(b.history()).ok


def test_a_deleted_value_read_again_is_a_stale_read() -> None:
    b = Builder()
    b("register", P, (0, 10), result=reg("a", True), value="a")
    b("delete", P, (11, 12), result={"deleted": True})
    b("get", P, (20, 21), result={"value": "a"})
    report = check(b.history())
    assert report.kinds() == {STALE_READ}, report


def test_an_acknowledged_write_missing_from_the_final_read_is_lost() -> None:
    b = Builder()
    b("register", P, (0, 10), result=reg("a", True), value="a")
    final = Builder()
    final("get", P, (100, 101), outcome="fail", result=NOT_FOUND, process="final")
    report = check(b.history(), final_of(final.ops))
    assert report.kinds() == {LOST_WRITE}, report
    assert check(b.history(), final_of([])).ok


def test_advance_deletes_its_previous_record() -> None:
    b = Builder()
    b("register", "producer/q", (0, 1), result=reg("a", True), value="a")
    b(
        "advance",
        P,
        (2, 3),
        result={**reg("b", True), "previous_deleted": True},
        value="b",
        previous="producer/q",
    )
    b("get", "producer/q", (4, 5), result={"value": "a"})  # gone since the advance
    report = check(b.history())
    assert report.kinds() == {STALE_READ}, report


# -- snapshots -------------------------------------------------------------------------------------

A = "snapshot/app"


def snap(gen: int, state: str, tasks: dict[str, str] | None = None) -> dict[str, Any]:
    return {"generation": gen, "state": state, "task_ids": ["t0", "t1"], "tasks": tasks or {}}


def completed_generation(b: Builder) -> None:
    b("create", A, (0, 1), result=snap(1, "CREATED"), task_ids=["t0", "t1"])
    b("report", A, (2, 6), result=snap(1, "CREATED"), generation=1, task="t0", value="x", process="1")
    b("report", A, (3, 5), result=snap(1, "COMPLETED"), generation=1, task="t1", value="y", process="2")


def test_concurrent_reports_complete_the_snapshot() -> None:
    b = Builder()
    completed_generation(b)
    b("get", A, (7, 8), result=snap(1, "COMPLETED", {"t0": "x", "t1": "y"}), generation=1)
    b(
        "report",
        A,
        (9, 10),
        outcome="fail",
        result=refused("REPORT_CONFLICT"),
        generation=1,
        task="t0",
        value="z",
    )
    b(
        "report", A, (11, 12), result=snap(1, "COMPLETED"), generation=1, task="t0", value="x"
    )  # the same again
    b("create", A, (13, 14), result=snap(2, "CREATED"), task_ids=["t0", "t1"])
    b("current", A, (15, 16), result=snap(2, "CREATED"), consistent=True)
    assert check(b.history()).ok


def test_a_torn_read_of_a_completing_snapshot_is_caught() -> None:
    """CREATED with every report in it: the header and the reports from two moments."""
    b = Builder()
    completed_generation(b)
    b("get", A, (4, 8), result=snap(1, "CREATED", {"t0": "x", "t1": "y"}), generation=1)
    assert check(b.history()).kinds() == {STALE_READ}


def test_a_report_accepted_for_a_fenced_generation_is_caught() -> None:
    b = Builder()
    completed_generation(b)
    b("create", A, (7, 8), result=snap(2, "CREATED"), task_ids=["t0", "t1"])
    b("report", A, (9, 10), result=snap(1, "CREATED"), generation=1, task="t0", value="new")
    assert check(b.history()).kinds() == {NOT_LINEARIZABLE}


def test_an_older_current_generation_after_a_newer_one_is_stale() -> None:
    b = Builder()
    completed_generation(b)
    b("create", A, (7, 8), result=snap(2, "CREATED"), task_ids=["t0", "t1"])
    b("current", A, (9, 10), result=snap(1, "COMPLETED"), consistent=True)
    assert STALE_READ in check(b.history()).kinds()


def test_retention_may_delete_old_generations_but_not_the_newest_completed() -> None:
    b = Builder()
    b("retention", A, (0, 0.5))
    completed_generation(b)
    b("create", A, (7, 8), result=snap(2, "CREATED"), task_ids=["t0", "t1"])
    b("abort", A, (9, 10), result=snap(2, "ABORTED"), generation=2)
    b("get", A, (11, 12), outcome="fail", result=NOT_FOUND, generation=2)  # the janitor's
    assert check(b.history()).ok
    b("get", A, (13, 14), outcome="fail", result=NOT_FOUND, generation=1)  # the newest completed
    assert not check(b.history()).ok


def test_retention_may_have_deleted_a_generation_that_is_the_newest_completed_now() -> None:
    """Deletable once (a newer one completed), deleted by the janitor then; the newer one deleted
    after that does not bring it back."""
    b = Builder()
    b("retention", A, (0, 0.5))
    completed_generation(b)
    b("create", A, (7, 8), result=snap(2, "CREATED"), task_ids=["t0", "t1"])
    b("report", A, (9, 10), result=snap(2, "CREATED"), generation=2, task="t0", value="x")
    b("report", A, (11, 12), result=snap(2, "COMPLETED"), generation=2, task="t1", value="y")
    b("delete", A, (13, 14), result={"deleted": True}, generation=2)
    b("get", A, (15, 16), outcome="fail", result=NOT_FOUND, generation=1)
    assert check(b.history()).ok


# -- leases ----------------------------------------------------------------------------------------

L = "lease/l"


def lease(*refs: tuple[str, int], expires: int = 0) -> dict[str, Any]:
    return {"expires_at_ms": expires, "duration_ms": 0, "snapshots": sorted([a, g] for a, g in refs)}


def test_renewals_within_the_margin_pass_and_after_it_resurrect() -> None:
    b = Builder()
    b("acquire", L, (0, 10), result={**lease(), "unavailable": []}, duration_ms=1000, snapshots=[])
    b("renew", L, (1500, 1510), result=lease(), duration_ms=1000)  # possibly alive until 10+1000+1000
    assert check(b.history(), margin_s=1.0).ok
    b("renew", L, (5000, 5010), result=lease(), duration_ms=1000)
    report = check(b.history(), margin_s=1.0)
    assert RESURRECTED_LEASE in report.kinds(), report


def test_an_expired_answer_needs_a_possibly_expired_lease() -> None:
    b = Builder()
    b("acquire", L, (0, 10), result={**lease(), "unavailable": []}, duration_ms=60_000, snapshots=[])
    b("get", L, (20, 30), outcome="fail", result=refused("EXPIRED", "NOT_FOUND"))
    assert check(b.history(), margin_s=1.0).kinds() == {NOT_LINEARIZABLE}


def test_a_dropped_lease_that_renews_is_resurrected() -> None:
    b = Builder()
    b("acquire", L, (0, 10), result={**lease(), "unavailable": []}, duration_ms=60_000, snapshots=[])
    b("drop", L, (20, 30), result={"dropped": True})
    b("renew", L, (40, 50), result=lease(), duration_ms=60_000)
    assert RESURRECTED_LEASE in check(b.history()).kinds()


def test_a_snapshot_deleted_under_a_live_lease_is_caught() -> None:
    b = Builder()
    completed_generation(b)
    b("create", A, (7, 8), result=snap(2, "CREATED"), task_ids=["t0", "t1"])
    pinned = lease(("app", 1))
    b(
        "acquire",
        L,
        (10, 20),
        result={**pinned, "unavailable": []},
        duration_ms=60_000,
        snapshots=[["app", 1]],
    )
    b("delete", A, (30, 40), outcome="fail", result=refused("LEASE_HELD"), generation=1)
    assert check(b.history()).ok
    b("delete", A, (50, 60), result={"deleted": True}, generation=1)
    report = check(b.history())
    assert report.kinds() == {DELETED_WHILE_LEASED}, report
    # Released first: deleting is legal.
    b("release", L, (41, 45), result=lease(), snapshots=[["app", 1]])
    assert check(b.history()).ok


# -- backlog ---------------------------------------------------------------------------------------

J = "backlog/j"


def status(*parts: tuple[int, int, int, bool]) -> dict[str, Any]:
    return {"processing_backlog": not all(p[3] for p in parts), "partitions": [["s", *p] for p in parts]}


def test_a_partition_finished_by_two_reports_is_a_double_winner() -> None:
    b = Builder()
    b("mark", J, (0, 1), result=status((0, 100, -1, False)), boundaries=[["s", 0, 100]])
    progress = {"newly_finished": [["s", 0, 150]], "processing_backlog": False}
    b("progress", J, (2, 10), result=progress, positions=[["s", 0, 150]], report_id="a", process="1")
    assert check(b.history()).ok
    b("progress", J, (3, 9), result=progress, positions=[["s", 0, 150]], report_id="b", process="2")
    report = check(b.history())
    assert DOUBLE_WINNER in report.kinds(), report


def test_the_first_mark_wins() -> None:
    b = Builder()
    b("mark", J, (0, 1), result=status((0, 100, -1, False)), boundaries=[["s", 0, 100]])
    b("mark", J, (2, 3), result=status((0, 100, -1, False)), boundaries=[["s", 0, 120]])
    assert check(b.history()).ok
    b("mark", J, (4, 5), result=status((0, 120, -1, False)), boundaries=[["s", 0, 120]])
    assert check(b.history()).kinds() == {NOT_LINEARIZABLE}


# -- the search and the recorder -------------------------------------------------------------------


def test_the_search_limit_is_reported_not_passed() -> None:
    b = Builder()
    for i in range(6):
        b("register", P, (0, 10), outcome="info", result=UNAVAILABLE, value=str(i), process=str(i))
    b("get", P, (20, 21), result={"value": "5"})
    report = check(b.history(), search_limit=3)
    assert not report.ok and report.kinds() == {UNKNOWN}, report
    assert check(b.history()).ok


def raise_(error: Exception) -> None:
    raise error


def test_history_records_outcomes_and_round_trips(tmp_path: Path) -> None:
    h = History()
    assert h.call(1, "get", P, {}, lambda: {"value": "a"}) == {"value": "a"}
    for error in (NotFound("gone"), Unavailable("down"), SnapshotFenced("old", reason="SNAPSHOT_FENCED")):
        with pytest.raises(type(error)):
            h.call(2, "get", P, {}, functools.partial(raise_, error))
    retried = NotFound("gone", attempts=2)
    with pytest.raises(NotFound):
        h.call(3, "renew", L, {}, functools.partial(raise_, retried))
    assert [o.outcome for o in h] == ["ok", "fail", "info", "fail", "info"]
    assert h.snapshot()[3].result["reason"] == "SNAPSHOT_FENCED"
    h.dump(tmp_path / "h.jsonl")
    loaded = History.load(tmp_path / "h.jsonl")
    assert loaded.snapshot() == h.snapshot()
    merged = History.merge([loaded, History.load(tmp_path / "h.jsonl")])
    assert [o.index for o in merged] == list(range(10))
    assert all(
        a.invoke_ns <= b.invoke_ns for a, b in zip(merged.snapshot(), merged.snapshot()[1:], strict=False)
    )
