"""Free loopback ports for test servers.

Ports are picked at random *below* the kernel's ephemeral range (``ip_local_port_range``, 32768+ by
default), then verified with a bind. Outside that range the kernel never hands the port to an outgoing
connection or to someone's ``bind(0)`` in the window between our check and the server's own bind; only
another test process picking the same random number can collide, and the servers retry with fresh ports
when that happens on a first start. Ports handed out by this process are never handed out twice.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterable

LOOPBACK = "127.0.0.1"

# SeaweedFS listens on P..P+4 (s3, master, volume, filer, admin) and on each of them + 10000 for gRPC.
SEAWEED_PORT_COUNT = 5
SEAWEED_GRPC_OFFSET = 10000
SEAWEED_MAX_BASE = 55000  # so that every gRPC port (base + 10000 + 4) stays a valid port

_LOW = 10000  # stay clear of well-known and commonly configured service ports
_lock = threading.Lock()
_handed_out: set[int] = set()
_rng = random.SystemRandom()


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's ephemeral range (inclusive), Linux defaults if it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def is_port_free(port: int, host: str = LOOPBACK) -> bool:
    """True if a listening socket could bind ``host:port`` right now.

    SO_REUSEADDR mirrors what java and Go servers set, so a port whose old connections sit in TIME_WAIT
    counts as free (they can bind it), while any listener on it, including one on 0.0.0.0, does not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _claim(ports: Iterable[int], host: str) -> bool:
    ports = list(ports)
    with _lock:
        if any(p in _handed_out for p in ports):
            return False
        if not all(is_port_free(p, host) for p in ports):
            return False
        _handed_out.update(ports)
        return True


def _candidate_range(span: int) -> tuple[int, int]:
    """[lo, hi) for a base port so that base..base+span stays below the ephemeral range (if it can)."""
    eph_lo, _ = ephemeral_port_range()
    hi = eph_lo - span
    if hi - _LOW < 1000:  # an unusual sysctl left no room below the ephemeral range: use what is valid
        hi = 65535 - span
    return _LOW, hi


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free on ``host`` now and was not handed out before by this process."""
    lo, hi = _candidate_range(1)
    for _ in range(200):
        port = _rng.randrange(lo, hi)
        if _claim([port], host):
            return port
    # Practically unreachable; fall back to the kernel's choice.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = int(s.getsockname()[1])
    with _lock:
        _handed_out.add(port)
    return port


def seaweed_ports(base: int) -> list[int]:
    """All TCP ports a ``weed mini`` with ``-s3.port=base`` (and the next four) listens on."""
    http = [base + i for i in range(SEAWEED_PORT_COUNT)]
    return http + [p + SEAWEED_GRPC_OFFSET for p in http]


def free_port_block(host: str = LOOPBACK) -> int:
    """A base port P for SeaweedFS: P..P+4 and P+10000..P+10004 all free, P below 55000."""
    lo, hi = _candidate_range(SEAWEED_GRPC_OFFSET + SEAWEED_PORT_COUNT)
    hi = min(hi, SEAWEED_MAX_BASE)
    for _ in range(500):
        base = _rng.randrange(lo, hi)
        if _claim(seaweed_ports(base), host):
            return base
    raise RuntimeError(f"no free block of SeaweedFS ports found in [{lo}, {hi})")
