"""Open a backend by URI: one registry, lazy imports, one place that knows the schemes.

=========================  ==============================================================
``zk://h1:2181,h2:2181/p``  ZooKeeper metadata under chroot ``/p`` (kazoo)
``file:///var/lib/sc/md``   embedded metadata: a durable SQLite database in that directory
``s3://bucket/prefix``      S3 blobs (boto3; endpoint, region, credentials from boto3's chain)
``file:///var/lib/sc/bl``   local blobs: files in that directory
=========================  ==============================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore
from snapcoord.coordinator.storage.zookeeper.request_size import ZK_DEFAULT_MAX_REQUEST_BYTES


@dataclass(frozen=True)
class MetadataOptions:
    """Backend settings that do not belong in the URI."""

    #: ZooKeeper session timeout: how long the server keeps a silent client's session.
    zk_session_timeout_ms: int = 10_000
    #: How long to wait for the first connection before giving up at start.
    zk_connect_timeout_ms: int = 15_000
    #: Upper bound on retrying one operation across connection losses before UNAVAILABLE.
    zk_retry_deadline_ms: int = 5_000
    #: The ensemble's jute.maxbuffer: a transaction larger than this is refused before it is sent.
    zk_max_request_bytes: int = ZK_DEFAULT_MAX_REQUEST_BYTES
    #: A file holding ``user:password`` for ZooKeeper digest auth ("" = none). Never in the URI,
    #: which gets logged. With it, every znode the store creates gets an ACL for that user only.
    zk_auth_file: str = ""
    #: ZooKeeper's TLS client port (``secureClientPort``): the CA bundle that signs the servers'
    #: certificates, and this client's certificate and key when the ensemble requires one.
    zk_tls_ca: str = ""
    zk_tls_cert: str = ""
    zk_tls_key: str = ""


@dataclass(frozen=True)
class BlobOptions:
    """Backend settings that do not belong in the URI."""

    #: "path" or "virtual" addressing; "auto" picks path style when an S3 endpoint URL is set
    #: (S3-compatible stores), boto3's default otherwise.
    s3_addressing_style: Literal["auto", "path", "virtual"] = "auto"
    s3_connect_timeout_ms: int = 3_000
    s3_read_timeout_ms: int = 20_000
    #: Total attempts per S3 call (boto3 "standard" retry mode) before UNAVAILABLE.
    s3_max_attempts: int = 3
    #: Server-side encryption of every object written: "" (the bucket's default), "AES256", "aws:kms".
    s3_sse: str = ""
    #: KMS key for ``s3_sse="aws:kms"`` ("" = the account's default key).
    s3_sse_kms_key_id: str = ""


def open_metadata_store(uri: str, *, options: MetadataOptions | None = None) -> MetadataStore:
    """Open the metadata store named by ``uri`` (``zk://...`` or ``file://...``)."""
    options = options or MetadataOptions()
    scheme = urlsplit(uri).scheme
    if scheme == "zk":
        from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

        return ZooKeeperMetadataStore.from_uri(uri, options)
    if scheme == "file":
        from snapcoord.coordinator.storage.local.embedded import EmbeddedMetadataStore

        return EmbeddedMetadataStore.from_uri(uri)
    raise ValueError(
        f"unsupported metadata URI {uri!r}: use zk://host:port[,host:port]/chroot or file:///dir"
    )


def open_blob_store(uri: str, *, options: BlobOptions | None = None) -> BlobStore:
    """Open the blob store named by ``uri`` (``s3://...`` or ``file://...``)."""
    options = options or BlobOptions()
    scheme = urlsplit(uri).scheme
    if scheme == "s3":
        from snapcoord.coordinator.storage.s3 import S3BlobStore

        return S3BlobStore.from_uri(uri, options)
    if scheme == "file":
        from snapcoord.coordinator.storage.local.blob_files import LocalBlobStore

        return LocalBlobStore.from_uri(uri)
    raise ValueError(f"unsupported blob URI {uri!r}: use s3://bucket/prefix or file:///dir")
