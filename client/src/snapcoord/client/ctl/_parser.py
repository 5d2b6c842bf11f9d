"""The ``snapcoordctl`` argument parser, built from the table of commands.

The connection and output options are accepted before the resource and after the verb alike
(``snapcoordctl --target h:p leases list`` and ``snapcoordctl leases list --target h:p``): they
are defined on the top parser and on every command's parser with no default, and ``parse()``
fills in the ones given nowhere (``DEFAULTS``).
"""

from __future__ import annotations

import argparse
import re

from snapcoord.client.ctl._commands import COMMANDS, Command

PROG = "snapcoordctl"
OUTPUTS = ("table", "json")
#: Values of options given nowhere on the command line.
DEFAULTS = {
    "target": None,
    "ca": None,
    "cert": None,
    "key": None,
    "server_name": None,
    "token_file": None,
    "timeout": "30s",
    "output": "table",
}

_SUBJECT = {
    "producers": "producer records",
    "snapshots": "an application's generation snapshots",
    "leases": "snapshot leases",
    "backlog": "a job's backlog mark",
    "claims": "a sink table's fence and commit claims",
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0}


def timeout_s(text: str) -> float:
    """A duration with its unit (``500ms``, ``30s``, ``2m``) in seconds, more than 0."""
    match = _DURATION.fullmatch(text)
    if not match or float(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"a duration above 0 with a unit (500ms, 30s, 2m), got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    conn = common.add_argument_group("connection (the same settings as the Python client)")
    conn.add_argument(
        "--target", metavar="HOST:PORT", help="the coordinator: HOST:PORT or any gRPC target (required)"
    )
    conn.add_argument(
        "--ca",
        metavar="FILE",
        help="PEM bundle that signs the coordinator's certificate (turns TLS on; "
        "default: $SNAPCOORD_CLIENT_CA)",
    )
    conn.add_argument(
        "--cert",
        metavar="FILE",
        help="client certificate for mutual TLS, with --key (default: $SNAPCOORD_CLIENT_CERT)",
    )
    conn.add_argument(
        "--key", metavar="FILE", help="client key for mutual TLS (default: $SNAPCOORD_CLIENT_KEY)"
    )
    conn.add_argument(
        "--server-name",
        metavar="NAME",
        help="the name to check the server certificate against (default: $SNAPCOORD_CLIENT_SERVER_NAME)",
    )
    conn.add_argument(
        "--token-file",
        metavar="FILE",
        help="file whose first line is the bearer token (default: $SNAPCOORD_TOKEN or $SNAPCOORD_TOKEN_FILE)",
    )
    conn.add_argument(
        "--timeout", metavar="DURATION", help="deadline of each call, retries included (default 30s)"
    )
    common.add_argument("-o", "--output", choices=OUTPUTS, help="table (default) or json: one JSON document")
    return common


def _add_command(
    resource: argparse._SubParsersAction[argparse.ArgumentParser],
    command: Command,
    common: argparse.ArgumentParser,
) -> None:
    parser = resource.add_parser(
        command.verb,
        parents=[common],
        help=command.help,
        description=command.help[:1].upper() + command.help[1:] + ".",
    )
    for p in command.positionals:
        parser.add_argument(
            p.dest, type=p.parse, help=p.help, nargs="+" if p.many else None, metavar=p.dest.upper()
        )
    if command.listing:
        parser.add_argument(
            "--limit",
            type=int,
            default=0,
            help="stop after this many (default: all); next_page_token continues",
        )
        parser.add_argument("--page-token", default="", help="continue a listing from its next_page_token")
    if command.destructive:
        parser.add_argument("--yes", action="store_true", help="confirm: this changes stored state")
    if command.options is not None:
        command.options(parser)
    parser.set_defaults(command=command, command_parser=parser)


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog=PROG,
        parents=[common],
        description=(
            "List, show and delete a snapcoord coordinator's records: producer records, generation "
            "snapshots, leases, backlog marks and sinks' commit claims. Exit codes: 0 done, 1 refused by "
            "the coordinator (not found, permission denied, unreachable...; the status and message on "
            "stderr), 2 usage."
        ),
    )
    resources = parser.add_subparsers(dest="resource", required=True, metavar="RESOURCE")
    verbs: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for command in COMMANDS:
        if command.resource not in verbs:
            names = ", ".join(c.verb for c in COMMANDS if c.resource == command.resource)
            sub = resources.add_parser(command.resource, help=f"{_SUBJECT[command.resource]}: {names}")
            verbs[command.resource] = sub.add_subparsers(dest="verb", required=True, metavar="VERB")
        _add_command(verbs[command.resource], command, common)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, fill in the defaults, and refuse what argparse cannot check (exit 2)."""
    args = parser.parse_args(argv)
    for name, value in DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    # Refusals print the command's own usage line, where its arguments are.
    leaf: argparse.ArgumentParser = args.command_parser
    if not args.target:
        leaf.error("--target is required (the coordinator's HOST:PORT)")
    try:
        args.timeout = timeout_s(args.timeout)
    except argparse.ArgumentTypeError as e:
        leaf.error(f"--timeout: {e}")
    command: Command = args.command
    if command.listing and args.limit < 0:
        leaf.error(f"--limit: 0 (all) or more, got {args.limit}")
    if command.destructive and not args.yes:
        leaf.error(f"'{command.resource} {command.verb}' changes stored state: add --yes to confirm")
    return args
