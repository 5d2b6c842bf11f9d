"""``OneFileSink``: the exactly-once sink's driver-side code on any ``Storage``, without Spark.

A ``PartitionedFileSink`` partitioned by ``p`` whose batch is one small part file in partition
``p=0``, written by the driver through the table's storage (what Spark's executors write otherwise)
and named after its writer. Everything else (fences, commit claims, log entries, rollbacks) is the
sink's own code, so tests of the commit protocol run on a real store without a Spark query.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

from snapcoord.spark_connector.sink import PartitionedFileSink
from snapcoord.spark_connector.sink.commit_log import FileLine
from snapcoord.spark_connector.storage import Storage, join

#: The one partition every batch writes (a partitioned table: Spark's reader of an unpartitioned one
#: reads only the files directly in it, never those in the sink's write directories).
PARTITION = "p=0"


def part_file_name(writer: str) -> str:
    return f"part-00000-{writer}.json"


class OneFileSink(PartitionedFileSink):
    """See the module docstring; ``kwargs`` go to ``PartitionedFileSink`` (``coordinator=``...)."""

    def __init__(self, storage: Storage, writer: str, **kwargs: Any) -> None:
        self._own_storage = storage
        self.writer = writer
        super().__init__(storage.location, name="race", partition_by=["p"], **kwargs)

    @property
    def storage(self) -> Storage:
        return self._own_storage

    def part_file_step(self) -> AbstractContextManager[None]:
        """Around the part file's write; subclasses may make it one step of a race."""
        return contextlib.nullcontext()

    def _write_files(self, df: Any, write_dir: str) -> list[FileLine]:
        path = join(PARTITION, f"{write_dir}-p0", part_file_name(self.writer))
        data = bytes(df)
        with self.part_file_step():
            self.storage.write_bytes(path, data)
        return [FileLine(path, len(data), 0)]
