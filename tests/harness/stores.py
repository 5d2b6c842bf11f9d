"""A metadata store and a blob store opened together, for tests that run on every backend."""

from __future__ import annotations

from dataclasses import dataclass

from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore


@dataclass(frozen=True)
class Stores:
    kind: str
    metadata: MetadataStore
    blobs: BlobStore
