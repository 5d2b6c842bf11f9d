"""Driver-side PySpark connector for snapcoord.

Executors never talk to the coordinator: every call goes through the thin client from the Spark
driver process. This package depends on ``snapcoord-client`` (and the driver's own ``pyspark``)
only, never on the coordinator.

Modules: ``exactly_once`` (exactly-once foreachBatch for sinks without transactions) with
``attempts`` (whose record may roll a sink back), ``epochs`` (per-run fencing tokens from the
coordinator), ``sinks`` (the sink protocol and ``PartitionedFileSink``) and ``commit_log`` (its
commit log, in the format of Spark's file sink), ``sources`` (the offsets of Spark's sources, one
stream per source),
``backlog`` (FLIP-309's processing-backlog signal of a query, kept on the coordinator),
``listener`` (that signal from Spark's progress events), ``app_snapshots`` (snapshot an app's
queries into copies the coordinator owns, with ``checkpoint_archive``), ``restore`` (checkpoints
and sinks back from such a snapshot) and ``backlog_runner`` (a catch-up trigger while a query
processes backlog, a low-latency one once caught up, and back). They import pyspark, so this
package root exports only the driver-only guards they are built on; import the pieces from their
modules.
"""

from __future__ import annotations

from snapcoord.spark_connector.driver import DriverOnly, ExecutorContextError, require_driver

__all__ = ["DriverOnly", "ExecutorContextError", "require_driver"]
