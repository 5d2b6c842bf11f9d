"""Parsing of the URIs shared by several backends."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit


def directory_from_file_uri(uri: str) -> Path:
    """The directory named by ``file:///abs/dir`` or ``file:relative/dir``."""
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise ValueError(f"expected file:///absolute/dir or file:relative/dir, got {uri!r}")
    return Path(unquote(parts.path))
