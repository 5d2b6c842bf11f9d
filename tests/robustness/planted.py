"""A real ``snapcoord`` with one deliberate bug patched in, to prove the checker catches it.

``python -m robustness.planted BUG serve ARGS...`` patches the coordinator's code in this process,
then runs the ``snapcoord`` command line with ``serve ARGS...``; the harness uses it in place of
the coordinator command (``planted_command(BUG)``). The bugs, and the anomaly each must produce:

- ``register-overwrites``: RegisterProducerOffsets stores its record even when a live one exists
  (create-if-absent lost), so two callers both win: ``double-winner``.
- ``unpinned-delete``: the pin check answers "not pinned", so DeleteSnapshot (and retention)
  delete snapshots that live leases hold: ``snapshot-deleted-while-leased``.
- ``renew-after-expiry``: a lease's holder may renew, read or release it after its expiry (until
  the janitor removes it), so a lease every deleter counts as dead comes back:
  ``resurrected-lease``.
- ``stale-producer-read``: GetProducerOffsets answers from a per-process cache that is never
  invalidated, so a replica keeps serving a record deleted or replaced through the other:
  ``stale-read``.

This code exists only for the tests; nothing outside ``tests/`` imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent.parent


def _register_overwrites() -> None:
    from snapcoord.coordinator.kernel.decision import landed
    from snapcoord.coordinator.producers import decide
    from snapcoord.coordinator.producers.layout import record_path

    def register(request: Any, reads: Any, pending: Any, now: int) -> Any:
        current = decide.stored(reads.node(record_path(request.fresh.producer_id)))
        if pending is not None and decide._is_fresh(current, request):
            return landed(pending)
        return decide._store(request, current, now)  # the bug: no "a live record exists" answer

    decide.register = register


def _unpinned_delete() -> None:
    from snapcoord.coordinator.snapshots import pins

    def pinned(*_args: Any) -> bool:
        return False  # the bug: every lease is ignored

    setattr(pins, "pinned", pinned)  # noqa: B010 (a different signature: mypy refuses the assignment)


def _renew_after_expiry() -> None:
    from snapcoord.coordinator.errors import NotFound
    from snapcoord.coordinator.snapshots.leases import decide

    def live(lease_id: str, current: Any, clocks: Any) -> Any:
        if current is None:
            raise NotFound(f"no lease {lease_id!r}")
        return current  # the bug: no expiry check

    decide.live = live


def _stale_producer_read() -> None:
    from snapcoord.coordinator.producers.registry import ProducerRegistry

    real = ProducerRegistry._get
    cache: dict[str, Any] = {}

    def get(self: ProducerRegistry, producer_id: str) -> Any:
        if producer_id not in cache:  # the bug: the first answer is kept for ever
            cache[producer_id] = real(self, producer_id)
        return cache[producer_id]

    ProducerRegistry._get = get  # type: ignore[method-assign]


BUGS: dict[str, tuple[Callable[[], None], str]] = {
    "register-overwrites": (_register_overwrites, "double-winner"),
    "unpinned-delete": (_unpinned_delete, "snapshot-deleted-while-leased"),
    "renew-after-expiry": (_renew_after_expiry, "resurrected-lease"),
    "stale-producer-read": (_stale_producer_read, "stale-read"),
}


def planted_command(bug: str) -> list[str]:
    """The command that runs ``snapcoord`` with ``bug`` (arguments such as ``serve ...`` follow)."""
    if bug not in BUGS:
        raise ValueError(f"unknown planted bug {bug!r}; known: {sorted(BUGS)}")
    return ["/usr/bin/env", f"PYTHONPATH={TESTS_DIR}", sys.executable, "-m", "robustness.planted", bug]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in BUGS:
        print(
            f"usage: python -m robustness.planted {{{','.join(sorted(BUGS))}}} serve ARGS...", file=sys.stderr
        )
        return 2
    BUGS[args[0]][0]()
    from snapcoord.coordinator.cli import main as snapcoord_main

    return snapcoord_main(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
