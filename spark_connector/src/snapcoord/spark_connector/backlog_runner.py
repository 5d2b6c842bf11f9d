"""Run a streaming query with a catch-up trigger until its backlog is done, then a low-latency one.

A trigger is fixed when a query starts, so switching means stopping the query and starting it
again on the same checkpoint. ``BacklogAwareRunner`` starts the query with ``catch_up_trigger``
(``{"availableNow": True}``, or a long ``processingTime`` with large batches), watches the job's
backlog status on the coordinator (reported by a ``SnapcoordListener`` with the same job id), and
when the coordinator says the backlog is done stops the query and starts it once more with
``steady_trigger``. A restarted driver whose job already caught up starts with the steady trigger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from snapcoord.client import BacklogStatus, CoordinatorClient, NotFound, SnapcoordError
from snapcoord.spark_connector.driver import DriverOnly, require_driver

_log = logging.getLogger(__name__)

#: ``start_query`` receives the trigger as keyword arguments for ``DataStreamWriter.trigger``.
StartQuery = Callable[[Mapping[str, Any]], StreamingQuery]


class BacklogAwareRunner(DriverOnly):
    """``start_query(trigger_kwargs)`` must start the same query on the same checkpoint each time,
    e.g. ``lambda t: df.writeStream.trigger(**t).option("checkpointLocation", cp).start()``.

    ``switch_count`` counts catch-up -> steady switches (at most one per runner); ``triggers`` lists
    the triggers the query was started with, in order.
    """

    def __init__(
        self,
        start_query: StartQuery,
        job_id: str,
        client: CoordinatorClient,
        catch_up_trigger: Mapping[str, Any],
        steady_trigger: Mapping[str, Any],
        *,
        poll_interval_s: float = 0.2,
        call_timeout_s: float = 2.0,
    ) -> None:
        require_driver("BacklogAwareRunner")
        self._start_query = start_query
        self.job_id = job_id
        self._client = client
        self.catch_up_trigger = dict(catch_up_trigger)
        self.steady_trigger = dict(steady_trigger)
        self._poll_interval_s = poll_interval_s
        self._timeout_s = call_timeout_s
        self.query: StreamingQuery | None = None
        self.phase = "new"  # new -> catch_up -> steady, or stopped
        self.switch_count = 0
        self.triggers: list[dict[str, Any]] = []
        self.last_status: BacklogStatus | None = None

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

    # -- lifecycle -----------------------------------------------------------------------------------
    def _launch(self, trigger: dict[str, Any]) -> StreamingQuery:
        query = self._start_query(dict(trigger))
        self.triggers.append(dict(trigger))
        self.query = query
        return query

    def start(self) -> StreamingQuery:
        """Start the query: with the steady trigger if the job already caught up (a restarted
        driver), else with the catch-up trigger."""
        if self.phase != "new":
            raise RuntimeError(f"the runner of {self.job_id} was already started ({self.phase})")
        if self.caught_up(self.backlog_status()):
            _log.info(
                "backlog runner %s: backlog already done; starting with %s", self.job_id, self.steady_trigger
            )
            self.phase = "steady"
            return self._launch(self.steady_trigger)
        self.phase = "catch_up"
        _log.info("backlog runner %s: catching up with %s", self.job_id, self.catch_up_trigger)
        return self._launch(self.catch_up_trigger)

    def poll(self) -> bool:
        """One check while catching up; switches when the backlog is done. True when it switched."""
        if self.phase != "catch_up":
            return False
        query = self.query
        assert query is not None
        self._raise_if_failed(query)
        if not self.caught_up(self.backlog_status()):
            return False
        self._switch(query)
        return True

    def _switch(self, query: StreamingQuery) -> None:
        _log.info("backlog runner %s: backlog done; restarting with %s", self.job_id, self.steady_trigger)
        query.stop()
        self._raise_if_failed(query)
        steady = self._launch(self.steady_trigger)
        if str(steady.id) != str(query.id):
            steady.stop()
            self.phase = "stopped"
            raise RuntimeError(
                f"start_query started query {steady.id} instead of {query.id}: it must reuse the checkpoint"
            )
        self.phase = "steady"
        self.switch_count += 1

    @staticmethod
    def _raise_if_failed(query: StreamingQuery) -> None:
        error: StreamingQueryException | None = query.exception()
        if error is not None:
            raise error

    def await_steady(self, timeout_s: float) -> StreamingQuery:
        """Poll until the query runs with the steady trigger; ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.phase == "catch_up":
            if self.poll():
                break
            if time.monotonic() >= deadline:
                active = self.query is not None and self.query.isActive
                raise TimeoutError(
                    f"backlog of {self.job_id} not done after {timeout_s}s "
                    f"(status {self.last_status}; catch-up query active: {active})"
                )
            time.sleep(self._poll_interval_s)
        if self.phase != "steady" or self.query is None:
            raise RuntimeError(f"the runner of {self.job_id} is {self.phase}")
        return self.query

    def run(self, timeout_s: float) -> StreamingQuery:
        """``start()`` then ``await_steady(timeout_s)``: the running steady query."""
        self.start()
        return self.await_steady(timeout_s)

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
        self.phase = "stopped"
