"""A streaming source whose partitions grow, as a Kafka topic's do: a Python Data Source (Spark 4's
own API, run by Spark's Python workers) over a directory.

Each subdirectory ``p<N>`` of ``path`` is partition N; its files ``000000.json``, ``000001.json``...
are its records, one JSON object per line, and its offset is the number of files read. A partition
appears when its directory does (publish it whole: write it under another name, then rename it).
Offsets are Kafka-shaped, ``{"<topic>": {"0": 3, "1": 5}}``, so the connector reads them as it reads
Kafka's (``<stream>:<topic>``, partition, offset). Like Kafka, the source has admission control
(option ``maxFilesPerTrigger``: at most that many files per partition per batch) and reports its
latest offsets in each progress (``latestOffset``), so a partition can be behind them; it supports
``Trigger.AvailableNow``.

The module is pickled by value into Spark's workers (``register``): they need not import it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

NAME = "snapcoord_growing"
SCHEMA = "partition INT, file INT, id BIGINT"


def file_counts(path: str) -> dict[str, int]:
    """Partition (as Kafka names it, a decimal string) -> files it holds now."""
    counts: dict[str, int] = {}
    for name in sorted(os.listdir(path)):
        if name.startswith("p") and name[1:].isdigit():
            files = os.listdir(os.path.join(path, name))
            counts[str(int(name[1:]))] = sum(1 for f in files if f.endswith(".json"))
    return counts


class FilesOfPartition(InputPartition):
    def __init__(self, path: str, partition: str, start: int, end: int) -> None:
        self.path, self.partition, self.start, self.end = path, partition, start, end


class GrowingReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.path = options["path"]
        self.topic = options.get("topic", "t")
        self.max_files = int(options.get("maxFilesPerTrigger", "0"))
        self.target: dict[str, int] | None = None  # AvailableNow: the offsets to stop at

    def initialOffset(self) -> dict[str, Any]:
        return {self.topic: {}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = file_counts(self.path)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        available = file_counts(self.path) if self.target is None else self.target
        at: dict[str, int] = start.get(self.topic, {})
        if isinstance(limit, ReadMaxFiles):
            available = {p: min(n, at.get(p, 0) + limit.max_files) for p, n in available.items()}
        return {self.topic: {p: max(n, at.get(p, 0)) for p, n in available.items()}}

    def reportLatestOffset(self) -> dict[str, Any]:
        return {self.topic: file_counts(self.path)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        since: dict[str, int] = start.get(self.topic, {})
        return [
            FilesOfPartition(self.path, p, since.get(p, 0), n)
            for p, n in end[self.topic].items()
            if n > since.get(p, 0)
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, int]]:
        assert isinstance(partition, FilesOfPartition)
        for i in range(partition.start, partition.end):
            name = os.path.join(partition.path, f"p{partition.partition}", f"{i:06d}.json")
            with open(name) as f:
                for line in f:
                    yield int(partition.partition), i, int(json.loads(line)["id"])

    def commit(self, end: dict[str, Any]) -> None:
        pass


class GrowingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GrowingReader(self.options)


def register(spark: SparkSession) -> None:
    """Make ``format(NAME)`` available to ``spark``; this module goes to the workers by value."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    spark.dataSource.register(GrowingSource)


def publish_partition(path: str, partition: int, records: Sequence[Sequence[int]]) -> None:
    """Partition ``partition`` appears with one file per entry of ``records`` (the ids in it), all
    at once: written under a hidden name, then renamed into place."""
    staging = os.path.join(path, f".p{partition}")
    os.makedirs(staging)
    for i, ids in enumerate(records):
        with open(os.path.join(staging, f"{i:06d}.json"), "w") as f:
            f.writelines(json.dumps({"id": n}) + "\n" for n in ids)
    os.rename(staging, os.path.join(path, f"p{partition}"))
