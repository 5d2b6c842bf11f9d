"""Snapshot leases: ``layout`` (paths), ``decide`` (the pure rules of each change), ``registry``
(the LeaseService logic), ``janitor`` (expiry, gauges). Pins, which snapshots share, are in
``coordinator.pins``."""
