"""Backlog for Spark: FLIP-309's processing-backlog signal of a query, kept on the coordinator
(``tracker``), fed from Spark's progress events (``listener``), and a runner that switches a query
between a catch-up trigger and a low-latency one on it (``runner``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcoord.spark_connector._exports import lazy

if TYPE_CHECKING:
    from snapcoord.spark_connector.backlog.listener import (
        SnapcoordListener as SnapcoordListener,
    )
    from snapcoord.spark_connector.backlog.runner import (
        BacklogAwareRunner as BacklogAwareRunner,
    )
    from snapcoord.spark_connector.backlog.runner import (
        Switch as Switch,
    )
    from snapcoord.spark_connector.backlog.tracker import (
        BacklogBound as BacklogBound,
    )
    from snapcoord.spark_connector.backlog.tracker import (
        BacklogTracker as BacklogTracker,
    )
    from snapcoord.spark_connector.backlog.tracker import (
        BatchOffsets as BatchOffsets,
    )

_EXPORTS = {
    "BacklogTracker": "tracker",
    "BacklogBound": "tracker",
    "BatchOffsets": "tracker",
    "SnapcoordListener": "listener",
    "BacklogAwareRunner": "runner",
    "Switch": "runner",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
