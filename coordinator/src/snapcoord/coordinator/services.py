"""The composition root: what the servicers and the janitor work on, built once per server."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from snapcoord.coordinator.backlog.registry import BacklogRegistry
from snapcoord.coordinator.claims.registry import CommitClaimRegistry
from snapcoord.coordinator.config.settings import Config
from snapcoord.coordinator.domain.clock import Clock, SystemClock
from snapcoord.coordinator.kernel.commit import CommitKernel
from snapcoord.coordinator.kernel.janitor_loop import Janitor, Step
from snapcoord.coordinator.kernel.payload_admission import PayloadBudget
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.producers.registry import DEFAULT_INTENT_MAX_AGE_MS, ProducerRegistry
from snapcoord.coordinator.snapshots.leases.registry import LeaseRegistry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
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
    snapshots: SnapshotRegistry
    leases: LeaseRegistry
    backlog: BacklogRegistry
    claims: CommitClaimRegistry
    #: Always built, so tests and tools can ``run_once``; started only if the config enables it.
    janitor: Janitor
    #: Payload bytes in memory across the server's calls (``--payload-budget``): the snapshot
    #: registry's reads and uploads hold from it, and so does every request message as gRPC
    #: receives it (``server.admission``).
    payload_budget: PayloadBudget

    @classmethod
    def build(cls, config: Config, deps: Deps, metrics: CoordinatorMetrics) -> Services:
        # One kernel for every registry: one expiry-index bucket cache and one intent index per
        # server (leases and snapshots both write retention triggers, all four make intents).
        kernel = CommitKernel(deps.metadata, deps.blobs, metrics, now_ms=deps.clock.now_ms)
        producers = ProducerRegistry(
            deps.metadata,
            deps.blobs,
            deps.clock,
            config.producers,
            metrics,
            # Pooled intents must commit long before the sweep may claim them (older than the grace).
            intent_max_age_ms=min(DEFAULT_INTENT_MAX_AGE_MS, config.janitor.orphan_grace_ms // 4),
            kernel=kernel,
        )
        metrics.payload_budget_limit.set(config.grpc.payload_budget_bytes)
        payload_budget = PayloadBudget(
            config.grpc.payload_budget_bytes,
            config.grpc.payload_budget_wait_ms / 1000,
            on_change=metrics.payload_budget_in_use.set,
        )
        snapshots = SnapshotRegistry(
            deps.metadata,
            deps.blobs,
            deps.clock,
            config.snapshots,
            metrics,
            payload_budget=payload_budget,
            kernel=kernel,
        )
        leases = LeaseRegistry(
            deps.metadata,
            deps.clock,
            config.leases,
            kernel,
            metrics,
        )
        backlog = BacklogRegistry(
            deps.metadata,
            deps.blobs,
            deps.clock,
            config.backlog,
            metrics,
            # The elected janitor refreshes the backlog gauges every pass; a replica that stopped
            # leading exports 0 once its last values are this old.
            gauges_stale_after_ms=3 * config.janitor.cleanup_interval_ms + 5_000,
            kernel=kernel,
        )
        claims = CommitClaimRegistry(deps.metadata, deps.clock, config.claims, metrics, kernel)
        batch = config.janitor.batch
        steps = [
            # Leases first: a lease that expired releases its pins before retention looks.
            Step("lease-expiry", lambda: leases.expire_due(batch)),
            Step("lease-gauges", leases.update_gauges),
            Step("snapshot-timeouts", lambda: snapshots.abort_timed_out(batch)),
            Step("snapshot-retention", lambda: snapshots.apply_retention(batch)),
            Step("producer-expiry", lambda: producers.expire_due(batch)),
            # Every payload is announced by an upload intent before it is put: walking the
            # intents older than the grace finds every orphan (its cost follows the orphans).
            Step(
                "orphan-intents",
                lambda: snapshots.sweep_intents(config.janitor.orphan_grace_ms, batch),
                every_ms=config.janitor.orphan_sweep_interval_ms,
            ),
            Step("backlog-gauges", backlog.refresh_gauges),
            Step("commit-claims", lambda: claims.clean(batch)),
        ]
        listing_ms = config.janitor.orphan_listing_interval_ms
        if listing_ms:  # objects from before the intents: off unless an upgrade asks for it
            grace = config.janitor.orphan_grace_ms
            steps += [
                Step("snapshot-orphans", lambda: snapshots.sweep_orphans(grace, batch), every_ms=listing_ms),
                Step("producer-orphans", lambda: producers.sweep_orphans(grace, batch), every_ms=listing_ms),
                Step("backlog-orphans", lambda: backlog.sweep_orphans(grace, batch), every_ms=listing_ms),
            ]
        janitor = Janitor(
            steps,
            election=lambda: deps.metadata.election("janitor", f"{socket.gethostname()}:{os.getpid()}"),
            interval_ms=config.janitor.cleanup_interval_ms,
            metrics=metrics,
        )
        return cls(
            deps=deps,
            metrics=metrics,
            producers=producers,
            snapshots=snapshots,
            leases=leases,
            backlog=backlog,
            claims=claims,
            janitor=janitor,
            payload_budget=payload_budget,
        )
