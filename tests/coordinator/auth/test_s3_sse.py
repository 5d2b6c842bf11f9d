"""S3 server-side encryption settings reach S3 on every put (SeaweedFS implements SSE-S3)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from snapcoord.coordinator.storage.backends import BlobOptions, open_blob_store

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def test_sse_s3_objects_are_stored_encrypted(s3_uri: str, s3_client: S3Client) -> None:
    store = open_blob_store(s3_uri, options=BlobOptions(s3_sse="AES256"))
    try:
        store.put("enc/one", b"payload")
        assert store.get("enc/one") == b"payload"
    finally:
        store.close()
    parts = urlsplit(s3_uri)
    key = f"{parts.path.strip('/')}/enc/one"
    head = s3_client.head_object(Bucket=parts.netloc, Key=key)
    assert head.get("ServerSideEncryption") == "AES256", head


def test_without_sse_objects_carry_no_encryption_header(s3_uri: str, s3_client: S3Client) -> None:
    store = open_blob_store(s3_uri)
    try:
        store.put("plain/one", b"payload")
    finally:
        store.close()
    parts = urlsplit(s3_uri)
    head = s3_client.head_object(Bucket=parts.netloc, Key=f"{parts.path.strip('/')}/plain/one")
    assert "ServerSideEncryption" not in head, head
