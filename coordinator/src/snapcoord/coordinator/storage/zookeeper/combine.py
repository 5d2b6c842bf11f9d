"""Concurrent requests of one ZooKeeper session combined into one: transactions into one ``multi``
(group commit), reads into one ``multiRead``.

At 16 concurrent calls on a two-core machine the coordinator is CPU-bound, and a ZooKeeper request
costs CPU on both ends whatever it carries: kazoo's connection thread wakes, serialises, writes,
parses the reply and wakes the waiter; the server logs and applies one transaction. Measured here,
16 threads each committing a one-op multi cost 143 us of client CPU and 225 us of ZooKeeper CPU
per commit (4.6k commits/s); the same commits combined as below, 67 us and 64 us (9.8k/s). At a
few calls at a time nothing changes: a request that finds room goes out at once, alone, and as it
would have without combining.

How: at most ``MAX_IN_FLIGHT`` requests of a kind are in flight. One that arrives while they are
waits in a queue; when a reply comes, the connection thread hands each waiter its part and sends
everything queued as the next request (up to a capacity).

- **Transactions.** A multi is all-or-nothing, so a combined request that fails somewhere applied
  nothing: then each of its transactions is sent again on its own, which gives each its own true
  answer (a failure may be caused by another's rolled-back ops). A lost reply (connection loss,
  session expiry) is every transaction's, as it would be for a request of its own. Only first
  attempts are combined: a retry after a lost reply goes alone, so that its expected failure cannot
  fail others.
- **Reads.** A ``multiRead`` answers each node on its own (a missing node is an error in its slot),
  so the reads of several calls share one, each node read once, and each call gets its nodes. A
  call that needs a ``sync`` first (a consistent read) puts one sync in front of the batch: sent
  after every queued call arrived, it orders the batch after everything those calls must see.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from kazoo import exceptions as kz
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import GetData, Sync, Transaction

from snapcoord.coordinator.storage.zookeeper.multiread import MAX_PATHS, MultiRead

#: Requests of a kind in flight at once before more queue. For transactions, one gave the most
#: commits/s at 16 threads (10.7k against 9.2k with two, 5.0k sending each alone), but made a
#: transaction that met one other wait for its reply; with two, pairs never wait, and with fsync on
#: ZooKeeper, 16 threads still got 7.7k commits/s (8.0k with one, 3.8k alone).
MAX_IN_FLIGHT = 2

#: The slot's state once its combined request failed: send again alone.
_ALONE = object()


class _Slot:
    """One waiter's place in the queue: what it sends, then its results (or an error)."""

    __slots__ = ("done", "items", "outcome", "reply", "size", "sync")

    def __init__(self, size: int, items: Sequence[Any], sync: str | None = None) -> None:
        self.size = size
        #: A transaction's kazoo ops, or a read's paths (chroot included).
        self.items = items
        #: A read's sync path (chroot included) when the read must follow a sync.
        self.sync = sync
        self.done = threading.Event()
        #: Per-op or per-path results (a list), a transport exception, or ``_ALONE``.
        self.outcome: Any = None
        #: The request it went out in, once sent.
        self.reply: _Reply | None = None


class _Pending:
    """What ``submit`` returns: kazoo's async-result shape (``get(timeout)``)."""

    __slots__ = ("_combiner", "_slot")

    def __init__(self, combiner: _Combiner, slot: _Slot) -> None:
        self._combiner = combiner
        self._slot = slot

    def get(self, timeout: float) -> list[Any]:
        """This waiter's results, as kazoo's ``commit_async().get()`` (a transaction) or
        ``multi_read_async().get()`` (a read) gives them."""
        slot = self._slot
        stop_at = time.monotonic() + timeout
        if not slot.done.wait(timeout):
            self._combiner._give_up(slot)
            raise KazooTimeoutError("no reply before the deadline")
        if slot.outcome is _ALONE:
            alone = self._combiner._alone(slot)
            results: list[Any] = alone.get(timeout=max(stop_at - time.monotonic(), 0.001))
            return results
        if isinstance(slot.outcome, BaseException):
            raise slot.outcome
        outcome: list[Any] = slot.outcome
        return outcome


class _Reply:
    """The async result kazoo completes for one combined request (on its connection thread)."""

    __slots__ = ("_combiner", "_finished", "_slots")

    def __init__(self, combiner: _Combiner, slots: list[_Slot]) -> None:
        self._combiner = combiner
        self._slots = slots
        self._finished = False
        for slot in slots:
            slot.reply = self

    def set(self, value: Any) -> None:
        if not self._claim():
            return
        try:
            self._deliver(value)
        except Exception as e:
            # A reply that does not parse (no ZooKeeper sends one): raised on kazoo's connection
            # thread, it would end the session's loop for good, with this request still in flight.
            for slot in self._slots:
                slot.outcome = kz.MarshallingError(f"unexpected reply to a combined request: {e!r}")
        self._finish()

    def set_exception(self, exception: BaseException) -> None:
        if self._claim():
            for slot in self._slots:
                slot.outcome = exception
            self._finish()

    def _claim(self) -> bool:
        """Whether this completion is the first: kazoo may fail a request twice when a close races
        its send, and a waiter that gives up completes it too (``_Combiner._give_up``)."""
        with self._combiner._lock:
            if self._finished:
                return False
            self._finished = True
            return True

    def _deliver(self, value: Any) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        for slot in self._slots:
            slot.done.set()
        self._combiner._next()


class _Combiner:
    """The queue both kinds share: ``max_in_flight`` requests in flight, the rest waiting to go out
    together, up to ``capacity`` (a slot's ``size`` counts against it)."""

    def __init__(self, client: Any, *, capacity: int, max_in_flight: int) -> None:
        self._client = client
        self._capacity = capacity
        self._max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._queue: deque[_Slot] = deque()
        self._in_flight = 0
        #: Per thread: whether it is sending the queue (see ``_next``).
        self._local = threading.local()
        #: Combined requests sent with more than one waiter in them (for tests).
        self.combined = 0

    def _submit(self, slot: _Slot) -> _Pending:
        with self._lock:
            if self._in_flight >= self._max_in_flight:
                self._queue.append(slot)
                return _Pending(self, slot)
            self._in_flight += 1
        self._send([slot])
        return _Pending(self, slot)

    def _next(self) -> None:
        """A request in flight was answered: send what queued meanwhile, as one.

        Sent outside the lock, since kazoo may fail a request right inside ``_call`` (a closed or
        expired client), which completes it, and so calls this again, on this thread. That nested
        call only counts one more turn for the loop below: recursing would take a few stack frames
        per queued batch, and a deep queue would overflow the stack on kazoo's connection thread."""
        local = self._local
        if getattr(local, "sending", False):
            local.turns += 1
            return
        local.sending, local.turns = True, 1
        try:
            while local.turns:
                local.turns -= 1
                with self._lock:
                    if not self._queue:
                        self._in_flight -= 1
                        continue
                    batch = [self._queue.popleft()]
                    size = batch[0].size
                    while self._queue and size + self._queue[0].size <= self._capacity:
                        size += self._queue[0].size
                        batch.append(self._queue.popleft())
                if len(batch) > 1:
                    self.combined += 1
                self._send(batch)
        finally:
            local.sending = False

    def _send(self, slots: list[_Slot]) -> None:
        raise NotImplementedError

    def _alone(self, slot: _Slot) -> Any:
        """Send ``slot`` again as a request of its own (its combined request failed as a whole)."""
        raise NotImplementedError

    def _give_up(self, slot: _Slot) -> None:
        """A waiter's deadline passed. Still queued: it is never sent. Sent: its request is given
        up as unanswered (the caller treats it as in doubt), so that its place in flight is freed:
        a request kazoo dropped without an answer (one sent as a session expires can be) would
        otherwise hold that place for good, and with both places held every later request would
        queue until its deadline. A reply that comes later is ignored; the request's other
        waiters get the same timeout, and retry."""
        with self._lock:
            if slot in self._queue:
                self._queue.remove(slot)
                return
            reply = slot.reply
        if reply is not None:
            reply.set_exception(KazooTimeoutError("no reply before a waiter's deadline"))


class _TransactionReply(_Reply):
    __slots__ = ()

    def _deliver(self, results: list[Any]) -> None:
        slots = self._slots
        if len(slots) == 1:
            slots[0].outcome = results
        elif len(results) != sum(len(slot.items) for slot in slots) or any(
            isinstance(r, kz.KazooException) for r in results
        ):
            for slot in slots:
                slot.outcome = _ALONE  # nothing applied; each learns its own answer alone
        else:
            at = 0
            for slot in slots:
                slot.outcome = results[at : at + len(slot.items)]
                at += len(slot.items)


class TransactionCombiner(_Combiner):
    """Group commit for one kazoo client: ``submit`` a transaction's kazoo ops, ``get`` its results."""

    def __init__(self, client: Any, *, max_bytes: int, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        #: A combined request stays under ``max_bytes`` (a larger transaction goes alone).
        super().__init__(client, capacity=max_bytes, max_in_flight=max_in_flight)

    def submit(self, ops: Sequence[Any], size: int) -> _Pending:
        """Queue a transaction of kazoo ops (chroot already in their paths) of ``size`` request
        bytes; it goes out now when fewer than ``max_in_flight`` requests are in flight."""
        return self._submit(_Slot(size, ops))

    def send_alone(self, ops: Sequence[Any]) -> Any:
        """Send a transaction as a request of its own, outside the queue (kazoo's async result)."""
        result = self._client.handler.async_result()
        self._client._call(Transaction(list(ops)), result)
        return result

    def _alone(self, slot: _Slot) -> Any:
        return self.send_alone(slot.items)

    def _send(self, slots: list[_Slot]) -> None:
        ops = [op for slot in slots for op in slot.items]
        self._client._call(Transaction(ops), _TransactionReply(self, slots))


class _ReadReply(_Reply):
    __slots__ = ("_paths", "sync_error")

    def __init__(self, combiner: _Combiner, slots: list[_Slot], paths: list[str]) -> None:
        super().__init__(combiner, slots)
        #: The nodes read, each once, in the request's order.
        self._paths = paths
        #: Set by the sync in front of the batch when it failed (its reply comes first).
        self.sync_error: BaseException | None = None

    def set_exception(self, exception: BaseException) -> None:
        if len(self._paths) == 1 and isinstance(exception, kz.NoNodeError):
            self.set(exception)  # one node, sent as a plain get: a missing node is its answer
        else:
            super().set_exception(exception)

    def _deliver(self, value: Any) -> None:
        replies = [value] if len(self._paths) == 1 else value
        by_path = dict(zip(self._paths, replies, strict=True))
        for slot in self._slots:
            if slot.sync is not None and self.sync_error is not None:
                slot.outcome = self.sync_error
            else:
                # An error is raised by its waiter: each gets an instance of its own.
                slot.outcome = [
                    type(r)() if isinstance(r, Exception) else r for r in (by_path[p] for p in slot.items)
                ]


class _SyncReply:
    """The async result of the sync in front of a read batch: a failure fails the synced reads."""

    __slots__ = ("_batch",)

    def __init__(self, batch: _ReadReply) -> None:
        self._batch = batch

    def set(self, value: Any) -> None:
        pass

    def set_exception(self, exception: BaseException) -> None:
        self._batch.sync_error = exception


class ReadCombiner(_Combiner):
    """Read combining for one kazoo client: ``submit`` the paths a call reads (and the sync it
    needs first, if any), ``get`` one reply per path."""

    def __init__(self, client: Any, *, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        super().__init__(client, capacity=MAX_PATHS, max_in_flight=max_in_flight)

    def submit(self, paths: Sequence[str], sync: str | None = None) -> _Pending:
        """Queue a read of 1 to ``MAX_PATHS`` nodes (paths with the chroot), behind a sync of
        ``sync`` when given. Its ``get`` gives a reply per path, in order: ``(data, stat)``, or the
        kazoo exception of that node (``NoNodeError``...); a failed sync raises. Alone, it goes out
        as it would by itself: a ``get`` for one node, a ``multiRead`` for several, the sync first."""
        if not 0 < len(paths) <= MAX_PATHS:
            raise ValueError(f"a combined read takes 1 to {MAX_PATHS} paths, not {len(paths)}")
        return self._submit(_Slot(len(paths), paths, sync))

    def _send(self, slots: list[_Slot]) -> None:
        paths = list(dict.fromkeys(path for slot in slots for path in slot.items))
        reply = _ReadReply(self, slots, paths)
        sync = next((slot.sync for slot in slots if slot.sync is not None), None)
        if sync is not None:
            # ZooKeeper answers a session's requests in order: the reads behind the sync see what
            # it made visible, and its reply comes before theirs.
            self._client._call(Sync(sync), _SyncReply(reply))
        request = GetData(paths[0], None) if len(paths) == 1 else MultiRead(tuple(paths))
        self._client._call(request, reply)
