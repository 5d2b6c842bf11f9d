"""Leader election behind the metadata store: run a task on exactly one replica at a time.

``MetadataStore.election(name, identifier)`` returns an ``Election``; ``run(lead)`` contends and
calls ``lead(leadership)`` while this replica leads. On ZooKeeper that is kazoo's election recipe
plus what the recipe leaves out (docs/design.md, "Janitor"): stop acting while the connection is
suspended, step down when the session is lost. The embedded store serves one process, so there
it simply leads (elections of the same name on one embedded store still exclude each other).

Leadership is advisory, as with any lease-less ZooKeeper election: a leader cut off from the
ensemble learns it only when kazoo notices (SUSPENDED), so a check of ``may_act()`` can be stale
by the time the work it guards is written. The guarded work must stay safe if it runs late:
every metadata write is a version-checked compare-and-set.
"""

from __future__ import annotations

import abc
import logging
import re
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Where elections live in the store's tree (inside the ZooKeeper chroot).
ELECTION_ROOT = "/election"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

#: Pause before contending again after ``lead`` returned normally: no hot loop if it returns at once.
RECONTEND_PAUSE_S = 0.1
#: Backoff after ``lead`` raised, doubling per consecutive failure up to the maximum.
FAILURE_BACKOFF_S = 1.0
FAILURE_BACKOFF_MAX_S = 30.0


class Leadership(abc.ABC):
    """What ``lead`` is given: whether it may act now, and whether it must return."""

    @abc.abstractmethod
    def may_act(self) -> bool:
        """True while this replica leads and its session is connected; False while suspended.

        Check it before each bounded piece of work: it turns False as soon as the connection is
        suspended (and True again if the same session comes back, without a new election).
        """

    @abc.abstractmethod
    def is_lost(self) -> bool:
        """True once leadership is gone for good (session lost, election cancelled, store closed).

        It never turns False again: ``lead`` must return, and ``run`` contends anew.
        """

    @abc.abstractmethod
    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``, waking early when leadership is lost; returns ``is_lost()``."""


class Election(abc.ABC):
    """One replica's participation in a named election. Not reusable: ``cancel`` is final."""

    @abc.abstractmethod
    def run(self, lead: Callable[[Leadership], None]) -> None:
        """Contend, and call ``lead`` whenever this replica wins; return once cancelled or closed.

        When ``lead`` returns or leadership is lost, step down (hand over to the next contender)
        and contend again once the store is usable. An exception from ``lead`` is logged, then it
        contends again after a backoff. Call it from one thread at a time (usually a dedicated one).
        """

    @abc.abstractmethod
    def cancel(self) -> None:
        """Make ``run`` return soon, stepping down if leading. Idempotent; safe from any thread."""

    @abc.abstractmethod
    def is_leader(self) -> bool:
        """True while ``lead`` runs with a leadership that is not lost (it may be suspended)."""


def election_path(name: str) -> str:
    """The store path of election ``name``; ``ValueError`` for a name that is not one short word."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"election name must match {_NAME.pattern}: {name!r}")
    return f"{ELECTION_ROOT}/{name}"


def call_lead(lead: Callable[[Leadership], None], leadership: Leadership, what: str) -> bool:
    """Run one term of ``lead``; False (and the traceback logged) if it raised."""
    try:
        lead(leadership)
    except Exception:
        log.exception("%s: the leader function raised; stepping down", what)
        return False
    return True


def next_pause(ok: bool, failures: int) -> tuple[float, int]:
    """(pause before contending again, consecutive failures) after a term that ``ok`` or not."""
    if ok:
        return RECONTEND_PAUSE_S, 0
    return min(FAILURE_BACKOFF_S * 2**failures, FAILURE_BACKOFF_MAX_S), failures + 1
