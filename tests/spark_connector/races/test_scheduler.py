"""The race scheduler on pure logic: it enumerates every interleaving exactly once, replays seeded
random ones identically, and finds the race of a check-then-write create (and none of an atomic one)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest

from . import scheduler
from .scheduler import Gate, Run, SchedulerStuck, explore


def _steps(gate: Gate, n: int) -> Callable[[], object]:
    def body() -> object:
        for i in range(n):
            gate.step(f"s{i}")
        return n

    return body


@pytest.mark.parametrize(("m", "n"), [(1, 1), (3, 2), (4, 4)])
def test_every_interleaving_once(m: int, n: int) -> None:
    def scenario(run: Run) -> str:
        results = run.run({"a": _steps(run.gate("a"), m), "b": _steps(run.gate("b"), n)})
        assert results["a"].value == m and results["b"].value == n
        return "".join(actor for actor, _ in run.trace)

    found = explore(scenario, every_up_to=10_000, random_runs=0, seed=0)
    assert found.mode == "every"
    assert found.runs == found.distinct == math.comb(m + n, m)
    assert sum(found.outcomes.values()) == found.runs and all(v == 1 for v in found.outcomes.values())


def test_too_many_interleavings_fall_back_to_seeded_random_runs() -> None:
    def scenario(run: Run) -> str:
        run.run({"a": _steps(run.gate("a"), 6), "b": _steps(run.gate("b"), 6)})
        return "".join(actor for actor, _ in run.trace)

    first = explore(scenario, every_up_to=50, random_runs=40, seed=7)
    again = explore(scenario, every_up_to=0, random_runs=40, seed=7)
    assert first.mode == again.mode == "random"
    assert first.runs == 40 and first.outcomes == again.outcomes
    assert 1 < first.distinct <= 40


def test_random_runs_pause_an_actor_for_the_whole_of_another() -> None:
    """The interleaving a check-then-write race needs: one actor stops between two steps while the
    other runs all of its many steps."""

    def scenario(run: Run) -> str:
        run.run({"a": _steps(run.gate("a"), 3), "b": _steps(run.gate("b"), 20)})
        return "".join(actor for actor, _ in run.trace)

    found = explore(scenario, every_up_to=0, random_runs=200, seed=1)
    assert {"a" + "b" * 20 + "aa", "aa" + "b" * 20 + "a"} & set(found.outcomes)


def _create_race(atomic: bool) -> Callable[[Run], str]:
    """Two writers create one name in a dict, exclusively: atomically (one step), or as the check and
    then the write (two steps); the outcome names whose value stayed and who thought it won."""

    def scenario(run: Run) -> str:
        store: dict[str, str] = {}

        def create(me: str) -> Callable[[], object]:
            gate = run.gate(me)

            def body() -> object:
                gate.step("exists")
                if "k" in store:
                    return False
                if not atomic:
                    gate.step("write")
                store["k"] = me
                return True

            return body

        results = run.run({"a": create("a"), "b": create("b")})
        winners = sorted(w for w, r in results.items() if r.value)
        return f"kept {store['k']}, won {'+'.join(winners)}"

    return scenario


def test_finds_the_race_of_a_check_then_write_create() -> None:
    found = explore(_create_race(atomic=False), every_up_to=100, random_runs=0, seed=0)
    assert found.mode == "every" and found.runs == math.comb(4, 2)
    assert found.count("kept a, won a+b") > 0 and found.count("kept b, won a+b") > 0


def test_atomic_create_has_one_winner_in_every_interleaving() -> None:
    found = explore(_create_race(atomic=True), every_up_to=100, random_runs=0, seed=0)
    assert found.mode == "every" and found.runs == 2
    assert set(found.outcomes) == {"kept a, won a", "kept b, won b"}


def test_an_actor_blocked_outside_its_gate_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler, "STEP_TIMEOUT_S", 0.5)
    lock = threading.Lock()

    def scenario(run: Run) -> str:
        a, b = run.gate("a"), run.gate("b")

        def holder() -> object:
            with lock:
                a.step("holding the lock")
            return None

        def blocked() -> object:
            b.step("first")
            with lock:  # waits for a lock whose holder waits at its gate
                return None

        run.run({"a": holder, "b": blocked})
        return "done"

    with pytest.raises(SchedulerStuck):
        explore(scenario, every_up_to=10, random_runs=0, seed=0)
