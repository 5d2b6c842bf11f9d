"""Every ``snapcoordctl RESOURCE VERB``: its arguments, and what it calls and prints.

Each command makes the ``CoordinatorClient`` calls its verb names (the RPC of docs/api.md with the
same name: ``delete`` is DeleteProducerOffsets or DeleteSnapshot, ``abort`` AbortSnapshot,
``release`` ReleaseSnapshots, ``drop`` DropLease, ``clear`` ClearBacklog) and returns an ``Output``.
A delete that finds nothing to delete raises ``NotFound``, like a get of something absent, so a
script sees the same exit code for both. The API lists applications and backlog jobs by no RPC,
so ``snapshots`` and ``backlog`` commands take the app or job id.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from snapcoord.client._types import (
    BacklogStatus,
    CommitClaims,
    Lease,
    Page,
    ProducerSnapshot,
    Snapshot,
    SnapshotRef,
)
from snapcoord.client.client import CoordinatorClient
from snapcoord.client.ctl._render import Output, Table, duration, fields, instant, joined, to_json
from snapcoord.client.errors import NotFound

T = TypeVar("T")
R = TypeVar("R")
Handler = Callable[[CoordinatorClient, argparse.Namespace], Output]

#: With ``--limit``, pages ask for what is left up to this many records, so the last page ends
#: exactly at the limit and its ``next_page_token`` continues after it. Every List RPC accepts it
#: (their maximum is 1000). Without a limit, pages are the server's default size.
_LIMITED_PAGE_MAX = 100


@dataclass(frozen=True)
class Positional:
    """A positional argument: ``dest`` in the namespace, its parser (``str`` by default)."""

    dest: str
    help: str
    parse: Callable[[str], object] = str
    many: bool = False


@dataclass(frozen=True)
class Command:
    resource: str
    verb: str
    help: str
    run: Handler
    positionals: tuple[Positional, ...] = ()
    #: Changes or removes stored state: refused without ``--yes``.
    destructive: bool = False
    #: Takes ``--limit`` and ``--page-token``.
    listing: bool = False
    #: Adds the command's own flags.
    options: Callable[[argparse.ArgumentParser], None] | None = None


def generation(text: str) -> int:
    """A generation number (an integer, 1 or more)."""
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a generation is a positive integer, got {text!r}")
    return int(text)


def snapshot_ref(text: str) -> SnapshotRef:
    """``APP_ID@GENERATION`` (application ids cannot hold ``@``)."""
    app_id, at, gen = text.rpartition("@")
    if not at or not app_id:
        raise argparse.ArgumentTypeError(f"a snapshot is APP_ID@GENERATION, got {text!r}")
    return SnapshotRef(app_id, generation(gen))


def _collect(fetch: Callable[[int, str], Page[T]], args: argparse.Namespace) -> tuple[list[T], str]:
    """Items from ``args.page_token`` on: every page, or ``args.limit`` items when it is set; and
    the token that continues after them ("" once the last page was read)."""
    items: list[T] = []
    token: str = args.page_token
    while True:
        page = fetch(min(args.limit - len(items), _LIMITED_PAGE_MAX) if args.limit else 0, token)
        items.extend(page.items)
        token = page.next_page_token
        if not token or (args.limit and len(items) >= args.limit):
            return items, token


def _listing(items: list[T], token: str, table: Table) -> Output:
    return Output({"items": to_json(items), "next_page_token": token}, (table,))


def _record(value: R, tables: Callable[[R], tuple[Table, ...]]) -> Output:
    """One record: itself as the JSON document, ``tables(value)`` as the table view."""
    return Output(to_json(value), tables(value))


def _deleted(done: bool, what: str, method: str, **ids: object) -> Output:
    """``{"deleted": true, **ids}`` after a delete that found ``what``; ``NotFound`` when it did not."""
    if not done:
        raise NotFound(f"no {what} to delete", method=method)
    return Output({"deleted": True, **ids}, (fields(("deleted", what)),))


# -- producers -----------------------------------------------------------------------------------


def _producer_tables(p: ProducerSnapshot) -> tuple[Table, ...]:
    head = fields(
        ("producer_id", p.producer_id),
        ("created", instant(p.created_at_ms)),
        ("expires", instant(p.expires_at_ms)),
    )
    offsets = Table(
        ("STREAM", "PARTITION", "OFFSET"),
        tuple((o.stream, str(o.partition), str(o.offset)) for o in p.offsets),
        title="offsets:",
    )
    return head, offsets


def list_producers(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    items, token = _collect(
        lambda size, tok: client.list_producer_offsets(page_size=size, page_token=tok), args
    )
    rows = tuple(
        (p.producer_id, str(len(p.offsets)), instant(p.created_at_ms), instant(p.expires_at_ms))
        for p in items
    )
    return _listing(items, token, Table(("PRODUCER_ID", "OFFSETS", "CREATED", "EXPIRES"), rows))


def get_producer(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.get_producer_offsets(args.producer_id), _producer_tables)


def delete_producer(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    done = client.delete_producer_offsets(args.producer_id)
    return _deleted(
        done, f"producer record {args.producer_id!r}", "DeleteProducerOffsets", producer_id=args.producer_id
    )


# -- snapshots -----------------------------------------------------------------------------------


def _snapshot_tables(s: Snapshot) -> tuple[Table, ...]:
    head = fields(
        ("app_id", s.app_id),
        ("generation", str(s.generation)),
        ("state", s.state.value),
        ("created", instant(s.created_at_ms)),
        ("completed", instant(s.completed_at_ms)),
        ("expires", instant(s.expires_at_ms)),
        ("abort_reason", s.abort_reason or "-"),
        ("labels", joined([f"{k}={v}" for k, v in sorted(s.labels.items())])),
        ("task_ids", joined(s.task_ids)),
    )
    if not s.tasks:
        return (head,)
    tasks = Table(
        ("TASK_ID", "OFFSETS", "CHECKPOINT_STORES"),
        tuple(
            (t.task_id, str(len(t.committed_offsets)), joined(sorted({*t.checkpoints, *t.uploads})))
            for t in s.tasks
        ),
        title="reported tasks:",
    )
    return head, tasks


def list_snapshots(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    items, token = _collect(
        lambda size, tok: client.list_snapshots(args.app_id, page_size=size, page_token=tok), args
    )
    rows = tuple(
        (
            str(s.generation),
            s.state.value,
            str(len(s.task_ids)),
            instant(s.created_at_ms),
            instant(s.completed_at_ms),
            instant(s.expires_at_ms),
            s.abort_reason or "-",
        )
        for s in items
    )
    columns = ("GENERATION", "STATE", "TASKS", "CREATED", "COMPLETED", "EXPIRES", "ABORT_REASON")
    return _listing(items, token, Table(columns, rows))


def current_snapshot(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.get_current_snapshot(args.app_id, consistent=args.consistent), _snapshot_tables)


def get_snapshot(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.get_snapshot(args.app_id, args.generation), _snapshot_tables)


def abort_snapshot(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.abort_snapshot(args.app_id, args.generation, args.reason), _snapshot_tables)


def delete_snapshot(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    done = client.delete_snapshot(args.app_id, args.generation)
    name = f"snapshot {args.app_id}@{args.generation}"
    return _deleted(done, name, "DeleteSnapshot", app_id=args.app_id, generation=args.generation)


def _current_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--consistent",
        action="store_true",
        help="read through to the metadata store instead of the coordinator's cache",
    )


def _abort_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reason", default="", help="why (stored as the snapshot's abort_reason)")


# -- leases --------------------------------------------------------------------------------------


def _lease_tables(lease: Lease) -> tuple[Table, ...]:
    head = fields(
        ("lease_id", lease.lease_id),
        ("duration", duration(lease.duration_ms)),
        ("expires", instant(lease.expires_at_ms)),
    )
    pinned = Table(
        ("APP_ID", "GENERATION"),
        tuple((r.app_id, str(r.generation)) for r in lease.snapshots),
        title="pinned snapshots:",
    )
    return head, pinned


def list_leases(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    items, token = _collect(lambda size, tok: client.list_leases(page_size=size, page_token=tok), args)
    rows = tuple(
        (lease.lease_id, duration(lease.duration_ms), instant(lease.expires_at_ms), str(len(lease.snapshots)))
        for lease in items
    )
    return _listing(items, token, Table(("LEASE_ID", "DURATION", "EXPIRES", "SNAPSHOTS"), rows))


def get_lease(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.get_lease(args.lease_id), _lease_tables)


def release_lease(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.release_snapshots(args.lease_id, args.snapshots), _lease_tables)


def drop_lease(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    done = client.drop_lease(args.lease_id)
    return _deleted(done, f"lease {args.lease_id!r}", "DropLease", lease_id=args.lease_id)


# -- backlog -------------------------------------------------------------------------------------


def _backlog_tables(status: BacklogStatus) -> tuple[Table, ...]:
    head = fields(
        ("job_id", status.job_id),
        ("processing_backlog", str(status.processing_backlog).lower()),
        ("unmarked_partitions", str(status.unmarked_partitions)),
    )
    partitions = Table(
        ("STREAM", "PARTITION", "BOUNDARY", "POSITION", "FINISHED"),
        tuple(
            (p.stream, str(p.partition), str(p.boundary), str(p.position), str(p.finished).lower())
            for p in status.partitions
        ),
        title="partitions:",
    )
    return head, partitions


def get_backlog(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.get_backlog_status(args.job_id), _backlog_tables)


def clear_backlog(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    done = client.clear_backlog(args.job_id)
    return _deleted(done, f"backlog mark of job {args.job_id!r}", "ClearBacklog", job_id=args.job_id)


# -- commit claims -------------------------------------------------------------------------------


def _claims_tables(listed: CommitClaims) -> tuple[Table, ...]:
    head = fields(("fence_epoch", str(listed.fence_epoch)), ("next_seq", str(listed.next_seq)))
    claims = Table(
        ("SEQ", "EPOCH", "ATTEMPT", "CLAIMED"),
        tuple((str(c.seq), str(c.epoch), c.attempt, instant(c.claimed_at_ms)) for c in listed.claims),
        title="claims:",
    )
    return head, claims


def get_claims(client: CoordinatorClient, args: argparse.Namespace) -> Output:
    return _record(client.get_commit_claims(args.table_id, args.from_seq, args.limit), _claims_tables)


def _claims_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from-seq", type=int, default=0, metavar="N", help="the first log number to show")
    parser.add_argument(
        "--limit",
        type=int,
        default=0,
        metavar="N",
        help="at most this many claims (default: the server's 1000)",
    )


# -- the table of commands -----------------------------------------------------------------------

_PRODUCER = Positional("producer_id", "the producer id")
_APP = Positional("app_id", "the application id")
_GENERATION = Positional("generation", "the generation number", generation)
_LEASE = Positional("lease_id", "the lease id")
_JOB = Positional("job_id", "the backlog job id")
_TABLE = Positional("table_id", "the table id of a sink's commit claims")

COMMANDS: tuple[Command, ...] = (
    Command("producers", "list", "list producer records (live ones, by id)", list_producers, listing=True),
    Command("producers", "get", "show one producer record and its offsets", get_producer, (_PRODUCER,)),
    Command(
        "producers", "delete", "delete one producer record", delete_producer, (_PRODUCER,), destructive=True
    ),
    Command(
        "snapshots",
        "list",
        "list an application's snapshots, newest first",
        list_snapshots,
        (_APP,),
        listing=True,
    ),
    Command(
        "snapshots",
        "current",
        "show an application's current snapshot",
        current_snapshot,
        (_APP,),
        options=_current_options,
    ),
    Command(
        "snapshots", "get", "show one snapshot and its reported tasks", get_snapshot, (_APP, _GENERATION)
    ),
    Command(
        "snapshots",
        "abort",
        "abort a CREATED snapshot (the next one starts a new generation)",
        abort_snapshot,
        (_APP, _GENERATION),
        destructive=True,
        options=_abort_options,
    ),
    Command(
        "snapshots",
        "delete",
        "delete an ended snapshot and its checkpoints (refused while a lease pins it)",
        delete_snapshot,
        (_APP, _GENERATION),
        destructive=True,
    ),
    Command("leases", "list", "list leases", list_leases, listing=True),
    Command("leases", "get", "show one lease and the snapshots it pins", get_lease, (_LEASE,)),
    Command(
        "leases",
        "release",
        "unpin snapshots from a lease (the lease stays)",
        release_lease,
        (
            _LEASE,
            Positional("snapshots", "APP_ID@GENERATION of a snapshot to unpin", snapshot_ref, many=True),
        ),
        destructive=True,
    ),
    Command(
        "leases", "drop", "unpin everything and delete the lease", drop_lease, (_LEASE,), destructive=True
    ),
    Command("backlog", "get", "show a job's backlog boundaries and progress", get_backlog, (_JOB,)),
    Command(
        "backlog",
        "clear",
        "forget a job's backlog mark and progress",
        clear_backlog,
        (_JOB,),
        destructive=True,
    ),
    Command(
        "claims",
        "get",
        "show a table's fence and its commit claims, in log number order",
        get_claims,
        (_TABLE,),
        options=_claims_options,
    ),
)
