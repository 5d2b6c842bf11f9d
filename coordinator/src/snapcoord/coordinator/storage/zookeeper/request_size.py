"""The exact size of a ZooKeeper multi request on the wire, so a too-large one is refused here.

ZooKeeper reads a request's 4-byte length prefix first and, when the length is above
``jute.maxbuffer`` (default 0xfffff = 1,048,575 bytes; 3.8 ``NIOServerCnxn.readLength``:
``len < 0 || len > maxBuffer`` gives "Len error"), closes the connection without an answer. The
client then reconnects and retries the same request, forever: the call hangs until its deadline
and the session flaps. Counting only node data misses paths and per-op overhead, which dominate
a multi of many small nodes. This module counts exactly what kazoo sends.

Jute encoding (big-endian): ``int`` 4 bytes; ``boolean`` 1 byte; ``ustring`` and ``buffer`` a
4-byte length then the bytes (UTF-8 for strings); ``vector`` a 4-byte count then the items.

A request is ``length prefix`` + ``RequestHeader {int xid; int type}`` + body. A multi's body
(``MultiOperationRecord``) is, per op, ``MultiHeader {int type; boolean done; int err}`` then the
op's record, and a closing ``MultiHeader {-1, true, -1}``. The records kazoo sends:

- ``CreateRequest {ustring path; buffer data; vector<ACL> acl; int flags}``, ``ACL {int perms;
  Id {ustring scheme; ustring id}}``. The store sends one ACL: kazoo's default, world:anyone (23
  bytes), or with ``--zk-auth-file`` the user's digest ACL, whose id is ``user:`` and a 28-character
  base64 SHA-1 (47 bytes plus the user name's: ``zk_auth``). ``request_bytes`` counts the ``acl``
  it is given: pass the one that is sent;
- ``SetDataRequest {ustring path; buffer data; int version}``;
- ``DeleteRequest {ustring path; int version}``; ``CheckVersionRequest {ustring path; int version}``.

Paths are sent with the client's chroot prepended. The limit the server compares with excludes
the 4-byte prefix; ``request_bytes`` returns that compared length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Op, SetData

#: ZooKeeper's default ``jute.maxbuffer`` (0xfffff): the largest request length it accepts.
ZK_DEFAULT_MAX_REQUEST_BYTES = 0xFFFFF

#: The longest chroot (the path of a ``zk://`` URI), in UTF-8 bytes as a ``ustring`` counts them.
#: Every path is sent with the chroot prepended, so the request-size budgets (``zk_budget``, the
#: per-op overheads of ``snapshots.decide`` and ``intents``) are computed for a chroot this long,
#: and a ``zk://`` URI with a longer one is refused (``storage.uris.zk_chroot``).
MAX_CHROOT_BYTES = 64

_INT = 4
_BOOL = 1
REQUEST_HEADER_BYTES = _INT + _INT  # xid, type
MULTI_HEADER_BYTES = _INT + _BOOL + _INT  # type, done, err
#: The 4-byte length prefix every request carries; not counted in the length the server checks.
LENGTH_PREFIX_BYTES = _INT


@dataclass(frozen=True)
class AclEntry:
    perms: int
    scheme: str
    id: str


#: kazoo's default when no ACL is given: ``OPEN_ACL_UNSAFE``.
OPEN_ACL_UNSAFE: tuple[AclEntry, ...] = (AclEntry(31, "world", "anyone"),)


def _ustring(value: str) -> int:
    return _INT + len(value.encode())


def _buffer(data: bytes | None) -> int:
    return _INT + (len(data) if data is not None else 0)


def _acl(acl: Sequence[AclEntry]) -> int:
    return _INT + sum(_INT + _ustring(a.scheme) + _ustring(a.id) for a in acl)


def op_bytes(op: Op, *, chroot: str = "", acl: Sequence[AclEntry] = OPEN_ACL_UNSAFE) -> int:
    """One op inside a multi: its MultiHeader plus its record."""
    path = _ustring(chroot + op.path if op.path != "/" or not chroot else chroot)
    if isinstance(op, Create):
        record = path + _buffer(op.data) + _acl(acl) + _INT
    elif isinstance(op, SetData):
        record = path + _buffer(op.data) + _INT
    elif isinstance(op, Delete | Check):
        record = path + _INT
    else:  # pragma: no cover - Op is closed
        raise TypeError(f"not a metadata op: {op!r}")
    return MULTI_HEADER_BYTES + record


def request_bytes(ops: Iterable[Op], *, chroot: str = "", acl: Sequence[AclEntry] = OPEN_ACL_UNSAFE) -> int:
    """The length ZooKeeper compares with ``jute.maxbuffer`` for a multi of ``ops``: request
    header, every op, and the closing MultiHeader (the 4-byte length prefix excluded)."""
    return REQUEST_HEADER_BYTES + sum(op_bytes(op, chroot=chroot, acl=acl) for op in ops) + MULTI_HEADER_BYTES


def wire_bytes(ops: Iterable[Op], *, chroot: str = "", acl: Sequence[AclEntry] = OPEN_ACL_UNSAFE) -> int:
    """What goes over the socket for the multi: ``request_bytes`` plus the length prefix."""
    return LENGTH_PREFIX_BYTES + request_bytes(ops, chroot=chroot, acl=acl)
