"""Run a streaming query with a catch-up trigger while it processes backlog, a low-latency one
when it has caught up, and back again when it falls behind (FLIP-309's processing backlog).

A trigger is fixed when a query starts, so switching means stopping the query and starting it
again on the same checkpoint. ``BacklogAwareRunner`` owns a ``BacklogTracker`` for the job and
feeds it the query's ``recentProgress`` from the driver's own thread each ``poll()``: this works
in a classic driver and under Spark Connect alike, where it needs no listener (a query run by the
runner needs none for its job). The phases:

- **start**: the catch-up trigger when the job was never marked, its backlog is not done, or the
  query was down for longer than ``BacklogBound.max_downtime_s`` (the time of the last batch comes
  from the checkpoint's offsets log; the tracker then resets the mark with the next batch, so the
  flag is on again); else the steady trigger.
- **catch-up -> steady** once the tracker marked, delivered every report, and the coordinator says
  the backlog is done; or once an AvailableNow query ended by itself: after its last report is
  delivered (retried until it is), a run that read nothing more or caught up goes steady, one that
  read data but is still behind its boundary starts another catch-up run.
- **steady -> catch-up** when the tracker turned the flag on again: the query fell behind its
  sources by more than ``BacklogBound.max_lag``, or its source gained a partition that is behind
  the latest offset the tracker marked it at (``tracker``: sources that grow).

``switches`` records each switch with the time ``query.stop()`` took (the batch it interrupted).

A switch's ``stop()`` interrupts the query wherever it is. Spark ends the query quietly when the
interrupt surfaces as the JVM's interrupt exception, but file system clients may report it as
something else (Hadoop's ``sftp://`` wraps it, or returns a listing cut short that Spark reads as
"batch N doesn't exist"), and the query then ends "with a failure". The runner logs such a
failure, seen right after its own stop, as a WARNING and starts the query again from its
checkpoint, as after a driver crash: a failure that is real fails the restarted run too, and
``poll()`` raises it then. A failure while the runner did not stop the query is raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from snapcoord.client import BacklogStatus, CoordinatorClient, NotFound, SnapcoordError
from snapcoord.spark_connector.backlog.tracker import BacklogBound, BacklogTracker, LatestOffsets
from snapcoord.spark_connector.driver import DriverOnly, require_driver
from snapcoord.spark_connector.sources import OffsetParser, parse_offsets_log
from snapcoord.spark_connector.storage import Storage, open_location

_log = logging.getLogger(__name__)

#: ``start_query`` receives the trigger as keyword arguments for ``DataStreamWriter.trigger``.
StartQuery = Callable[[Mapping[str, Any]], StreamingQuery]


def last_batch_time_ms(checkpoint: Storage) -> int | None:
    """``batchTimestampMs`` of the newest offsets log entry; None when the query never ran."""
    batches = [int(e.name) for e in checkpoint.list("offsets") if e.name.isdigit() and not e.is_dir]
    for batch in sorted(batches, reverse=True):
        try:
            entry = checkpoint.read_bytes(f"offsets/{batch}").decode("utf-8")
        except FileNotFoundError:  # purged since the listing
            continue
        return parse_offsets_log(entry).batch_timestamp_ms
    return None


@dataclass(frozen=True)
class Switch:
    """One trigger switch: the phases, and how long stopping the old query took."""

    from_phase: str
    to_phase: str
    stop_s: float


class BacklogAwareRunner(DriverOnly):
    """``start_query(trigger_kwargs)`` must start the same query on the same checkpoint each time,
    e.g. ``lambda t: df.writeStream.trigger(**t).option("checkpointLocation", cp).start()``.

    ``bound``, ``latest_offsets``, ``stream_names`` and ``parsers`` configure the tracker
    (``backlog.BacklogTracker``). The downtime bound needs the time of the last batch: from
    ``checkpoint_location`` (any location Spark can use, reached through ``storage.open_location``
    with ``storage_options``) or ``last_batch_ms()``. ``switch_count`` counts switches
    in either direction; ``triggers`` lists the triggers the query was started with, in order.
    """

    def __init__(
        self,
        start_query: StartQuery,
        job_id: str,
        client: CoordinatorClient,
        catch_up_trigger: Mapping[str, Any],
        steady_trigger: Mapping[str, Any],
        *,
        bound: BacklogBound | None = None,
        latest_offsets: LatestOffsets | None = None,
        stream_names: Sequence[str | None] | None = None,
        parsers: Mapping[int, OffsetParser] | None = None,
        checkpoint_location: str | None = None,
        storage_options: dict[str, Any] | None = None,
        last_batch_ms: Callable[[], int | None] | None = None,
        poll_interval_s: float = 0.2,
        call_timeout_s: float = 2.0,
    ) -> None:
        require_driver("BacklogAwareRunner")
        self._start_query = start_query
        self.job_id = job_id
        self._client = client
        self.catch_up_trigger = dict(catch_up_trigger)
        self.steady_trigger = dict(steady_trigger)
        self.bound = bound or BacklogBound()
        self._latest_offsets = latest_offsets
        self._stream_names = stream_names
        self._parsers = parsers
        if last_batch_ms is None and checkpoint_location is not None:
            store = open_location(checkpoint_location, storage_options=storage_options)
            last_batch_ms = lambda: last_batch_time_ms(store)  # noqa: E731
        self._last_batch_ms = last_batch_ms
        self._poll_interval_s = poll_interval_s
        self._timeout_s = call_timeout_s
        self.query: StreamingQuery | None = None
        self.tracker: BacklogTracker | None = None
        self.phase = "new"  # new -> catch_up <-> steady, or stopped
        self.switches: list[Switch] = []
        self.triggers: list[dict[str, Any]] = []
        self.last_status: BacklogStatus | None = None
        self._batches_this_run = 0

    @property
    def switch_count(self) -> int:
        return len(self.switches)

    # -- coordinator ---------------------------------------------------------------------------------
    def backlog_status(self) -> BacklogStatus | None:
        """The job's status; None while it is not marked yet or the coordinator does not answer."""
        try:
            status = self._client.get_backlog_status(self.job_id, timeout_s=self._timeout_s)
        except NotFound:
            return None
        except SnapcoordError as e:
            _log.warning("backlog runner %s: get_backlog_status failed (%s); retrying", self.job_id, e.code)
            return None
        self.last_status = status
        return status

    @staticmethod
    def caught_up(status: BacklogStatus | None) -> bool:
        return status is not None and bool(status.partitions) and not status.processing_backlog

    def downtime_s(self) -> float | None:
        """Seconds since the query's last batch; None when unknown (no checkpoint yet)."""
        if self._last_batch_ms is None:
            return None
        last = self._last_batch_ms()
        return None if last is None else max(0.0, time.time() - last / 1000)

    # -- lifecycle -----------------------------------------------------------------------------------
    def _launch(self, trigger: dict[str, Any]) -> StreamingQuery:
        query = self._start_query(dict(trigger))
        self.triggers.append(dict(trigger))
        self.query = query
        self._batches_this_run = 0
        if self.tracker is None:
            self.tracker = BacklogTracker(
                self._client,
                self.job_id,
                query.name or self.job_id,
                bound=self.bound,
                latest_offsets=self._latest_offsets,
                stream_names=self._stream_names,
                parsers=self._parsers,
                call_timeout_s=self._timeout_s,
            )
        return query

    def start(self) -> StreamingQuery:
        """Start the query: with the catch-up trigger when the job is behind (never marked, not
        done, or down for longer than the bound), else with the steady trigger."""
        if self.phase != "new":
            raise RuntimeError(f"the runner of {self.job_id} was already started ({self.phase})")
        status = self.backlog_status()
        down = self.downtime_s()
        limit = self.bound.max_downtime_s
        long_down = limit is not None and down is not None and down > limit
        if self.caught_up(status) and not long_down:
            _log.info("backlog runner %s: caught up; starting with %s", self.job_id, self.steady_trigger)
            self.phase = "steady"
            return self._launch(self.steady_trigger)
        self.phase = "catch_up"
        query = self._launch(self.catch_up_trigger)
        assert self.tracker is not None
        if self.caught_up(status):  # and down for too long: backlog again from the next batch
            _log.info("backlog runner %s: down %.1f s (bound %s s): catching up", self.job_id, down, limit)
            self.tracker.request_backlog()
        _log.info("backlog runner %s: catching up with %s", self.job_id, self.catch_up_trigger)
        return query

    def _feed(self, query: StreamingQuery, *, stop_when_behind: bool) -> bool:
        """Give the tracker the query's progress it has not seen; True when one turned the flag on
        (with ``stop_when_behind``, the rest waits for the next call)."""
        assert self.tracker is not None
        progresses = query.recentProgress
        run_id = str(query.runId)
        # recentProgress belongs to this run; idle progress (no input) does not count as a batch.
        self._batches_this_run = sum(1 for p in progresses if str(p.runId) == run_id and p.numInputRows > 0)
        turned_on = False
        for progress in progresses:
            if self.tracker.observe(progress):
                turned_on = True
                if stop_when_behind:
                    break
        return turned_on

    def poll(self) -> bool:
        """One check: feed the tracker, deliver what is pending, switch when due. True when it
        switched."""
        if self.phase not in ("catch_up", "steady"):
            return False
        query = self.query
        tracker = self.tracker
        assert query is not None and tracker is not None
        active = query.isActive
        turned_on = self._feed(query, stop_when_behind=active)
        tracker.flush()
        self._raise_if_failed(query)
        if self.phase == "steady":
            if turned_on or tracker.processing_backlog:
                self._switch(query, "catch_up")
                return True
            if not active:
                raise RuntimeError(f"the steady query of {self.job_id} stopped")
            return False
        if active:
            if tracker.caught_up():
                self._switch(query, "steady")
                return True
            return False
        # The catch-up query ended by itself (AvailableNow): its last report must land first.
        if not tracker.flush():
            return False
        if tracker.caught_up() or self._batches_this_run == 0:
            if not tracker.caught_up():
                _log.warning(
                    "backlog runner %s: catch-up read nothing more but the coordinator still shows "
                    "backlog (%s); going steady",
                    self.job_id,
                    tracker.processing_backlog,
                )
            self._switch(query, "steady")
            return True
        _log.info("backlog runner %s: still behind after a catch-up run; catching up again", self.job_id)
        self._launch(self.catch_up_trigger)
        return False

    def _switch(self, query: StreamingQuery, to_phase: str) -> None:
        trigger = self.steady_trigger if to_phase == "steady" else self.catch_up_trigger
        _log.info("backlog runner %s: %s -> %s with %s", self.job_id, self.phase, to_phase, trigger)
        started = time.monotonic()
        query.stop()
        stopped = time.monotonic() - started
        self._log_failure_of_stop(query)
        self._feed(query, stop_when_behind=False)  # what the stopped run committed last
        if self.tracker is not None:
            self.tracker.flush()
        new = self._launch(trigger)
        if str(new.id) != str(query.id):
            new.stop()
            self.phase = "stopped"
            raise RuntimeError(
                f"start_query started query {new.id} instead of {query.id}: it must reuse the checkpoint"
            )
        self.switches.append(Switch(self.phase, to_phase, stopped))
        self.phase = to_phase

    @staticmethod
    def _raise_if_failed(query: StreamingQuery) -> None:
        error: StreamingQueryException | None = query.exception()
        if error is not None:
            raise error

    def _log_failure_of_stop(self, query: StreamingQuery) -> None:
        """A failure the query ended with as the runner stopped it (see the module docstring)."""
        error: StreamingQueryException | None = query.exception()
        if error is not None:
            first_line = next(iter(str(error).splitlines()), "") or type(error).__name__
            _log.warning(
                "backlog runner %s: the query ended with a failure as the switch stopped it; "
                "starting it again from its checkpoint (a failure that persists fails that run): %s",
                self.job_id,
                first_line,
            )

    def await_phase(self, phase: str, timeout_s: float) -> StreamingQuery:
        """Poll until the runner is in ``phase`` ("steady" or "catch_up"); ``TimeoutError`` after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.phase != phase:
            if self.phase not in ("catch_up", "steady"):
                raise RuntimeError(f"the runner of {self.job_id} is {self.phase}")
            if self.poll():
                continue
            if time.monotonic() >= deadline:
                active = self.query is not None and self.query.isActive
                flag = self.tracker.processing_backlog if self.tracker else None
                raise TimeoutError(
                    f"{self.job_id} not {phase} after {timeout_s}s (phase {self.phase}, "
                    f"processing backlog: {flag}, query active: {active})"
                )
            time.sleep(self._poll_interval_s)
        assert self.query is not None
        return self.query

    def await_steady(self, timeout_s: float) -> StreamingQuery:
        """Poll until the query runs with the steady trigger; ``TimeoutError`` after ``timeout_s``."""
        return self.await_phase("steady", timeout_s)

    def run(self, timeout_s: float) -> StreamingQuery:
        """``start()`` then ``await_steady(timeout_s)``: the running steady query."""
        self.start()
        return self.await_steady(timeout_s)

    def stop(self) -> None:
        """Stop the query, after delivering what it committed last."""
        query = self.query
        if query is not None and self.phase in ("catch_up", "steady"):
            query.stop()
            if self.tracker is not None:
                self._feed(query, stop_when_behind=False)
                self.tracker.flush()
        self.phase = "stopped"
