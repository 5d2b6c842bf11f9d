"""Generation snapshots: ``layout`` (paths), ``decide`` (the pure rules of each change),
``registry`` (the SnapshotService logic), ``cache`` (GetCurrentSnapshot from memory), ``janitor``
(timeouts, retention, orphan payloads). Pins, which leases share, are in ``coordinator.pins``."""
