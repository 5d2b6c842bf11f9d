"""Savepoints for Spark: app snapshots that own a restorable copy of each query's checkpoint
(``app_snapshots``, cut and streamed by ``checkpoint_archive``), restore from them (``restore``, into
a target directory claimed by ``restore_target``), and the same for Spark's built-in file sink
(``spark_file_sink``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcoord.spark_connector._exports import lazy

if TYPE_CHECKING:
    from snapcoord.spark_connector.savepoints.app_snapshots import (
        SnapshotConflict as SnapshotConflict,
    )
    from snapcoord.spark_connector.savepoints.app_snapshots import (
        SnapshotNotCompleted as SnapshotNotCompleted,
    )
    from snapcoord.spark_connector.savepoints.app_snapshots import (
        SnapshotQuery as SnapshotQuery,
    )
    from snapcoord.spark_connector.savepoints.app_snapshots import (
        take_snapshot as take_snapshot,
    )
    from snapcoord.spark_connector.savepoints.checkpoint_archive import (
        CheckpointNotReady as CheckpointNotReady,
    )
    from snapcoord.spark_connector.savepoints.restore import (
        RestoredQuery as RestoredQuery,
    )
    from snapcoord.spark_connector.savepoints.restore import (
        RestoreTarget as RestoreTarget,
    )
    from snapcoord.spark_connector.savepoints.restore import (
        SnapshotUnavailable as SnapshotUnavailable,
    )
    from snapcoord.spark_connector.savepoints.restore import (
        restore_snapshot as restore_snapshot,
    )
    from snapcoord.spark_connector.savepoints.spark_file_sink import (
        SparkFileSink as SparkFileSink,
    )

_EXPORTS = {
    "take_snapshot": "app_snapshots",
    "SnapshotQuery": "app_snapshots",
    "SnapshotNotCompleted": "app_snapshots",
    "SnapshotConflict": "app_snapshots",
    "CheckpointNotReady": "checkpoint_archive",
    "restore_snapshot": "restore",
    "RestoreTarget": "restore",
    "RestoredQuery": "restore",
    "SnapshotUnavailable": "restore",
    "SparkFileSink": "spark_file_sink",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
