"""``snapcoordctl``: an operator's command line for a snapcoord coordinator, on the thin client.

``snapcoordctl [options] RESOURCE VERB [arguments]`` lists, shows and deletes producer records,
generation snapshots, leases and backlog marks through ``CoordinatorClient`` (so it connects,
retries and authenticates exactly as the client does). ``--output json`` prints one JSON
document; commands that change stored state need ``--yes``.

Exit codes: 0 done; 1 the coordinator refused or could not be reached (the gRPC status, the
error reason and the message on stderr; also a delete that found nothing to delete); 2 usage
(a bad option, a missing ``--yes``, a TLS or token file that cannot be read).
"""

from __future__ import annotations

from snapcoord.client.ctl._main import main

__all__ = ["main"]
