"""Quoting caller input inside error messages, bounded.

A validation message that echoes its input must stay short: gRPC sends the message as trailing
metadata, and a message past the metadata limit (8 KiB by default) turns a precise
INVALID_ARGUMENT into the client's RESOURCE_EXHAUSTED. Every message that quotes a value the
caller sent goes through ``quote_prefix``.
"""

from __future__ import annotations

#: Characters of a value quoted in a message; enough to recognise an id or a token.
DEFAULT_QUOTE_LIMIT = 40


def quote_prefix(value: str, limit: int = DEFAULT_QUOTE_LIMIT) -> str:
    """``repr(value)`` when it has at most ``limit`` characters, else the repr of its first
    ``limit`` characters followed by ``... (N characters)``, so the reader still learns the size."""
    if limit < 1:
        raise ValueError(f"limit must be 1 or more, got {limit}")
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
