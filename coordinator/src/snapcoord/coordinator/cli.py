"""The ``snapcoord`` command: ``snapcoord serve [flags]``, ``snapcoord check-config [flags]``,
``snapcoord health`` and ``--version``.

Exit codes: 0 after a clean shutdown (``check-config``: a usable configuration), 2 for a bad
flag, ``SNAPCOORD_*`` variable or config file (named in the message), 1 when the coordinator
cannot start (a store unreachable, the port taken).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from snapcoord.coordinator import __version__
from snapcoord.coordinator.config import environment, options, settings
from snapcoord.coordinator.config import file as config_file
from snapcoord.coordinator.observability import logging_setup

_log = logging.getLogger("snapcoord")


_PRECEDENCE = (
    "Every flag can also be set by its SNAPCOORD_* environment variable, or in a YAML config file "
    "(--config; keys are the flags without --); a flag wins over the environment, the environment "
    "over the file, the file over the default. Durations need a unit: 500ms, 10s, 5m, 24h, 7d."
)


def _add_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"YAML file of settings, keys as the flags without -- (env {environment.CONFIG_FILE})",
    )
    options.add_arguments(parser)


def build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``snapcoord`` parser and its ``serve`` and ``check-config`` subparsers (which report
    config errors)."""
    parser = argparse.ArgumentParser(
        prog="snapcoord",
        description="snapcoord: a snapshot coordinator for streaming pipelines (gRPC on ZooKeeper and S3).",
    )
    parser.add_argument("--version", action="version", version=f"snapcoord {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the coordinator",
        description="Run the coordinator. " + _PRECEDENCE,
    )
    _add_settings(serve)
    check = commands.add_parser(
        "check-config",
        help="validate a configuration and print it (exit 0 when serve would accept it)",
        description=(
            "Validate the configuration serve would run with (the same flags, environment and file) "
            "and print each setting, where it came from, secrets redacted; exit 2 naming the first "
            "problem. Stores are not contacted. " + _PRECEDENCE
        ),
    )
    _add_settings(check)
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
    return parser, {"serve": serve, "check-config": check}


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


def _resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> settings.Resolved:
    """The configuration of ``serve``/``check-config``; a problem exits 2 naming it."""
    try:
        refused = environment.unknown_variable(os.environ)
        if refused is not None:
            raise settings.ConfigError(refused)
        path = args.config or os.environ.get(environment.CONFIG_FILE) or None
        file = config_file.read(path) if path is not None else None
        flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
        resolved = settings.resolve(flags, os.environ, file)
        # Limits that fit no ZooKeeper request are a config error too, told before anything starts.
        from snapcoord.coordinator.server.memory_bounds import check_memory_bounds
        from snapcoord.coordinator.server.worst_requests import check_lease_requests_fit

        check_lease_requests_fit(resolved.config)
        check_memory_bounds(resolved.config)
    except (settings.ConfigError, config_file.ConfigFileError) as e:
        parser.error(str(e))  # exits 2 with usage
    return resolved


def _warnings(cfg: settings.Config) -> tuple[str, ...]:
    storage = cfg.storage
    return environment.embedded_store_warnings(
        storage.metadata_uri, storage.blobs_uri, cfg.grpc.processes, os.environ
    )


def _check_config(resolved: settings.Resolved) -> int:
    """Print each setting, its value and where it came from; warnings go to stderr."""
    flags = {opt.name: opt.flag for opt in options.OPTIONS}
    envs = {opt.name: opt.env for opt in options.OPTIONS}
    width = max(len(flag) for flag in flags.values())
    print("# snapcoord serve would run with (flag > environment > file > default; secrets redacted):")
    for setting in resolved.settings:
        origin = {"environment": f"environment {envs[setting.name]}"}.get(setting.origin, setting.origin)
        value = setting.shown if setting.shown else "(none)"  # an optional file left unset
        print(f"{flags[setting.name]:<{width}}  {value}  ({origin})")
    from snapcoord.coordinator.server.memory_bounds import memory_bounds
    from snapcoord.coordinator.server.processes import process_count

    print("# memory, derived (docs/operations/memory.md):")
    for line in memory_bounds(resolved.config, process_count(resolved.config)).lines():
        print(f"#   {line}")
    for warning in _warnings(resolved.config):
        print(f"snapcoord check-config: warning: {warning}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, subparsers = build_parsers()
    args = parser.parse_args(argv)
    if args.command == "health":
        return _health(args, parser)
    resolved = _resolve(args, subparsers[args.command])
    if args.command == "check-config":
        return _check_config(resolved)
    cfg = resolved.config
    stream: TextIO = sys.stderr
    if logging_setup.resolve_format(cfg.logging.format, stream) == "json":
        stream = logging_setup.capture_stderr()  # gRPC's own lines become JSON lines too
    logging_setup.configure(cfg.logging.level, "json" if stream is not sys.stderr else "text", stream=stream)
    for warning in _warnings(cfg):
        _log.warning("%s", warning)
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
