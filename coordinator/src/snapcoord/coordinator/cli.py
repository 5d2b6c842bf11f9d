"""The ``snapcoord`` command: ``snapcoord serve [flags]``, ``snapcoord health`` and ``--version``.

Exit codes: 0 after a clean shutdown, 2 for a bad flag or ``SNAPCOORD_*`` value (named in the
message), 1 when the coordinator cannot start (a store unreachable, the port taken).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from snapcoord.coordinator import __version__
from snapcoord.coordinator.config import options, settings
from snapcoord.coordinator.observability import logging_setup

_log = logging.getLogger("snapcoord")


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``snapcoord`` parser and its ``serve`` subparser (which reports config errors)."""
    parser = argparse.ArgumentParser(
        prog="snapcoord",
        description="snapcoord: a snapshot coordinator for streaming pipelines (gRPC on ZooKeeper and S3).",
    )
    parser.add_argument("--version", action="version", version=f"snapcoord {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the coordinator",
        description=(
            "Run the coordinator. Every flag can also be set by its SNAPCOORD_* environment variable; "
            "a flag wins over the environment, the environment over the default. Durations need a unit: "
            "500ms, 10s, 5m, 24h, 7d."
        ),
    )
    options.add_arguments(serve)
    health = commands.add_parser(
        "health",
        help="check a coordinator's gRPC health (exit 0 when SERVING)",
        description="Call grpc.health.v1.Health/Check; exit 0 when SERVING, 1 otherwise (for healthchecks).",
    )
    health.add_argument(
        "--target",
        default=None,
        help="HOST:PORT of the coordinator (default 127.0.0.1:$SNAPCOORD_PORT, or 127.0.0.1:50051)",
    )
    health.add_argument("--service", default="", help="service name to check (default: the whole server)")
    health.add_argument("--timeout", default="5s", help="deadline of the call (default 5s)")
    return parser, serve


def _health(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        timeout_ms = options.parse_duration_ms(args.timeout)
    except ValueError as e:
        parser.error(f"--timeout: {e}")
    target = args.target or f"127.0.0.1:{os.environ.get('SNAPCOORD_PORT') or 50051}"
    from snapcoord.coordinator.server.probe import check

    code, report = check(target, service=args.service, timeout_s=timeout_ms / 1000)
    print(report)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser, serve_parser = build_parsers()
    args = parser.parse_args(argv)
    if args.command == "health":
        return _health(args, parser)
    try:
        cfg = settings.load({k: v for k, v in vars(args).items() if k != "command"}, os.environ)
        # Limits that fit no ZooKeeper request are a config error too, told before anything starts.
        from snapcoord.coordinator.server.worst_requests import check_lease_requests_fit

        check_lease_requests_fit(cfg)
    except settings.ConfigError as e:
        serve_parser.error(str(e))  # exits 2 with usage
    logging_setup.configure(cfg.logging.level, cfg.logging.format, stream=sys.stderr)
    # Imported here so that --help and config errors do not pay for grpc and the backends.
    from snapcoord.coordinator.errors import SnapcoordError
    from snapcoord.coordinator.server.app import run
    from snapcoord.coordinator.server.malloc_tuning import return_large_blocks_to_the_os

    return_large_blocks_to_the_os()  # before any payload buffer: RSS follows the payload budget

    try:
        return run(cfg)
    except (SnapcoordError, OSError, ValueError) as e:
        _log.error("snapcoord failed: %s", e, exc_info=_log.isEnabledFor(logging.DEBUG))
        return 1


if __name__ == "__main__":
    sys.exit(main())
