"""The coordinator's worst-case memory, derived from its settings: the one statement of the formula.

Per process::

    receive limit   R = --max-inline-payload + MESSAGE_ENVELOPE_BYTES
    message hold    H = MESSAGE_COPIES x R
    control pool    C = CONTROL_RECEIVES x H
    unread          U = --max-concurrent-rpcs x RECEIVE_WINDOW_BYTES
    worst case        = BASE_BYTES + --payload-budget + C + U

What each term holds:

- ``--payload-budget``: every payload in memory. A ReportTaskSnapshot holds H from it before gRPC
  receives its message and then its message's copies until it returns (``admission``); an
  UploadCheckpoint holds its store's part buffer and H (one message may be R) for the whole
  stream; GetSnapshot and ReadCheckpoint hold the payload bytes they read.
- C: the request messages of every other method, held the same way from a pool of their own
  (a few receipts at once; a small message gives back all but its copies as soon as it is in),
  or, when the pool is taken, from the payload budget if it has room then (``admission``).
- U: a call not yet admitted has at most the stream's receive window buffered by gRPC, and at
  most ``--max-concurrent-rpcs`` calls are in flight.
- ``BASE_BYTES``: the process itself (measured idle: about 75 MiB), its handler threads, caches
  and the responses being written.

``--processes N`` runs N such processes. ``check_memory_bounds`` refuses a configuration where no
request message at the receive limit could ever be admitted; ``snapcoord check-config`` prints
these values; docs/operations/memory.md explains how to size a pod from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapcoord.coordinator.config.settings import Config, ConfigError
from snapcoord.coordinator.kernel.payload_admission import (
    MESSAGE_COPIES,
    MESSAGE_ENVELOPE_BYTES,
    MiB,
    message_hold,
    receive_limit,
)

#: What one client stream may have in flight towards the server beyond what its handler took
#: (gRPC's per-stream receive window; BDP probing, which would grow it, is off).
RECEIVE_WINDOW_BYTES = 4 * MiB
#: Messages of the non-payload methods that may be received at once (the control pool's size in
#: message holds).
CONTROL_RECEIVES = 2
#: The process beside the terms above: interpreter, libraries, threads, caches, responses.
BASE_BYTES = 128 * MiB


@dataclass(frozen=True)
class MemoryBounds:
    """The derived sizes of one coordinator process, and of all its processes."""

    max_inline_payload_bytes: int
    receive_limit_bytes: int
    message_hold_bytes: int
    payload_budget_bytes: int
    control_pool_bytes: int
    unread_bytes: int
    base_bytes: int
    processes: int

    @property
    def headroom_bytes(self) -> int:
        """What a process may use beside its payload budget."""
        return self.base_bytes + self.control_pool_bytes + self.unread_bytes

    @property
    def worst_case_bytes(self) -> int:
        """The most one process may hold."""
        return self.payload_budget_bytes + self.headroom_bytes

    @property
    def total_worst_case_bytes(self) -> int:
        """The most all ``processes`` together may hold (a pod's memory limit must cover it)."""
        return self.processes * self.worst_case_bytes

    def lines(self) -> tuple[str, ...]:
        """``name  value`` lines for ``check-config``, in MiB where that is exact enough."""
        rows = (
            ("receive limit (--max-inline-payload + envelope)", self.receive_limit_bytes),
            (f"message hold ({MESSAGE_COPIES} x receive limit)", self.message_hold_bytes),
            ("payload budget (--payload-budget)", self.payload_budget_bytes),
            (f"control pool ({CONTROL_RECEIVES} x message hold)", self.control_pool_bytes),
            ("unread windows (--max-concurrent-rpcs x 4 MiB)", self.unread_bytes),
            ("base", self.base_bytes),
            ("headroom (base + control pool + unread windows)", self.headroom_bytes),
            ("worst case per process (payload budget + headroom)", self.worst_case_bytes),
            (f"worst case for {self.processes} process(es)", self.total_worst_case_bytes),
        )
        return tuple(f"{name}: {value} bytes ({value / MiB:.1f} MiB)" for name, value in rows)


def memory_bounds(config: Config, processes: int | None = None) -> MemoryBounds:
    """The bounds for ``config``; ``processes`` is the resolved count (``--processes`` when it is a
    number, else 1 unless given)."""
    cap = config.snapshots.max_report_bytes
    hold = message_hold(cap)
    count = processes if processes is not None else config.grpc.processes
    return MemoryBounds(
        max_inline_payload_bytes=cap,
        receive_limit_bytes=receive_limit(cap),
        message_hold_bytes=hold,
        payload_budget_bytes=config.grpc.payload_budget_bytes,
        control_pool_bytes=CONTROL_RECEIVES * hold,
        unread_bytes=config.grpc.max_concurrent_rpcs * RECEIVE_WINDOW_BYTES,
        base_bytes=BASE_BYTES,
        processes=count if isinstance(count, int) else 1,
    )


def check_memory_bounds(config: Config) -> None:
    """ConfigError when the payload budget cannot admit one request message at the receive limit
    (every report at the inline cap would be refused, whatever the load)."""
    bounds = memory_bounds(config)
    if bounds.payload_budget_bytes < bounds.message_hold_bytes:
        raise ConfigError(
            f"--payload-budget ({bounds.payload_budget_bytes} bytes) is less than one request message "
            f"at the receive limit held {MESSAGE_COPIES} times ({bounds.message_hold_bytes} bytes: "
            f"--max-inline-payload {bounds.max_inline_payload_bytes} + {MESSAGE_ENVELOPE_BYTES} envelope, "
            f"x {MESSAGE_COPIES}), so no report could be admitted: raise --payload-budget or lower "
            "--max-inline-payload"
        )
