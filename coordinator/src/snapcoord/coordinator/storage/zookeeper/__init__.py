"""The ZooKeeper metadata store on kazoo: ``store`` (the ``MetadataStore``), with ``combine``
(group commit), ``multiread`` (ZooKeeper 3.6 multiRead), ``request_size`` (exact request bytes),
``handler`` (kazoo's connection thread), ``election`` and ``auth`` (digest credentials)."""
