"""Corrupt records met on the way: located, logged and counted, so that one stops only itself.

Decoders raise ``CorruptRecord`` for bytes they cannot read; the code that read them knows where
they came from. ``locate`` names the node among several read together, ``at`` wraps a read of
one known path, and ``skipped`` is what a janitor pass or a list call does with one: a WARNING
naming the path and ``snapcoord_corrupt_records_total{kind}``, then on with the rest. A record of a
newer format (``NewerFormat``) is skipped the same way but logged as what it is, and not counted:
that counter's alert asks for a repair, and a record a newer release wrote needs none.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from snapcoord.coordinator.errors import CorruptRecord, NewerFormat

if TYPE_CHECKING:
    from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
    from snapcoord.coordinator.storage.metadata import Node

_log = logging.getLogger(__name__)


def locate(error: CorruptRecord, nodes: Mapping[str, Node | None]) -> CorruptRecord:
    """``error`` at the path of the one node in ``nodes`` holding its bytes (unchanged when it
    names a path already, or when no node or several hold them)."""
    if error.path:
        return error
    paths = [p for p, node in nodes.items() if node is not None and node.data == error.data]
    return error.at(paths[0]) if len(paths) == 1 else error


@contextlib.contextmanager
def at(path: str) -> Iterator[None]:
    """Decoding in the block reads the record at ``path``: a ``CorruptRecord`` names it."""
    try:
        yield
    except CorruptRecord as e:
        raise e.at(path) from e.__cause__


def skipped(metrics: CoordinatorMetrics, error: CorruptRecord, by: str, path: str = "") -> None:
    """Log (WARNING, no traceback: the record is at fault, not the code) and count a corrupt
    record that ``by`` (a janitor step, a list call) skips and goes on past."""
    located = error.at(path) if path else error
    if isinstance(located, NewerFormat):
        _log.warning(
            "%s: skipping the %s at %s, written by a newer release (format version %d; this one reads %d): "
            "upgrade this replica",
            by,
            located.kind,
            located.path or "an unknown path",
            located.version,
            located.supported,
        )
        return
    metrics.corrupt_records.labels(located.kind).inc()
    _log.warning(
        "%s: skipping the corrupt %s at %s (docs/operations/corruption.md says how to repair it): %s",
        by,
        located.kind,
        located.path or "an unknown path",
        located.detail,
    )
