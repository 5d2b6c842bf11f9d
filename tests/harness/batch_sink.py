"""A ``foreachBatch`` sink for tests that switch or restart queries: it keeps each batch's ids."""

from __future__ import annotations

import threading

from pyspark.sql import DataFrame


class Sink:
    """Idempotent per batch, as a foreachBatch sink must be: a batch interrupted by a switch and
    run again replaces what it wrote."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, list[int]] = {}

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [int(r["id"]) for r in df.collect()]
        with self._lock:
            self._batches[batch_id] = rows

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(i for rows in self._batches.values() for i in rows)
