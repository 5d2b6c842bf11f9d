"""Where leases live::

    /leases/records/<lease_id>                  the lease: duration, expiry, pinned snapshots
    /leases/expiry/<minute>/<lease_id>          the expiry index (ExpiryIndex), by expiry + skew
    /snapshots/pins/<app>@<generation>          each pinned snapshot's reverse index (coordinator.pins)

A lease, its expiry-index entry and the pin indexes of its snapshots change in one transaction.
"""

from __future__ import annotations

from snapcoord.coordinator.domain.leases import Lease
from snapcoord.coordinator.expiry_index import entry_path

RECORDS = "/leases/records"
EXPIRY = "/leases/expiry"


def record_path(lease_id: str) -> str:
    return f"{RECORDS}/{lease_id}"


def due_ms(lease: Lease, skew_ms: int) -> int:
    """When the janitor may remove the lease: its expiry plus the clock-skew margin."""
    return lease.expires_at_ms + skew_ms


def index_path(lease: Lease, skew_ms: int) -> str:
    return entry_path(EXPIRY, due_ms(lease, skew_ms), lease.lease_id)
