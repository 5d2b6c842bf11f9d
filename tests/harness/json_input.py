"""JSON-lines input files for streaming tests: file ``i`` holds ten records of ids ``i*10 .. i*10+9``.

A file source reads one file per batch with ``maxFilesPerTrigger=1``, so file ``i`` is the ``i``-th
batch; each is made visible by an atomic rename, so a listing never sees half a file. Records carry a
``bucket`` (``b0``/``b1``) to partition a table by.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

RECORDS_PER_FILE = 10


def publish(directory: Path, first: int, count: int = 1) -> None:
    """Input files ``first`` .. ``first+count-1`` in ``directory`` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        records = [{"id": i * RECORDS_PER_FILE + k, "bucket": f"b{k % 2}"} for k in range(RECORDS_PER_FILE)]
        tmp = directory.parent / f".{directory.name}-{i}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, directory / f"in-{i:03d}.json")


def file_count(directory: Path) -> int:
    return len(list(directory.glob("in-*.json")))


def ids_of(files: range) -> Counter[int]:
    """The ids of input files ``files``, each once."""
    return Counter(i * RECORDS_PER_FILE + k for i in files for k in range(RECORDS_PER_FILE))
