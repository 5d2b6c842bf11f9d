"""Storage backends behind two small interfaces, chosen by URI (see ``backends``).

``MetadataStore`` is the commit point (ZooKeeper, or the embedded local store); ``BlobStore``
holds payloads (S3, or a local directory). Backends translate their library's errors into
``snapcoord.coordinator.errors`` at the edge, with ``raise ... from e``.
"""
