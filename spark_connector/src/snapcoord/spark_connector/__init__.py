"""Driver-side PySpark connector for snapcoord.

Executors never talk to the coordinator: every call goes through the thin client from the Spark
driver process. This package depends on ``snapcoord-client`` (and the driver's own ``pyspark``)
only, never on the coordinator.

Its parts, one package each:

- ``sink``: the exactly-once ``foreachBatch`` (``exactly_once``) for sinks without transactions, the
  sink protocols, and ``PartitionedFileSink``, a file table with Spark's file-sink log as its commit log;
- ``savepoints``: app snapshots that own a restorable copy of each query's checkpoint
  (``take_snapshot``), ``restore_snapshot``, and ``SparkFileSink`` for Spark's built-in file sink;
- ``backlog``: FLIP-309's processing-backlog signal (``BacklogTracker``, ``SnapcoordListener``) and
  ``BacklogAwareRunner``, which switches a query between a catch-up and a low-latency trigger;
- ``storage``: checkpoints and tables at any URI (local, Hadoop's file systems, fsspec);
- ``sources``: the offsets of Spark's sources, one stream per source; ``driver``: the driver-only guards.

Every public name is importable from this package root (``from snapcoord.spark_connector import
exactly_once``). The modules behind most of them import pyspark, so they are loaded on first use: the
root itself imports only the driver guards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcoord.spark_connector._exports import lazy
from snapcoord.spark_connector.driver import DriverOnly, ExecutorContextError, require_driver

if TYPE_CHECKING:
    from snapcoord.spark_connector.backlog import (
        BacklogAwareRunner as BacklogAwareRunner,
    )
    from snapcoord.spark_connector.backlog import (
        BacklogBound as BacklogBound,
    )
    from snapcoord.spark_connector.backlog import (
        BacklogTracker as BacklogTracker,
    )
    from snapcoord.spark_connector.backlog import (
        BatchOffsets as BatchOffsets,
    )
    from snapcoord.spark_connector.backlog import (
        SnapcoordListener as SnapcoordListener,
    )
    from snapcoord.spark_connector.backlog import (
        Switch as Switch,
    )
    from snapcoord.spark_connector.savepoints import (
        CheckpointNotReady as CheckpointNotReady,
    )
    from snapcoord.spark_connector.savepoints import (
        RestoredQuery as RestoredQuery,
    )
    from snapcoord.spark_connector.savepoints import (
        RestoreTarget as RestoreTarget,
    )
    from snapcoord.spark_connector.savepoints import (
        SnapshotConflict as SnapshotConflict,
    )
    from snapcoord.spark_connector.savepoints import (
        SnapshotNotCompleted as SnapshotNotCompleted,
    )
    from snapcoord.spark_connector.savepoints import (
        SnapshotQuery as SnapshotQuery,
    )
    from snapcoord.spark_connector.savepoints import (
        SnapshotUnavailable as SnapshotUnavailable,
    )
    from snapcoord.spark_connector.savepoints import (
        SparkFileSink as SparkFileSink,
    )
    from snapcoord.spark_connector.savepoints import (
        restore_snapshot as restore_snapshot,
    )
    from snapcoord.spark_connector.savepoints import (
        take_snapshot as take_snapshot,
    )
    from snapcoord.spark_connector.sink import (
        CoordinatorRequired as CoordinatorRequired,
    )
    from snapcoord.spark_connector.sink import (
        ExactlyOnceWriter as ExactlyOnceWriter,
    )
    from snapcoord.spark_connector.sink import (
        Fenced as Fenced,
    )
    from snapcoord.spark_connector.sink import (
        FencedSink as FencedSink,
    )
    from snapcoord.spark_connector.sink import (
        LegacyTable as LegacyTable,
    )
    from snapcoord.spark_connector.sink import (
        PartitionedFileSink as PartitionedFileSink,
    )
    from snapcoord.spark_connector.sink import (
        RestorableSink as RestorableSink,
    )
    from snapcoord.spark_connector.sink import (
        RestoreCheckedSink as RestoreCheckedSink,
    )
    from snapcoord.spark_connector.sink import (
        RestoreRefused as RestoreRefused,
    )
    from snapcoord.spark_connector.sink import (
        RollbackSink as RollbackSink,
    )
    from snapcoord.spark_connector.sink import (
        exactly_once as exactly_once,
    )
    from snapcoord.spark_connector.sources import (
        UnknownOffsetFormat as UnknownOffsetFormat,
    )
    from snapcoord.spark_connector.sources import (
        register_parser as register_parser,
    )
    from snapcoord.spark_connector.sources import (
        unregister_parser as unregister_parser,
    )
    from snapcoord.spark_connector.storage import (
        LocalStorage as LocalStorage,
    )
    from snapcoord.spark_connector.storage import (
        Storage as Storage,
    )
    from snapcoord.spark_connector.storage import (
        UnsupportedLocation as UnsupportedLocation,
    )
    from snapcoord.spark_connector.storage import (
        open_location as open_location,
    )

_SINK = (
    "exactly_once ExactlyOnceWriter Fenced PartitionedFileSink LegacyTable RollbackSink FencedSink "
    "RestorableSink RestoreCheckedSink RestoreRefused CoordinatorRequired"
)
_SAVEPOINTS = (
    "take_snapshot SnapshotQuery SnapshotNotCompleted SnapshotConflict CheckpointNotReady "
    "restore_snapshot RestoreTarget RestoredQuery SnapshotUnavailable SparkFileSink"
)
_BACKLOG = "BacklogTracker BacklogBound BatchOffsets SnapcoordListener BacklogAwareRunner Switch"
_SOURCES = "register_parser unregister_parser UnknownOffsetFormat"
_STORAGE = "Storage LocalStorage open_location UnsupportedLocation"

_EXPORTS = {
    name: module
    for module, names in (
        ("sink", _SINK),
        ("savepoints", _SAVEPOINTS),
        ("backlog", _BACKLOG),
        ("sources", _SOURCES),
        ("storage", _STORAGE),
    )
    for name in names.split()
}
__all__ = ["DriverOnly", "ExecutorContextError", "require_driver", *_EXPORTS]
__getattr__, _dir_lazy = lazy(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted({*globals(), *_dir_lazy()})
