"""Leader election on ZooKeeper: kazoo's election recipe, plus what the recipe leaves to its user.

kazoo's ``Election`` is ``with Lock(path, identifier): func()``. Each contender creates an
ephemeral sequential node ``<uuid>__lock__<seq>`` holding its identifier under ``/election/<name>``;
the lowest one leads and each of the others watches its predecessor. This module contends with the
recipe's lock (same nodes, so ``Election.contenders()`` and any ZooKeeper tool show who leads) but
drives the leadership itself, because ``Election.run`` would:

- call the leader function even when ``acquire()`` gave up: ``Lock.__enter__`` ignores its result;
- release with the client's default retry (unbounded, backing off to an hour): stepping down while
  disconnected would block until ZooKeeper is back;
- let ``cancel`` end nothing during an outage: a request made while disconnected waits in kazoo's
  queue for the reconnection, and the recipe makes such requests;
- neither stop the leader on SUSPENDED nor step it down on LOST.

Threads: ``run``'s thread never blocks in kazoo. Each round's ``Lock.acquire`` runs on a helper
thread; ``run`` waits on this election's condition, which the helper, kazoo's state listener,
``cancel`` and the store's ``close`` notify. Nobody calls kazoo while holding the condition and
kazoo's threads hold it only for an assignment, so there is no lock-order cycle with kazoo's locks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState
from kazoo.recipe.election import Election as KazooElection
from kazoo.retry import KazooRetry

from snapcoord.coordinator.storage.election import (
    Election,
    Leadership,
    call_lead,
    election_path,
    next_pause,
)

log = logging.getLogger(__name__)

#: Every wait re-checks its condition at least this often: kazoo does not report a state it is
#: already in (the store closing while the client is LOST, say), so a notification can be missing.
_POLL_S = 0.5


class ZooKeeperElection(Election):
    """One replica's contender in ``/election/<name>``; made by ``ZooKeeperMetadataStore.election``."""

    def __init__(self, client: KazooClient, name: str, identifier: str, *, handover_timeout_s: float) -> None:
        self._client = client
        self._name = name
        self._path = election_path(name)
        self._identifier = identifier
        #: How long stepping down waits for the contender node's deletion while connected.
        self._handover_timeout_s = handover_timeout_s
        self._cond = threading.Condition()
        # Guarded by _cond:
        self._cancelled = False
        self._closed = False
        self._running = False
        #: LOST transitions seen while running; a leadership is lost once this moves past the
        #: count it was won under (kazoo reconnects with a new session by itself afterwards).
        self._losses = 0
        self._leadership: _ZkLeadership | None = None

    # --- Election -------------------------------------------------------------------------------

    def run(self, lead: Callable[[Leadership], None]) -> None:
        with self._cond:
            if self._running:
                raise RuntimeError(f"election {self._name} is already running")
            self._running = True
        self._client.add_listener(self._on_kazoo_state)
        try:
            pause, failures = 0.0, 0
            while self._sleep(pause) and self._await_connected():
                ok = self._term(lead)
                pause, failures = next_pause(ok, failures)
        finally:
            self._client.remove_listener(self._on_kazoo_state)
            with self._cond:
                self._running = False

    def cancel(self) -> None:
        # Only a flag and a notification, so that any thread may call it, kazoo's and lead's too;
        # the run thread does the rest (cancelling the recipe, deleting the node).
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def is_leader(self) -> bool:
        with self._cond:
            leadership = self._leadership
        return leadership is not None and not leadership.is_lost()

    def store_closed(self) -> None:
        """Called by the store's ``close`` before it stops the client: ``run`` returns."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- one term -------------------------------------------------------------------------------

    def _term(self, lead: Callable[[Leadership], None]) -> bool:
        """Contend once, lead if elected, step down; False if contending or leading failed."""
        what = f"election {self._name} ({self._identifier})"
        rnd = _Round(self)
        helper = threading.Thread(target=rnd.contend, name=f"snapcoord-election-{self._name}", daemon=True)
        leadership = None
        with self._cond:
            if self._stopping():
                return True
            helper.start()
            self._wait(lambda: rnd.done or self._stopping())
            if not rnd.done:
                # Cancelled or closed while contending: the helper keeps the node and deletes it
                # when acquire() returns, whatever it returns (see _Round.contend).
                rnd.abandoned = True
            elif rnd.won and not self._stopping():
                leadership = _ZkLeadership(self, rnd.generation)
                self._leadership = leadership
        if leadership is None:
            if rnd.abandoned:
                # Wakes a contender waiting for its predecessor: kazoo's acquire raises
                # CancelledError and deletes the node. (A retry pause sees `abandoned` instead.)
                rnd.lock.cancel()
                self._await_release(rnd)
            elif rnd.won:  # won, but cancelled in the same instant: hand it on
                rnd.release()
                self._await_release(rnd)
            return not rnd.failed

        log.info("%s: elected", what)
        ok = True
        try:
            if not leadership.is_lost():  # a LOST between winning and here: nothing to lead
                ok = call_lead(lead, leadership, what)
        finally:
            with self._cond:
                leadership.ended = True
                self._leadership = None
                self._cond.notify_all()
            # Step down: delete the node now, so that the next contender takes over at once.
            rnd.release()
            self._await_release(rnd)
            log.info("%s: stepped down", what)
        return ok

    # --- waiting --------------------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self._cancelled or self._closed

    def _wait(self, done: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait (holding ``_cond``) until ``done()`` or the timeout; returns ``done()``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not done():
            remaining = _POLL_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cond.wait(min(remaining, _POLL_S))
        return True

    def _sleep(self, seconds: float) -> bool:
        """Pause between terms; False once stopping."""
        with self._cond:
            self._wait(self._stopping, seconds)
            return not self._stopping()

    def _await_connected(self) -> bool:
        """Contend only on a usable session: a round started while disconnected would just sit in
        kazoo's queue. False once stopping."""
        with self._cond:
            self._wait(lambda: self._stopping() or self._client.state == KazooState.CONNECTED)
            return not self._stopping()

    def _await_release(self, rnd: _Round) -> None:
        """Give the node's deletion a moment while connected; disconnected it completes later
        (kazoo sends it on reconnecting), or the node goes with the session."""
        with self._cond:
            released = self._wait(
                lambda: rnd.released or self._closed or self._client.state != KazooState.CONNECTED,
                self._handover_timeout_s,
            )
        if not released:
            log.warning(
                "election %s: contender node not deleted yet; deleting it in the background", self._name
            )

    def _lost_since(self, generation: int) -> bool:
        return self._cancelled or self._closed or self._losses != generation

    def _wait_lost(self, leadership: _ZkLeadership, timeout_s: float) -> bool:
        with self._cond:
            return self._wait(leadership.is_lost, timeout_s)

    def _on_kazoo_state(self, state: str) -> None:
        """kazoo's connection thread: count LOST and wake the waiters, nothing that blocks."""
        with self._cond:
            if state == KazooState.LOST:
                self._losses += 1
            self._cond.notify_all()


class _ZkLeadership(Leadership):
    def __init__(self, election: ZooKeeperElection, generation: int) -> None:
        self._election = election
        self._generation = generation
        #: Set when the term ends (lead returned): a leaked reference must not act afterwards.
        self.ended = False

    def may_act(self) -> bool:
        # Read the connection state before the loss count. kazoo counts LOST (our listener runs
        # before it goes on) before it reports CONNECTED for a new session, so a CONNECTED read
        # first is either our session's or comes with the loss already counted.
        connected = self._election._client.state == KazooState.CONNECTED
        return connected and not self.is_lost()

    def is_lost(self) -> bool:
        return self.ended or self._election._lost_since(self._generation)

    def wait(self, timeout_s: float) -> bool:
        return self._election._wait_lost(self, timeout_s)


class _Round:
    """One contention: a fresh recipe (new uuid prefix, new node), acquired on a helper thread.

    Who deletes the node: the helper, unless it won and handed the leadership to ``run`` (then
    ``run`` does, on stepping down). ``done``, ``won`` and ``abandoned`` are guarded by the
    election's condition, so exactly one of the two sides sees the hand-over.
    """

    def __init__(self, election: ZooKeeperElection) -> None:
        self._election = election
        self._client = election._client
        self._cond = election._cond
        self.lock: Any = KazooElection(self._client, election._path, election._identifier).lock
        # The recipe's lock retries connection loss forever, backing off to a minute, and only a
        # reconnection ends that. Same policy capped at 1 s, and interruptible: an abandoned round
        # gives up at its next pause. (A private attribute: kazoo has no parameter for it.)
        self.lock._retry = KazooRetry(
            max_tries=-1,
            delay=0.1,
            backoff=2,
            max_delay=1.0,
            sleep_func=self._client.handler.sleep_func,
            interrupt=lambda: self.abandoned or election._closed,
        )
        self.done: bool = False  # acquire() returned (or raised)
        self.won: bool = False  # ... and the leadership is handed to run()
        self.failed: bool = False  # ... with an error worth a backoff
        self.abandoned: bool = False  # run() stopped waiting: cancelled or closed
        self.generation: int = 0  # the election's loss count when the node was verified
        self.released: bool = False  # the node is deleted (or went with the session)
        self._release_started = False

    def contend(self) -> None:
        """The helper thread: acquire, check, and hand over or clean up."""
        won = failed = False
        try:
            # False when interrupted (abandoned); CancelledError after lock.cancel(). Either way
            # kazoo tried to delete the node, which a dropped connection can defeat: hence the
            # release() below.
            if self.lock.acquire():
                won = self._verify()
        except kz.CancelledError:
            pass
        except kz.KazooException as e:
            if not (self.abandoned or self._election._closed):
                log.warning("election %s: contending failed: %r", self._election._name, e)
                failed = True
        except Exception:
            log.exception("election %s: contending failed", self._election._name)
            failed = True
        with self._cond:
            self.done = True
            self.won = won and not self.abandoned
            self.failed = failed
            release = not self.won
            self._cond.notify_all()
        if release:
            self.release()

    def _verify(self) -> bool:
        """acquire() saw our node first among the contenders; is it still ours, in this session?

        The session can expire between that read and now; ``run`` would then lead on a session
        that never won. Count the losses first, then check that the node exists and belongs to the
        live session: a loss after the count makes the leadership lost at once.
        """
        with self._cond:
            generation = self._election._losses
        try:
            _, stat = self._client.get(f"{self.lock.path}/{self.lock.node}")
        except kz.NoNodeError:
            return False
        client_id = self._client.client_id  # None while disconnected
        if client_id is None or stat.ephemeralOwner != client_id[0]:
            return False
        self.generation = generation
        return True

    # --- release: asynchronous, so that nobody blocks in kazoo ------------------------------------

    def release(self) -> None:
        """Delete this round's node, now or as soon as the connection is back; idempotent.

        The node is found by the recipe's uuid prefix rather than ``lock.node``: a create whose
        reply was lost leaves a node we never learnt the name of. Each ConnectionLoss re-lists;
        made while disconnected, the request waits in kazoo's queue and is sent on reconnecting,
        so a stepping-down leader's node goes even if the connection was down. A session expiry
        (the node went with it) or a closed client ends the chain.
        """
        with self._cond:
            if self._release_started:
                return
            self._release_started = True
        self._list()

    def _list(self) -> None:
        if self._election._closed:
            self._released()  # the session ends with the client, and the node with it
            return
        try:
            self._client.get_children_async(self.lock.path).rawlink(self._on_children)
        except Exception:
            log.exception("election %s: cannot list contenders", self._election._name)
            self._released()

    def _on_children(self, result: Any) -> None:
        """kazoo's callback thread: send the deletions, never wait for them."""
        try:
            children = result.get()
        except kz.ConnectionLoss:
            self._list()
            return
        except kz.KazooException:  # NoNode, SessionExpired (node gone), ConnectionClosed
            self._released()
            return
        ours = [child for child in children if child.startswith(self.lock.prefix)]
        if not ours:
            self._released()
            return
        for child in ours:  # one, unless something is badly wrong
            self._client.delete_async(f"{self.lock.path}/{child}").rawlink(self._on_deleted)

    def _on_deleted(self, result: Any) -> None:
        try:
            result.get()
        except (kz.ConnectionLoss, kz.NoNodeError):
            pass  # deleted or not: the listing below tells
        except (kz.SessionExpiredError, kz.ConnectionClosedError):
            self._released()  # the node went with the session, or goes with the closing client
            return
        except kz.KazooException as e:
            log.warning("election %s: cannot delete the contender node: %r", self._election._name, e)
            self._released()
            return
        self._list()  # finishes once no node of ours is listed

    def _released(self) -> None:
        with self._cond:
            self.released = True
            self._cond.notify_all()
