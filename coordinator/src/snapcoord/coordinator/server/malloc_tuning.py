"""Give freed payload buffers back to the operating system (glibc only; a no-op elsewhere).

Payloads pass through the server in 1 MiB messages and multi-MiB S3 parts, allocated and freed on
many threads. glibc raises its mmap threshold each time a large mmapped block is freed (up to
32 MiB), after which such blocks come from per-thread arenas that keep the memory when it is
freed: the process's RSS then grows far beyond the bytes actually in flight (measured: twice the
payload budget with four concurrent uploads). A fixed threshold keeps every block of 128 KiB or
more mmapped, so freeing it returns it at once, and the payload budget bounds the RSS again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_log = logging.getLogger(__name__)

#: ``M_MMAP_THRESHOLD`` in glibc's malloc.h; setting it also turns the dynamic threshold off.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def return_large_blocks_to_the_os() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES``; False where that is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if not ok:
        _log.debug("mallopt(M_MMAP_THRESHOLD) refused; RSS may exceed the payload budget")
    return ok
