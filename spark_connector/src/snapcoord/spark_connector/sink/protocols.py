"""The sink protocols of the exactly-once wrapper: what ``exactly_once``, snapshots and restores need.

A sink that cannot write transactionally can still be made exactly-once by ``exactly_once`` if it can
say where its output ends (``positions()``) and cut everything written after such a point
(``rollback_to(positions)``). Sinks that can also *fence* (``FencedSink``: shut out every write of an
older run once a newer run started) are safe against zombie drivers too; ``RestorableSink`` adds what a
snapshot records and a restore puts back. All of it runs on the Spark driver; the data itself is written
by executors. ``PartitionedFileSink`` (``partitioned``) implements all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from snapcoord.client import CoordinatorClient, Offset


class RestoreRefused(RuntimeError):
    """The sink no longer holds the output a snapshot recorded below its cut (another restore cut it
    back further since): restoring it would lose output silently, so nothing was cut."""


@runtime_checkable
class RollbackSink(Protocol):
    """What ``exactly_once`` needs from a sink. Both methods run on the driver.

    - ``positions()``: where the sink's output ends right now, as a non-empty list of
      ``Offset(stream, partition, offset)`` (stream: an identifier of ``[A-Za-z0-9._:-]`` not starting
      with ``_eo:``; each (stream, partition) once; offset >= -1).
    - ``rollback_to(positions)``: delete (or truncate, or mark invalid) what the attempt that took
      ``positions`` wrote after them. Must be idempotent and must tolerate a half-finished earlier
      write or rollback.
    """

    def positions(self) -> Sequence[Offset]: ...

    def rollback_to(self, positions: Sequence[Offset]) -> None: ...


@runtime_checkable
class FencedSink(RollbackSink, Protocol):
    """A ``RollbackSink`` that can shut out the writes of older runs (zombie drivers).

    - ``max_epoch()``: the highest epoch fenced so far (0 when none); durable.
    - ``fence(epoch)``: from now on, writes of any lower epoch are invisible (also those committed
      after this call by a driver that checked just before it), and this sink object writes as
      ``epoch``. Raises ``Fenced`` when a higher epoch already fenced. A lower epoch's write that
      a fence hides must raise, never return: Spark would record its batch as committed.
    - ``check_epoch()``: raise ``Fenced`` when a higher epoch than this object's fenced the sink.
    """

    def max_epoch(self) -> int: ...

    def fence(self, epoch: int) -> None: ...

    def check_epoch(self) -> None: ...


@runtime_checkable
class CoordinatedSink(Protocol):
    """A sink that may need the coordinator as its commit point (where its store cannot give one):
    ``exactly_once`` hands it its client (``use_coordinator``) before it fences."""

    def use_coordinator(self, client: CoordinatorClient) -> None: ...


@runtime_checkable
class RestorableSink(FencedSink, Protocol):
    """A ``FencedSink`` that a snapshot can record and a restore can put back (``app_snapshots``).

    - ``batch_end_positions(batch_id)``: the positions right after the (visible) output of
      ``batch_id`` written by the run that wrote the sink's newest output (never a batch of the same
      id that a reset checkpoint's earlier run wrote). Raises ``LookupError`` when that run has no
      visible output of that batch.
    - ``last_batch_id()``: the batch id of the newest visible output (None when empty): how far a
      downstream reader may have read.
    - ``restore_to(positions)``: make the content exactly what it was at ``positions``: remove every
      write at or after them, of any run up to the caller's epoch, and never anything before them.
      The caller holds the newest epoch (``fence``); it never touches a newer epoch's writes and
      raises ``Fenced`` when a newer epoch fenced before or while it cut. When the sink no longer
      holds what ``positions`` recorded below them (the output they name was cut by another
      restore since), it must raise before removing anything instead of cutting.
    """

    def batch_end_positions(self, batch_id: int) -> Sequence[Offset]: ...

    def last_batch_id(self) -> int | None: ...

    def restore_to(self, positions: Sequence[Offset]) -> None: ...


@runtime_checkable
class RestoreCheckedSink(RestorableSink, Protocol):
    """A ``RestorableSink`` that can tell, before any fence or cut, whether ``restore_to(positions)``
    would refuse: ``check_restore(positions)`` raises then (``RestoreRefused`` or ``ValueError``) and
    changes nothing. ``restore_snapshot`` runs it for every sink of the restore before it cuts the
    first one, so a refusal leaves every sink as it was."""

    def check_restore(self, positions: Sequence[Offset]) -> None: ...
