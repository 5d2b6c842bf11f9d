"""This tree's coordinator with a planted incompatibility, to prove that the rolling-upgrade check
catches one: it writes leases in format version 9 (and reads them), which no release reads, as a
release would that changed a format without the previous one knowing it.

``python -m upgrades.planted_format serve ARGS...`` patches the lease codec in this process, then
runs the ``snapcoord`` command line; ``planted_command()`` is that command for the harness. Nothing
outside ``tests/`` imports this.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
PLANTED_LEASE_VERSION = 9


def planted_command() -> tuple[str, ...]:
    """The command that runs the planted ``snapcoord`` (arguments such as ``serve ...`` follow)."""
    return ("/usr/bin/env", f"PYTHONPATH={TESTS_DIR}", sys.executable, "-m", "upgrades.planted_format")


def main(argv: Sequence[str] | None = None) -> int:
    from snapcoord.coordinator.domain import leases

    leases.LEASE_VERSION = PLANTED_LEASE_VERSION  # read at each encode and decode
    from snapcoord.coordinator.cli import main as snapcoord_main

    return snapcoord_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
