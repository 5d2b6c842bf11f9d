"""The series of every snapcoord.v1 method exist from the server's start, at 0.

Prometheus' ``rate()`` and ``increase()`` see no increase in a series' first sample, so a series that
a call creates (a method's first UNAVAILABLE answer, its first refusal at --max-concurrent-rpcs)
would not show in a rate-based alert until the next such call. go-grpc-prometheus initialises its
series the same way. Unknown methods get none: their names come from clients.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pool

from snapcoord.coordinator import api
from snapcoord.coordinator.observability.metrics import GrpcServerMetrics
from snapcoord.coordinator.transport.interceptors import code_label, rpc_type_label


def initialize_api_series(metrics: GrpcServerMetrics) -> int:
    """Create every API method's started, handled (one per code), latency and refused series;
    returns how many methods."""
    count = 0
    for service_name in api.SERVICE_NAMES:
        for method in descriptor_pool.Default().FindServiceByName(service_name).methods:
            streaming = (method.client_streaming, method.server_streaming)
            labels = (rpc_type_label(*streaming), service_name, method.name)
            metrics.started.labels(*labels)
            metrics.handling_seconds.labels(*labels)
            for code in grpc.StatusCode:
                metrics.handled.labels(*labels, code_label(code))
            metrics.refused.labels(service_name, method.name)
            count += 1
    return count
