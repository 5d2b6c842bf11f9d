"""Driver-side PySpark connector for snapcoord.

Executors never talk to the coordinator: every call goes through the thin client from the Spark
driver process. This package depends on ``snapcoord-client`` (and the driver's own ``pyspark``)
only, never on the coordinator.

Available now: the driver-only guards every connector piece is built on. The exactly-once
foreachBatch wrapper, the snapshot listener and the backlog-aware runner follow (issue 7).
"""

from __future__ import annotations

from snapcoord.spark_connector.driver import DriverOnly, ExecutorContextError, require_driver

__all__ = ["DriverOnly", "ExecutorContextError", "require_driver"]
