"""A plaintext listener that serves grpc.health.v1 and nothing else (``--health-port``).

Kubernetes' native gRPC probe, like most load balancers' health checks, connects without a client
certificate, so once the gRPC port requires one (``--tls-client-ca``) the probe fails its handshake
and every replica would be reported dead. An exec probe running ``snapcoord health`` with mounted
client certificates works too, but starts a Python interpreter per probe per replica (three probes,
every few seconds) and needs a client certificate in every pod. This second server is cheap and
needs nothing: it answers Health/Check and Health/Watch from the main server's own
``HealthServicer`` (the same statuses, NOT_SERVING during a drain), and registers no API service
and no reflection, so a caller on this port learns whether the replica is serving and nothing more.
It has no interceptor either: probes are not RPCs to count in the API metrics or to authorise.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc

#: Threads and calls in flight of the health port: probes are tiny and few (three per kubelet
#: period); the bound keeps Watch streams opened by anyone from growing without end.
HEALTH_WORKERS = 4
HEALTH_MAX_CONCURRENT_RPCS = 16


class HealthListener:
    """The health-only server, bound (not started) on ``address``; ``port`` is the bound port.

    Bound first and given its servicer later (``serve``), so that a taken port fails the start
    before anything is wired to the stores.
    """

    def __init__(self, address: str, options: Sequence[tuple[str, Any]]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=HEALTH_WORKERS, thread_name_prefix="health-port")
        self.server = grpc.server(
            self._executor, maximum_concurrent_rpcs=HEALTH_MAX_CONCURRENT_RPCS, options=tuple(options)
        )
        try:
            port = self.server.add_insecure_port(address)
        except RuntimeError as e:  # grpc reports a failed bind as RuntimeError
            self._executor.shutdown(wait=False)
            raise OSError(f"cannot bind the health port {address}: {e} (port in use?)") from e
        if port == 0:
            self._executor.shutdown(wait=False)
            raise OSError(f"cannot bind the health port {address} (port in use or address not local?)")
        self.port = port

    def serve(self, servicer: health.HealthServicer) -> None:
        """Answer health from ``servicer`` (the main server's); the only service added here."""
        health_pb2_grpc.add_HealthServicer_to_server(servicer, self.server)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        """Stop now: called once the main server has drained, so probes saw NOT_SERVING meanwhile."""
        self.server.stop(None).wait()
        self._executor.shutdown(wait=False, cancel_futures=True)
