"""The composition root: what the servicers and the janitor work on, built once per server."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from snapcoord.coordinator.config import Config
from snapcoord.coordinator.domain.clock import Clock, SystemClock
from snapcoord.coordinator.domain.producers import ProducerPolicy
from snapcoord.coordinator.janitor import Janitor, Step
from snapcoord.coordinator.metrics import CoordinatorMetrics
from snapcoord.coordinator.producers import ProducerRegistry
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore


@dataclass(frozen=True)
class Deps:
    """The stores and the clock; tests pass embedded stores and a manual clock."""

    metadata: MetadataStore
    blobs: BlobStore
    clock: Clock = field(default_factory=SystemClock)


@dataclass(frozen=True)
class Services:
    """The application services of one coordinator, sharing its stores, clock and metrics."""

    deps: Deps
    metrics: CoordinatorMetrics
    producers: ProducerRegistry
    #: Always built, so tests and tools can ``run_once``; started only if the config enables it.
    janitor: Janitor

    @classmethod
    def build(cls, config: Config, deps: Deps, metrics: CoordinatorMetrics) -> Services:
        producers = ProducerRegistry(
            deps.metadata,
            deps.blobs,
            deps.clock,
            ProducerPolicy(
                default_ttl_ms=config.producers.default_ttl_ms,
                max_ttl_ms=config.producers.max_ttl_ms,
                max_offsets=config.producers.max_offsets,
            ),
            metrics,
        )
        batch = config.janitor.batch
        steps = [
            Step("producer-expiry", lambda: producers.expire_due(batch)),
            Step(
                "producer-orphans",
                lambda: producers.sweep_orphans(config.janitor.orphan_grace_ms, batch),
                every_ms=config.janitor.orphan_sweep_interval_ms,
            ),
        ]
        janitor = Janitor(
            steps,
            election=lambda: deps.metadata.election("janitor", f"{socket.gethostname()}:{os.getpid()}"),
            interval_ms=config.janitor.cleanup_interval_ms,
            metrics=metrics,
        )
        return cls(deps=deps, metrics=metrics, producers=producers, janitor=janitor)
