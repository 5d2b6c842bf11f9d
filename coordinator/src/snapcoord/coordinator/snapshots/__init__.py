"""Generation snapshots: ``layout`` (paths), ``decide`` (the pure rules of each change),
``registry`` (the SnapshotService logic), ``cache`` (GetCurrentSnapshot from memory), ``janitor``
(timeouts, retention, orphan payloads). ``leases`` hold snapshots for readers; ``pins`` is the
contract between the two (which lease holds which snapshot), so both live in this package."""
