"""grpc.health.v1 tied to the metadata store: SERVING only while the store is usable.

A replica without a usable ZooKeeper session can answer nothing correctly, so load balancers and
Kubernetes probes must stop sending it calls; the store tells us through its state listener. The
servicer is grpc_health's own; this module only decides what it says.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from grpc_health.v1 import health, health_pb2

from snapcoord.coordinator.storage.metadata import MetadataStore

_log = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class StoreHealth:
    """Drives a ``HealthServicer`` for ``""`` and ``services`` from ``store.is_usable()``."""

    def __init__(self, store: MetadataStore, services: Iterable[str]) -> None:
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        self._services = ("", *services)
        # Lock order: self._lock, then the servicer's own lock (inside set/enter_graceful_shutdown).
        # The store is never called under self._lock: its listener thread may hold a store lock
        # while it waits for ours.
        self._lock = threading.Lock()
        self._usable: bool | None = None  # None until the first reading or event
        self._shutting_down = False
        store.add_state_listener(self._on_store_state)
        initial = store.is_usable()
        with self._lock:
            # If an event came in since the listener was registered, it has set the state and any
            # later change brings another one; `initial` may be older than that event, and applied
            # over it could leave a live store NOT_SERVING for good.
            if self._usable is None:
                self._apply(initial)

    def enter_graceful_shutdown(self) -> None:
        """NOT_SERVING for good; later store events are ignored (the servicer drops them)."""
        with self._lock:
            if self._shutting_down:
                return
            self._shutting_down = True
            _log.info("health: NOT_SERVING (shutting down)")
            self.servicer.enter_graceful_shutdown()

    def _on_store_state(self, usable: bool) -> None:
        # Called from the store's thread (kazoo's event thread for ZooKeeper): quick, never raises.
        try:
            with self._lock:
                self._apply(usable)
        except Exception:
            _log.exception("health: failed to apply metadata store state %s", usable)

    def _apply(self, usable: bool) -> None:
        if self._shutting_down:
            return  # closing the store at the end of a shutdown is no news
        changed = usable != self._usable
        self._usable = usable
        if not changed:
            return
        _log.log(
            logging.INFO if usable else logging.WARNING,
            "health: %s (metadata store %s)",
            "SERVING" if usable else "NOT_SERVING",
            "usable" if usable else "not usable",
        )
        status = _SERVING if usable else _NOT_SERVING
        for service in self._services:
            self.servicer.set(service, status)
