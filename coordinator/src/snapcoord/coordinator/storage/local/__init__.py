"""The embedded backends of ``file://`` URIs: ``embedded`` (the ZooKeeper-shaped tree in SQLite)
and ``blob_files`` (payloads in a local directory)."""
