"""grpc.health.v1 tied to the stores: SERVING only while the stores a service needs are usable.

A replica without a usable ZooKeeper session can answer nothing correctly, so load balancers and
Kubernetes probes must stop sending it calls; the store tells us through its state listener, and
then every service and the overall status ``""`` turn NOT_SERVING.

The blob store has no session and no events, so a background probe calls its cheap ``check()``
every ``blob_probe_interval_s``. While the blob store is unreachable, only the services whose
every write needs a payload (``blob_services``: producer offsets, backlog marks) turn
NOT_SERVING; the overall status and the others stay SERVING, since snapshot headers, leases and
the current-snapshot pointer are answered from metadata alone. The servicer is grpc_health's own;
this module only decides what it says.

``LIVENESS_SERVICE`` is SERVING from start to shutdown whatever the stores do: an answer means the
process serves calls, which is all a liveness probe should ask. Restarting replicas does not bring
ZooKeeper back, so a probe on ``""`` would restart every replica during a long outage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from grpc_health.v1 import health, health_pb2

from snapcoord.coordinator.errors import SnapcoordError
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore

_log = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

#: How often the blob store is probed: one ListObjectsV2 of one key every few seconds is cheap,
#: and a few seconds is well inside a load balancer's reaction time.
DEFAULT_BLOB_PROBE_INTERVAL_S = 5.0

#: The health service name for liveness probes: SERVING until shutdown, independent of the stores.
LIVENESS_SERVICE = "snapcoord.liveness"


class StoreHealth:
    """Drives a ``HealthServicer`` for ``""`` and ``services`` from the metadata store's state and,
    when ``blobs`` is given, a periodic probe of the blob store for ``blob_services``."""

    def __init__(
        self,
        store: MetadataStore,
        services: Iterable[str],
        *,
        blobs: BlobStore | None = None,
        blob_services: Iterable[str] = (),
        blob_probe_interval_s: float = DEFAULT_BLOB_PROBE_INTERVAL_S,
    ) -> None:
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        self.servicer.set(LIVENESS_SERVICE, _SERVING)  # NOT_SERVING only by the graceful shutdown
        self._services = ("", *services)
        self._blob_services = frozenset(blob_services) if blobs is not None else frozenset()
        unknown = self._blob_services - set(self._services)
        if unknown or "" in self._blob_services:
            raise ValueError(f"blob_services must be among the services: {sorted(unknown)}")
        if blob_probe_interval_s <= 0:
            raise ValueError(f"blob_probe_interval_s must be positive, got {blob_probe_interval_s}")
        # Lock order: self._lock, then the servicer's own lock (inside set/enter_graceful_shutdown).
        # No store is ever called under self._lock: the metadata store's listener thread may hold
        # a store lock while it waits for ours, and a blob probe may take seconds.
        self._lock = threading.Lock()
        self._usable: bool | None = None  # None until the first reading or event
        self._blobs_ok = True  # the server checked the blob store before it started serving
        self._published: dict[str, int] = {}
        self._shutting_down = False
        self._stop = threading.Event()
        store.add_state_listener(self._on_store_state)
        initial = store.is_usable()
        with self._lock:
            # If an event came in since the listener was registered, it has set the state and any
            # later change brings another one; `initial` may be older than that event, and applied
            # over it could leave a live store NOT_SERVING for good.
            if self._usable is None:
                self._usable = initial
                self._publish()
        self._prober: threading.Thread | None = None
        if blobs is not None and self._blob_services:
            self._prober = threading.Thread(
                target=self._probe_blobs,
                args=(blobs, blob_probe_interval_s),
                name="health-blob-probe",
                daemon=True,
            )
            self._prober.start()

    def enter_graceful_shutdown(self) -> None:
        """NOT_SERVING for good; later store events are ignored (the servicer drops them). Stops
        the blob probe without waiting: a probe inside a slow ``check()`` must not hold up the
        drain, and one that ends after the blob store closed only sees an error it ignores."""
        with self._lock:
            if self._shutting_down:
                return
            self._shutting_down = True
            _log.info("health: NOT_SERVING (shutting down)")
            self.servicer.enter_graceful_shutdown()
        self._stop.set()

    def _on_store_state(self, usable: bool) -> None:
        # Called from the store's thread (kazoo's event thread for ZooKeeper): quick, never raises.
        try:
            with self._lock:
                if self._shutting_down:
                    return  # closing the store at the end of a shutdown is no news
                if usable != self._usable:
                    _log.log(
                        logging.INFO if usable else logging.WARNING,
                        "health: metadata store %s",
                        "usable" if usable else "not usable",
                    )
                self._usable = usable
                self._publish()
        except Exception:
            _log.exception("health: failed to apply metadata store state %s", usable)

    def _probe_blobs(self, blobs: BlobStore, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                blobs.check()
                ok, problem = True, ""
            except SnapcoordError as e:  # StoreUnavailable and friends: what to fix is in the message
                ok, problem = False, str(e)
            except Exception as e:  # a probe must never die: an unexpected error is "not usable"
                ok, problem = False, f"{type(e).__name__}: {e}"
            with self._lock:
                if self._shutting_down:
                    return
                if ok != self._blobs_ok:
                    if ok:
                        _log.info("health: blob store usable again")
                    else:
                        _log.warning("health: blob store not usable: %s", problem)
                self._blobs_ok = ok
                self._publish()

    def _publish(self) -> None:
        """Set every service whose status changed (caller holds ``self._lock``)."""
        for service in self._services:
            serving = bool(self._usable) and (service not in self._blob_services or self._blobs_ok)
            status = _SERVING if serving else _NOT_SERVING
            if self._published.get(service) == status:
                continue
            self._published[service] = status
            _log.log(
                logging.INFO if serving else logging.WARNING,
                "health: %s %s",
                service or '"" (overall)',
                "SERVING" if serving else "NOT_SERVING",
            )
            self.servicer.set(service, status)
