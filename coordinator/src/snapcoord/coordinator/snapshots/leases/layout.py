"""Where leases live::

    /leases/records/<lease_id>                  the lease: duration, expiry, pinned snapshots
    /leases/records/<lease_id>/<incarnation>    empty; exists exactly as long as that incarnation
    /leases/expiry/<minute>/<lease_id>          the expiry index (ExpiryIndex), by expiry + skew
    /snapshots/pins/<app>@<generation>          each pinned snapshot's reverse index (snapshots.pins)

A lease, its expiry-index entry and the pin indexes of the snapshots it pins or gives up change in
one transaction; a renewal changes the record and its entry only (``snapshots.pins``).
The incarnation child is created with the record and deleted with it (ZooKeeper refuses to delete a
record that still has it), so a ``Check`` on it in a transaction proves the record is still the
incarnation the writer knows, which the record's version alone cannot (versions restart at 0).
"""

from __future__ import annotations

import os

from snapcoord.coordinator.domain.leases import Lease
from snapcoord.coordinator.kernel.expiry_index import entry_path

RECORDS = "/leases/records"
EXPIRY = "/leases/expiry"


def record_path(lease_id: str) -> str:
    return f"{RECORDS}/{lease_id}"


def incarnation_path(lease: Lease) -> str:
    return f"{record_path(lease.lease_id)}/{lease.incarnation}"


def due_ms(lease: Lease, skew_ms: int) -> int:
    """When the janitor may remove the lease: its expiry plus the clock-skew margin."""
    return lease.expires_at_ms + skew_ms


def index_path(lease: Lease, skew_ms: int) -> str:
    return entry_path(EXPIRY, due_ms(lease, skew_ms), lease.lease_id)


def new_nonce() -> str:
    """A call's nonce (12 hex digits, 48 random bits): names the incarnation a new record gets and
    the retention triggers of the pins a call removes. As random as ``uuid4().hex[:12]``, without
    building a UUID on every acquire, release and drop."""
    return os.urandom(6).hex()
