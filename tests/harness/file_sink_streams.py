"""Streaming queries that write with Spark's built-in file sink, for the connector's tests: input files
read one per batch, oldest first, so batch ``i`` holds exactly input file ``i``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The schema of the input files: one unique ``id`` per row.
SCHEMA = "id INT"


def publish_inputs(source: Path, files: range, rows: int) -> None:
    """Input file ``i`` holds ids ``rows * i .. rows * i + rows - 1``. Each appears whole (a rename)
    with modification time ``base + i``: Spark's file source reads the oldest file first."""
    source.mkdir(parents=True, exist_ok=True)
    for i in files:
        path = source / f"in-{i:04d}.json"
        tmp = source.parent / f".{source.name}-{path.name}.tmp"
        tmp.write_text("".join(json.dumps({"id": i * rows + j}) + "\n" for j in range(rows)))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))
        os.replace(tmp, path)


def run_file_sink(
    spark: Any, source: Path | Callable[[Any], Any], checkpoint: str | Path, table: str | Path, fmt: str
) -> None:
    """One ``availableNow`` run of Spark's file sink (``format(fmt).option("path", table)``) over
    every input file the checkpoint has not read, one file per batch (or over ``source(spark)``, a
    streaming DataFrame of ``SCHEMA``); fails on the query's error."""
    if callable(source):
        df = source(spark)
    else:
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    query = (
        df.writeStream.format(fmt)
        .option("path", str(table))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise AssertionError(f"the file sink query failed: {query.exception()}")
