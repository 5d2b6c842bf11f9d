"""The exactly-once sink: ``exactly_once`` (``writer``), the record of an attempt that may roll a sink
back (``attempts``), per-run fencing tokens (``epochs``), the coordinator as the commit point where a
store has none (``claims``), the sink protocols (``protocols``) and the file table that implements
them (``partitioned``) with its commit log (``commit_log``) in the format of Spark's file sink log
(``spark_sink_log``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcoord.spark_connector._exports import lazy

if TYPE_CHECKING:
    from snapcoord.spark_connector.sink.claims import (
        CoordinatorRequired as CoordinatorRequired,
    )
    from snapcoord.spark_connector.sink.epochs import (
        Fenced as Fenced,
    )
    from snapcoord.spark_connector.sink.partitioned import (
        LegacyTable as LegacyTable,
    )
    from snapcoord.spark_connector.sink.partitioned import (
        PartitionedFileSink as PartitionedFileSink,
    )
    from snapcoord.spark_connector.sink.protocols import (
        FencedSink as FencedSink,
    )
    from snapcoord.spark_connector.sink.protocols import (
        RestorableSink as RestorableSink,
    )
    from snapcoord.spark_connector.sink.protocols import (
        RestoreCheckedSink as RestoreCheckedSink,
    )
    from snapcoord.spark_connector.sink.protocols import (
        RestoreRefused as RestoreRefused,
    )
    from snapcoord.spark_connector.sink.protocols import (
        RollbackSink as RollbackSink,
    )
    from snapcoord.spark_connector.sink.writer import (
        ExactlyOnceWriter as ExactlyOnceWriter,
    )
    from snapcoord.spark_connector.sink.writer import (
        exactly_once as exactly_once,
    )

_EXPORTS = {
    "exactly_once": "writer",
    "ExactlyOnceWriter": "writer",
    "Fenced": "epochs",
    "CoordinatorRequired": "claims",
    "PartitionedFileSink": "partitioned",
    "LegacyTable": "partitioned",
    "RollbackSink": "protocols",
    "FencedSink": "protocols",
    "RestorableSink": "protocols",
    "RestoreCheckedSink": "protocols",
    "RestoreRefused": "protocols",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
