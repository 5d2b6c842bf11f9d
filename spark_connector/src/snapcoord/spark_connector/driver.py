"""Guards that keep coordinator access on the Spark driver.

gRPC channels do not survive fork or pickling, and a coordinator hammered by every executor
would be a scaling bug, so connector objects refuse to travel into tasks and refuse to run there.

Spark Connect moves "the driver": the user's process is a thin client, and ``foreachBatch``
functions (and, from a PySpark 3.5 client, ``StreamingQueryListener`` objects; PySpark >= 4 runs
listeners in the client) are pickled to the Connect server and run in a Python worker next to its
driver JVM, outside any task. Objects that can rebuild their connection
from configuration (``ExactlyOnceWriter`` given an address or a factory) override ``__reduce__`` to
pickle as that configuration; ``require_driver`` still stops them inside a task.
"""

from __future__ import annotations

from typing import NoReturn


class ExecutorContextError(RuntimeError):
    """A driver-only snapcoord object was used (or shipped) inside a Spark task."""


def _in_spark_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:  # no pyspark at all: certainly not inside a task
        return False
    return TaskContext.get() is not None


def require_driver(what: str) -> None:
    """Raise ``ExecutorContextError`` when called from inside a Spark task (an executor)."""
    if _in_spark_task():
        raise ExecutorContextError(
            f"{what} must run on the Spark driver; snapcoord is never called from executors "
            "(call it in foreachBatch or a StreamingQueryListener, not inside a UDF or mapPartitions)"
        )


class DriverOnly:
    """Mixin for objects that hold a coordinator connection: pickling them fails loudly.

    Spark pickles closures to ship them to executors; a connector object captured by accident
    would otherwise arrive there half-initialised. Failing at pickle time names the culprit.
    """

    def __reduce__(self) -> NoReturn:
        raise ExecutorContextError(
            f"{type(self).__name__} holds a coordinator connection and cannot be pickled into a "
            "Spark task: use it on the driver only (do not capture it in a UDF or RDD function; "
            "under Spark Connect it cannot be sent to the server either)"
        )
