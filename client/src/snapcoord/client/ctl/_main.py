"""Parse, connect, run one command, print its result; map failures to the exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from snapcoord.client.ctl._commands import Command
from snapcoord.client.ctl._connect import UsageError, connect
from snapcoord.client.ctl._parser import PROG, build_parser, parse
from snapcoord.client.ctl._render import render_json, render_tables
from snapcoord.client.errors import SnapcoordError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, None if argv is None else list(argv))  # exits 2 on a usage error
    command: Command = args.command
    try:
        client = connect(args)
    except UsageError as e:
        args.command_parser.print_usage(sys.stderr)
        print(f"{args.command_parser.prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    with client:
        try:
            output = command.run(client, args)
        except SnapcoordError as e:
            # str(e): "CODE [REASON]: message (Method)", the coordinator's words unchanged.
            print(f"{PROG}: {e}", file=sys.stderr)
            return EXIT_REFUSED
    try:
        print(render_json(output) if args.output == "json" else render_tables(output), flush=True)
    except BrokenPipeError:
        # The reader stopped early (``| head``): not an error of the command. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK
