"""Snapshot leases: ``layout`` (paths), ``decide`` (the pure rules of each change), ``registry``
(the LeaseService logic), ``janitor`` (expiry, gauges). The pin indexes they share with snapshots
are in ``snapshots.pins``."""
