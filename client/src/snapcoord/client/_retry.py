"""Retries on UNAVAILABLE with exponential backoff and jitter, within one overall deadline.

Only idempotent RPCs are retried: a reply can be lost after the coordinator committed the call, so
a retry must be harmless when the first attempt took effect. The proto is the one source of truth:
each RPC's ``idempotency_level`` option (IDEMPOTENT, or NO_SIDE_EFFECTS for reads) puts it in
``IDEMPOTENT``, and the comment next to it in ``proto/snapcoord/v1`` says why it is safe (a
ReportProgress retry, for one, carries its report_id); an RPC without one is in ``NOT_RETRIED``
(UploadCheckpoint: the client retries it itself, only when it can send the payload again from its
start). Nothing else is retried: every other status
means the same request would fail again, or (DEADLINE_EXCEEDED) that the call's whole time budget
is spent.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf import descriptor_pb2

from snapcoord.client.errors import SnapcoordError, Unavailable
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2

T = TypeVar("T")

_log = logging.getLogger("snapcoord.client")

#: The least time worth starting another attempt with.
MIN_ATTEMPT_S = 0.05

_Level = descriptor_pb2.MethodOptions.IdempotencyLevel
#: The levels that make an RPC safe to send again.
RETRIED_LEVELS = frozenset({"IDEMPOTENT", "NO_SIDE_EFFECTS"})


def idempotency_levels() -> dict[str, str]:
    """RPC name -> its ``idempotency_level`` name, for every RPC of the five services.

    Keyed by the bare RPC name, as the client calls them; the names are unique across services.
    """
    levels: dict[str, str] = {}
    for module in (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.name in levels:
                    raise RuntimeError(f"RPC name {method.name} is not unique across the services")
                levels[method.name] = _Level.Name(method.GetOptions().idempotency_level)
    return levels


_LEVELS = idempotency_levels()
#: RPC name -> its idempotency level (IDEMPOTENT or NO_SIDE_EFFECTS): retried on UNAVAILABLE.
IDEMPOTENT: Mapping[str, str] = {rpc: level for rpc, level in _LEVELS.items() if level in RETRIED_LEVELS}
#: RPC name -> its idempotency level (IDEMPOTENCY_UNKNOWN): never retried.
NOT_RETRIED: Mapping[str, str] = {rpc: level for rpc, level in _LEVELS.items() if level not in RETRIED_LEVELS}


def is_idempotent(method: str) -> bool:
    return method in IDEMPOTENT


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff between attempts of an idempotent call that failed with UNAVAILABLE.

    The n-th wait is ``min(max_backoff_s, initial_backoff_s * multiplier**n)``, shortened by up to
    ``jitter`` of itself at random so that many drivers that lost the coordinator together do not
    come back in lockstep. Attempts stop at the call's deadline (its ``timeout_s``) or after
    ``max_attempts`` (None = until the deadline; 1 = never retry).
    """

    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ValueError(f"invalid backoff: {self}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def backoff_s(self, retry: int) -> float:
        """How long to wait before retry number ``retry`` (0-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**retry)
        # The random module reseeds itself in a forked child, so forked workers do not share jitter.
        return base * (1 - self.jitter * random.random())


def call_with_retry(
    attempt: Callable[[float], T],
    *,
    method: str,
    policy: RetryPolicy,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    retryable: bool | None = None,
) -> T:
    """Run ``attempt(remaining_s)`` until it returns, retrying ``Unavailable`` for idempotent methods.

    Each attempt gets the time left until the overall deadline as its own gRPC timeout, so the
    whole call, retries and waits included, ends within ``timeout_s``. When the next wait would
    leave less than ``MIN_ATTEMPT_S`` the last ``Unavailable`` is raised, with ``attempts`` set.
    ``retryable`` overrides the method's idempotency (a call that is safe to repeat as made, e.g.
    an upload whose payload can be sent again from its start).
    """
    deadline = clock() + timeout_s
    retryable = is_idempotent(method) if retryable is None else retryable
    attempts = 0
    while True:
        attempts += 1
        try:
            return attempt(max(0.0, deadline - clock()))
        except SnapcoordError as e:
            e.attempts = attempts
            if (
                not isinstance(e, Unavailable)
                or not retryable
                or (policy.max_attempts is not None and attempts >= policy.max_attempts)
            ):
                raise
            delay = policy.backoff_s(attempts - 1)
            if clock() + delay + MIN_ATTEMPT_S >= deadline:
                raise  # an attempt with almost no time left would only turn this into DEADLINE_EXCEEDED
            _log.debug("%s: UNAVAILABLE (%s); retry %d in %.2fs", method, e.details, attempts, delay)
            sleep(delay)
