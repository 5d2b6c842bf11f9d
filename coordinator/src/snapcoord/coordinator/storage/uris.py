"""Parsing of the URIs shared by several backends."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from snapcoord.coordinator.storage.metadata import validate_path
from snapcoord.coordinator.storage.zookeeper.request_size import MAX_CHROOT_BYTES


def directory_from_file_uri(uri: str) -> Path:
    """The directory named by ``file:///abs/dir`` or ``file:relative/dir``."""
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise ValueError(f"expected file:///absolute/dir or file:relative/dir, got {uri!r}")
    return Path(unquote(parts.path))


def zk_chroot(uri: str) -> str:
    """The chroot of ``zk://host:port[,host:port]/chroot`` ("" for none), as it is sent: the URI's
    path without a trailing ``/``. Raises ``ValueError`` for a malformed one or one longer than
    ``MAX_CHROOT_BYTES``, the length the request-size budgets assume. Both the configuration
    (``--metadata``, at load) and the store (``ZooKeeperMetadataStore.from_uri``) parse it here."""
    chroot = urlsplit(uri).path.rstrip("/")
    if not chroot:
        return ""
    try:
        validate_path(chroot)
    except ValueError:
        raise ValueError(f"malformed ZooKeeper chroot {chroot!r}: an empty, . or .. segment") from None
    size = len(chroot.encode())
    if size > MAX_CHROOT_BYTES:
        raise ValueError(
            f"the ZooKeeper chroot is {size} bytes long (UTF-8) and may be at most {MAX_CHROOT_BYTES}: "
            "every request sends it on each path, and the request-size limits under "
            f"--zk-max-request-bytes are computed for a chroot of at most {MAX_CHROOT_BYTES} bytes; "
            "use a shorter path"
        )
    return chroot
