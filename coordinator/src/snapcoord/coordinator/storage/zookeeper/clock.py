"""The local clock measured against ZooKeeper's: the source of the coordinator's clock-skew check.

ZooKeeper stamps every write's ``mtime`` with its leader's clock (milliseconds, truncated). Setting
a small node of this replica's own and reading the coordinator's clock (the one every expiry is
computed from) just before and just after the call bounds the leader's time at the instant of the
write: the offset is the middle of that interval and the uncertainty half its width (half the round
trip, plus a millisecond for the two clocks' truncation). Every replica measures against the same
leader, so their offsets compare.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from kazoo.exceptions import NoNodeError

from snapcoord.coordinator.domain.clock import Clock, ClockReading
from snapcoord.coordinator.storage.metadata import MetadataStore

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

#: Where each replica keeps its ephemeral probe node (under the store's chroot).
CLOCK_PATH = "/clock"
#: How long one reading may wait (a suspended session queues requests until it reconnects).
TIMEOUT_S = 5.0


class ZooKeeperClockProbe:
    """``read()`` compares ``clock`` with ZooKeeper's through one write."""

    def __init__(self, client: KazooClient, clock: Clock) -> None:
        self._client = client
        self._clock = clock
        self.path = f"{CLOCK_PATH}/{socket.gethostname()}:{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def read(self) -> ClockReading:
        """One reading; raises kazoo's errors (or its handler's timeout) when ZooKeeper cannot be
        reached in time."""
        try:
            return self._write()
        except NoNodeError:  # first reading, or the session that owned the node expired
            self._client.create_async(self.path, b"", ephemeral=True, makepath=True).get(timeout=TIMEOUT_S)
            return self._write()

    def _write(self) -> ClockReading:
        before = self._clock.now_ms()
        stat = self._client.set_async(self.path, b"").get(timeout=TIMEOUT_S)
        after = self._clock.now_ms()
        return ClockReading(
            offset_ms=stat.mtime - (before + after) / 2, uncertainty_ms=(after - before) / 2 + 1
        )


def clock_probe(metadata: MetadataStore, clock: Clock) -> Callable[[], ClockReading] | None:
    """Readings of ``clock`` against a ZooKeeper store's; None for a store that only one process
    uses (the embedded one), where no other replica's clock can disagree."""
    # Looked up, not imported: a process that never opened ZooKeeper need not load kazoo's client.
    store = sys.modules.get("snapcoord.coordinator.storage.zookeeper.store")
    if store is not None and isinstance(metadata, store.ZooKeeperMetadataStore):
        return ZooKeeperClockProbe(cast("ZooKeeperMetadataStore", metadata).kazoo, clock).read
    return None
