"""The ZooKeeper digest credentials of ``--zk-auth-file``, and the ACL they put on every znode.

Free of kazoo, so that ``config`` can read the file at start-up and count that ACL's exact bytes
in its request-size check (``zk_budget``) without importing the backend. The store reads the
file with ``read_credentials`` too, and sends kazoo's ``make_digest_acl`` of the credentials; a
test holds ``digest_acl`` equal to it.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from snapcoord.coordinator.storage.zookeeper.request_size import AclEntry

#: The longest user name accepted. Every create carries the user's digest ACL, 24 bytes plus the
#: name's more than an open one; the fixed reserves of the request budgets (the snapshot header's,
#: ``domain.snapshots.REQUEST_RESERVE_BYTES``) hold it up to this length, which
#: ``tests/coordinator/server/test_worst_requests.py`` checks for every RPC. The lease limits, which have no
#: reserve, are checked against the configured user's exact ACL at start-up (``config``).
MAX_USER_BYTES = 256

#: ZooKeeper's ``Perms.ALL``: the user may read, write, create, delete and administer.
PERMS_ALL = 31


def read_credentials(path: str) -> tuple[str, str]:
    """The ``user:password`` on the first non-blank line of ``path``. The ``ValueError`` says what
    is wrong without quoting the file, which holds a secret."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the ZooKeeper auth file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the ZooKeeper auth file {path} is not UTF-8 text") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    user, sep, password = lines[0].partition(":") if lines else ("", "", "")
    if not user or not sep or not password:
        raise ValueError(f"the ZooKeeper auth file {path} must hold user:password on its first line")
    if len(user.encode()) > MAX_USER_BYTES:
        raise ValueError(
            f"the user name in the ZooKeeper auth file {path} is longer than {MAX_USER_BYTES} bytes"
        )
    return user, password


def digest_acl(user: str, password: str) -> AclEntry:
    """What ``kazoo.security.make_digest_acl(user, password, all=True)`` makes: every permission
    for the id ``user:<base64 of SHA-1(user:password)>`` (28 characters, whatever the password)."""
    digest = base64.b64encode(hashlib.sha1(f"{user}:{password}".encode()).digest()).decode()
    return AclEntry(PERMS_ALL, "digest", f"{user}:{digest}")
