"""A deterministic scheduler for races between a few actors, and the search over their interleavings.

Each actor is a callable run in a thread of its own. Before every storage call that matters (see
``gated``), the actor calls ``Gate.step``, which blocks until the scheduler grants it the step; the
call then runs while every other actor waits at its own gate. So one actor runs at a time, and a run
is fully described by the sequence of actors granted a step: its *interleaving*. A ``Chooser`` picks
the next actor whenever more than one waits; ``explore`` runs one scenario under every interleaving
(depth-first over those choices, each run replayed from a fresh table) when there are at most
``every_up_to`` of them, and otherwise under ``random_runs`` seeded random ones (``PriorityChoice``).

Nothing here knows about storage: the pure logic is tested on its own (``test_scheduler``).
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: How long a run may wait for its actors to reach their next gate: generous, for a busy machine.
STEP_TIMEOUT_S = 120.0


class SchedulerStuck(RuntimeError):
    """An actor neither reached a gate nor finished in time (it blocks on something the scheduler does
    not control, such as a lock another actor holds): the run cannot go on deterministically."""


class Chooser(Protocol):
    def choose(self, waiting: Sequence[str]) -> str:
        """The actor (one of ``waiting``, sorted) that takes the next step."""
        ...


class Gate:
    """One actor's gate: ``step`` waits for the scheduler's grant; ``solo`` runs a block as one step."""

    def __init__(self, run: Run, actor: str) -> None:
        self._run = run
        self.actor = actor
        self._solo = 0

    def step(self, label: str) -> None:
        if self._solo:
            return
        self._run._wait_for_grant(self.actor, label)

    @contextlib.contextmanager
    def solo(self, label: str) -> Iterator[None]:
        """The block's storage calls as a single step (work no other actor's steps can interleave
        with in a way that matters, such as writing a batch's own data files)."""
        self.step(label)
        self._solo += 1
        try:
            yield
        finally:
            self._solo -= 1


@dataclass(frozen=True)
class ActorResult:
    """What an actor's callable returned, or the exception it raised."""

    value: object = None
    error: BaseException | None = None


class Run:
    """One run of a few actors under one ``Chooser``; ``gate(actor)`` before ``start``."""

    def __init__(self, chooser: Chooser) -> None:
        self._chooser = chooser
        self._cond = threading.Condition()
        self._gates: dict[str, Gate] = {}
        self._waiting: dict[str, str] = {}  # actor -> label of the step it waits to take
        self._done: set[str] = set()
        self._granted: str | None = None
        self._threads: dict[str, threading.Thread] = {}
        #: The steps taken, in order: (actor, label).
        self.trace: list[tuple[str, str]] = []

    def gate(self, actor: str) -> Gate:
        if actor not in self._gates:
            self._gates[actor] = Gate(self, actor)
        return self._gates[actor]

    def _wait_for_grant(self, actor: str, label: str) -> None:
        if threading.current_thread() is not self._threads.get(actor):
            raise RuntimeError(f"gate of {actor!r} used from another thread")
        with self._cond:
            self._waiting[actor] = label
            if self._granted == actor:
                self._granted = None
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._granted == actor, STEP_TIMEOUT_S):
                raise SchedulerStuck(f"{actor!r} was never granted {label!r}")
            del self._waiting[actor]

    def _finish(self, actor: str) -> None:
        with self._cond:
            self._done.add(actor)
            if self._granted == actor:
                self._granted = None
            self._cond.notify_all()

    def run(self, actors: Mapping[str, Callable[[], object]]) -> dict[str, ActorResult]:
        """Run ``actors`` (name -> callable) to completion, one step at a time; their results."""
        results: dict[str, ActorResult] = {}

        def body(name: str, fn: Callable[[], object]) -> None:
            try:
                results[name] = ActorResult(value=fn())
            except BaseException as e:  # the outcome of the race, reported to the caller
                results[name] = ActorResult(error=e)
            finally:
                self._finish(name)

        for name, fn in actors.items():
            self.gate(name)
            self._threads[name] = threading.Thread(target=body, args=(name, fn), name=f"race-{name}")
        for thread in self._threads.values():
            thread.start()
        try:
            while True:
                with self._cond:
                    settled = self._cond.wait_for(
                        lambda: (
                            self._granted is None
                            and len(self._waiting) + len(self._done) == len(self._threads)
                        ),
                        STEP_TIMEOUT_S,
                    )
                    if not settled:
                        busy = sorted(set(self._threads) - set(self._waiting) - self._done)
                        raise SchedulerStuck(f"actors {busy} neither reached a gate nor finished")
                    if not self._waiting:
                        break
                    actor = self._chooser.choose(sorted(self._waiting))
                    self.trace.append((actor, self._waiting[actor]))
                    self._granted = actor
                    self._cond.notify_all()
        finally:
            for thread in self._threads.values():
                thread.join(STEP_TIMEOUT_S)
        return results


class Replay:
    """Follows ``prefix`` (indices into the sorted waiting actors), then always picks the first; it
    records every choice with how many actors were waiting, for the depth-first search."""

    def __init__(self, prefix: Sequence[int]) -> None:
        self._prefix = list(prefix)
        self.choices: list[tuple[int, int]] = []  # (index chosen, number waiting)

    def choose(self, waiting: Sequence[str]) -> str:
        depth = len(self.choices)
        index = self._prefix[depth] if depth < len(self._prefix) else 0
        if index >= len(waiting):
            raise RuntimeError(f"replay diverged at choice {depth}: {waiting} has no index {index}")
        self.choices.append((index, len(waiting)))
        return waiting[index]


def next_prefix(choices: Sequence[tuple[int, int]]) -> list[int] | None:
    """The depth-first successor of a run's choices: the deepest choice with an untried alternative,
    moved to that alternative; None when every interleaving was run."""
    stack = list(choices)
    while stack:
        index, options = stack.pop()
        if index + 1 < options:
            return [i for i, _ in stack] + [index + 1]
    return None


class Pause:
    """``actor`` takes its first ``steps`` steps, then waits while the others run to their end."""

    def __init__(self, actor: str, steps: int) -> None:
        self._actor = actor
        self._left = steps

    def choose(self, waiting: Sequence[str]) -> str:
        if self._actor in waiting and (self._left > 0 or len(waiting) == 1):
            self._left -= 1
            return self._actor
        return next(a for a in waiting if a != self._actor)


class PriorityChoice:
    """A random interleaving as probabilistic concurrency testing (PCT) draws one: the actors get a
    random priority order, the highest-priority waiting actor takes each step, and at
    ``change_points`` random step numbers below ``horizon`` the actor about to step drops to the
    lowest priority. A coin flip at every step would almost never let one actor pause for the many
    steps in which another completes its work, which is what a race between a check and a write needs;
    here every run has such pauses, at random places."""

    def __init__(self, rng: random.Random, *, change_points: int = 2, horizon: int = 48) -> None:
        self._rng = rng
        self._points = set(rng.sample(range(1, horizon), change_points))
        self._order: list[str] = []
        self._steps = 0

    def choose(self, waiting: Sequence[str]) -> str:
        new = [a for a in waiting if a not in self._order]
        self._order += self._rng.sample(new, len(new))
        self._steps += 1
        first = next(a for a in self._order if a in waiting)
        if self._steps in self._points:
            self._order.remove(first)
            self._order.append(first)
            first = next(a for a in self._order if a in waiting)
        return first


@dataclass
class Exploration:
    """The outcomes of one scenario over many interleavings."""

    #: "every" (all interleavings were run) or "random" (seeded random ones).
    mode: str
    runs: int = 0
    #: Distinct interleavings among the runs (as sequences of actors granted a step).
    distinct: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    #: One interleaving per outcome, as the steps taken (for a failing test's message).
    examples: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return self.outcomes[outcome]


#: One run of a scenario: sets up a fresh table, runs its actors in a ``Run`` and returns the outcome.
Scenario = Callable[[Run], str]


def explore(scenario: Scenario, *, every_up_to: int, random_runs: int, seed: int) -> Exploration:
    """Run ``scenario`` under every interleaving if there are at most ``every_up_to`` of them
    (depth-first), otherwise under ``random_runs`` seeded random ones."""
    seen: set[tuple[str, ...]] = set()
    if every_up_to > 0:
        found = Exploration("every")
        prefix: list[int] | None = []
        while prefix is not None and found.runs < every_up_to:
            chooser = Replay(prefix)
            _record(found, seen, scenario, chooser)
            prefix = next_prefix(chooser.choices)
        if prefix is None:
            found.distinct = len(seen)
            return found
        seen.clear()
    found = Exploration("random")
    rng = random.Random(seed)
    for _ in range(random_runs):
        _record(found, seen, scenario, PriorityChoice(rng))
    found.distinct = len(seen)
    return found


def _record(found: Exploration, seen: set[tuple[str, ...]], scenario: Scenario, chooser: Chooser) -> None:
    run = Run(chooser)
    outcome = scenario(run)
    found.runs += 1
    found.outcomes[outcome] += 1
    found.examples.setdefault(outcome, list(run.trace))
    seen.add(tuple(actor for actor, _ in run.trace))
