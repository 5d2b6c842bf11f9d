"""Per-test namespaces on the shared servers: a ZooKeeper chroot and an S3 key prefix, removed afterwards.

Tests share one ZooKeeper and one bucket, so isolation comes from names: every test gets
``t/<test-name>-<uuid8>``. The uuid keeps reruns and parametrized tests apart; the readable part tells
whose leftovers one is looking at when debugging.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

NAMESPACE_ROOT = "t"


def slug(name: str, max_len: int = 48) -> str:
    """A test's node name as a znode/S3-key-safe fragment: ``test_put[a/b]`` -> ``test_put-a-b``."""
    text = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")
    return text[:max_len].rstrip("-") or "test"


def unique_name(test_name: str) -> str:
    return f"{slug(test_name)}-{uuid.uuid4().hex[:8]}"


def chroot_of(zk_uri: str) -> str:
    """``zk://host:port/a/b`` -> ``/a/b``."""
    rest = zk_uri.removeprefix("zk://")
    return "/" + rest.partition("/")[2]


def delete_zk_tree(admin: KazooClient, path: str) -> None:
    """Delete ``path`` and everything below it; absent is fine."""
    # A session of the test that is still closing can add or drop an ephemeral while the recursive delete
    # walks the tree (NotEmptyError); the tree is the test's own, so a few retries always converge.
    for attempt in range(5):
        try:
            admin.retry(admin.delete, path, recursive=True)
            return
        except NoNodeError:
            return
        except NotEmptyError:
            if attempt == 4:
                raise
            time.sleep(0.2)


@contextmanager
def zk_chroot(admin: KazooClient, test_name: str) -> Iterator[str]:
    """Yield a fresh chroot path (not created) and delete its tree on exit."""
    path = f"/{NAMESPACE_ROOT}/{unique_name(test_name)}"
    try:
        yield path
    finally:
        delete_zk_tree(admin, path)


def delete_s3_prefix(client: S3Client, bucket: str, prefix: str) -> int:
    """Delete every object whose key starts with ``prefix``; returns how many were deleted."""
    deleted = 0
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        keys: list[ObjectIdentifierTypeDef] = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        if keys:  # at most 1000 per page, the DeleteObjects limit
            reply = client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            errors = reply.get("Errors", [])
            if errors:
                raise RuntimeError(
                    f"could not delete test objects under s3://{bucket}/{prefix}: {errors[:3]}"
                )
            deleted += len(keys)
    return deleted


@contextmanager
def s3_prefix(client: S3Client, bucket: str, test_name: str) -> Iterator[str]:
    """Yield a fresh key prefix (no trailing slash) and delete the objects under it on exit."""
    prefix = f"{NAMESPACE_ROOT}/{unique_name(test_name)}"
    try:
        yield prefix
    finally:
        # "<prefix>/" rather than "<prefix>": never touch a longer sibling name that merely starts alike.
        delete_s3_prefix(client, bucket, prefix + "/")
        client.delete_object(Bucket=bucket, Key=prefix)  # an object at the prefix itself; no error if absent
