"""Whether grpc would refuse a new call now at ``--max-concurrent-rpcs``, for the refusal counter.

grpc refuses a call over the limit with RESOURCE_EXHAUSTED before any handler runs and tells no
one: no interceptor sees the status, so the call is in no ``grpc_server_*`` series. It does run
the interceptors of the new call first, under its server lock, and only then compares its count
of calls in flight with the limit. Reading that count at that moment gives grpc's own decision.
The count is internal to grpcio's server (``_state.active_rpc_count``, in every grpcio this
project supports); if a grpcio lacks it, the server still serves and says once that it cannot
count refusals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

_log = logging.getLogger(__name__)


def concurrency_limit_probe(server: grpc.Server) -> Callable[[], bool]:
    """A function telling whether ``server`` is at its concurrency limit (always False without one)."""
    state: Any = getattr(server, "_state", None)
    if not hasattr(state, "maximum_concurrent_rpcs") or not isinstance(
        getattr(state, "active_rpc_count", None), int
    ):
        _log.warning(
            "this grpcio (%s) does not expose its count of calls in flight: calls refused at"
            " --max-concurrent-rpcs are not counted in snapcoord_calls_refused_total",
            grpc.__version__,
        )
        return lambda: False
    limit = state.maximum_concurrent_rpcs
    if limit is None:
        return lambda: False

    def limit_reached() -> bool:
        return bool(state.active_rpc_count >= limit)

    return limit_reached
