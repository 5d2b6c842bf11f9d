"""More than one core: ``snapcoord serve --processes N`` beside N replicas, at c=64, in one run.

    bench/run scale_out [--seconds 1.0] [--rounds 3] [--clients 64] [--client-processes 4]
                        [--max 3] [--only health,mix] [--smoke]

On one ZooKeeper and one SeaweedFS (loopback, started here) it starts, all sharing one metadata
root and one bucket prefix (one deployment's state):

- ``--max`` replicas: separate ``snapcoord serve --processes 1`` on separate ports;
- for each N from 2 to ``--max``, one ``snapcoord serve --processes N`` (N workers sharing its
  port with SO_REUSEPORT, and their supervisor).

The configurations measured: 1 process (the first replica: one process and one replica are the
same deployment), N processes, and N replicas (the first N). Every configuration is reached the
way the client reaches a deployment: a channel made with ``CoordinatorClient``'s options
(``round_robin`` over every address of the target) on the target it makes of the configuration's
addresses (``ipv4:127.0.0.1:A,127.0.0.1:B``), one channel per client thread, as if each thread
were its own driver. So with replicas every channel spreads its calls over all of them, and with
``--processes N`` the kernel spreads the channels' connections over the workers (a single channel
would reach only one worker).

The calls are ``hot_rpcs``' own (its ``Stubs`` and op builders): a health check, a cached
GetCurrentSnapshot, RegisterProducerOffsets, CreateSnapshot, ReportProgress on 100 partitions,
the lease pair (AcquireSnapshots + RenewLease: one op, two calls) and a mix that runs the six in
turn. The load comes from ``--client-processes`` processes (multiprocessing, spawned) of
``--clients`` / ``--client-processes`` threads each, so that one client's GIL is not the limit.

The configurations are interleaved: each round runs every row on every configuration for
``--seconds``, in an order that rotates round by round, so that load from other jobs on the
machine hits all alike. Printed per row and configuration: ops/s, the ratio to 1 process (median
of the per-round ratios, and their band), p50 and p99 latency, server CPU per op (user + system of
every process of the configuration, supervisors included, from /proc) and the cores it kept busy
(server CPU seconds per second), the ZooKeeper requests per op (counted by ZooKeeper on the
coordinators' sessions, its ``cons`` command; below 1 where concurrent transactions share one
``multi``, so it moves with timing too), the clients' CPU per op, the whole machine's busy share
(/proc/stat), and the busiest server process's share of the server CPU (1/N is an even spread).
``--smoke`` runs every row once, briefly, with ``--max 2`` (CI does this: it proves the benchmark
runs, it measures nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import grpc
from common import for_seconds, real_servers
from cpu_per_call import cpu_s
from hot_rpcs import (
    Op,
    Stubs,
    cached_read_op,
    create_snapshot_op,
    health_op,
    lease_pair_op,
    make_read_apps,
    register_op,
    report_progress_op,
    session_requests,
)

from harness.coordinator import CoordinatorProcess
from snapcoord.client._channel import normalize_target
from snapcoord.client.client import DEFAULT_GRPC_OPTIONS

#: The rows, in the order printed.
ROWS = (
    "Health",
    "GetCurrentSnapshot, cached",
    "RegisterProducerOffsets (10 offsets)",
    "CreateSnapshot (4 tasks)",
    "ReportProgress, 100 partitions",
    "AcquireSnapshots + RenewLease (one op)",
    "mix of the six, in turn",
)

#: The tag of the apps every configuration reads (made once: the configurations share the root).
READ_TAG = "shared"


@dataclass(frozen=True)
class Configuration:
    """What is measured: ``addresses`` the client's target lists, ``pids`` the server processes
    whose CPU counts (resolved when the slices start: with ``--processes N`` its supervisor and
    multiprocessing's resource tracker too)."""

    name: str
    addresses: tuple[str, ...]
    pids: Callable[[], list[int]]
    #: How many processes serve calls (a ``--processes N`` supervisor serves none).
    serving: int


@dataclass(frozen=True)
class Command:
    """A slice for every client process: ``row`` on configuration ``config`` for ``seconds``
    (0: ``warmup`` calls per thread, untimed)."""

    config: int
    row: str
    seconds: float
    warmup: int = 0


@dataclass(frozen=True)
class SliceResult:
    """One client process's slice: its ops, seconds, each op's latency, and its own CPU seconds."""

    ops: int
    elapsed_s: float
    latencies_s: list[float]
    cpu_s: float


@dataclass
class Cell:
    """A row on a configuration, over the rounds."""

    ops_per_s: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    ops: int = 0
    elapsed_s: float = 0.0
    #: ZooKeeper requests the coordinators sent (counted by ZooKeeper on their sessions).
    zk_requests: int = 0
    busy: list[float] = field(default_factory=list)
    #: Server CPU seconds per process, summed over the rounds.
    per_process_s: dict[int, float] = field(default_factory=dict)


# --- the client processes ------------------------------------------------------------------------


def channel_options() -> list[tuple[str, object]]:
    """``CoordinatorClient``'s channel options (``round_robin`` over every address), and a
    subchannel pool of the channel's own, so that each channel opens its own connections."""
    return [*DEFAULT_GRPC_OPTIONS.items(), ("grpc.use_local_subchannel_pool", 1)]


def six_ops(stubs: Stubs, tag: str) -> list[Op]:
    """The six calls' ops on ``stubs``, in the order of ``ROWS``: new ids carry ``tag``, and
    ReportProgress reports on the job ``job-{tag}`` (marked here)."""
    return [
        health_op(stubs),
        cached_read_op(stubs, READ_TAG),
        register_op(stubs, tag),
        create_snapshot_op(stubs, tag),
        report_progress_op(stubs, f"job-{tag}"),
        lease_pair_op(stubs, tag),
    ]


def build_ops(stubs: Stubs, tag: str) -> dict[str, Op]:
    """Every row's op on ``stubs`` (``tag``: one per configuration and client process). The mix
    has ops of its own tag: its call numbers restart at 0, and a producer or lease id used again
    would be answered as a retry instead of being registered or acquired."""
    ops = dict(zip(ROWS, six_ops(stubs, tag), strict=False))
    mix = six_ops(stubs, f"{tag}-mix")
    ops[ROWS[-1]] = lambda c, k: mix[(c + k) % len(mix)](c, k)
    return ops


def client_main(
    conn: Connection, index: int, threads: int, configs: list[tuple[str, ...]], run_id: str
) -> None:
    """A client process: ``threads`` threads (global client numbers ``index * threads`` on), one
    channel each per configuration; runs the parent's ``Command``s until it sends None."""
    base = index * threads
    channels: list[grpc.Channel] = []
    ops: list[dict[str, Op]] = []
    for n, addresses in enumerate(configs):
        mine = [
            grpc.insecure_channel(normalize_target(list(addresses)), options=channel_options())
            for _ in range(threads)
        ]
        channels += mine
        ops.append(build_ops(Stubs(mine), f"{run_id}-{n}-{index}"))
    start_at: dict[tuple[int, str], list[int]] = {}
    conn.send("ready")
    try:
        while (command := conn.recv()) is not None:
            op = ops[command.config][command.row]
            at = start_at.setdefault((command.config, command.row), [0] * threads)
            if command.seconds == 0:
                for c in range(threads):
                    for _ in range(command.warmup):
                        op(base + c, at[c])
                        at[c] += 1
                conn.send(SliceResult(0, 0.0, [], 0.0))
                continue
            latencies: list[float] = []

            def step(c: int, k: int, op: Op = op, latencies: list[float] = latencies) -> None:
                started = time.perf_counter()
                op(base + c, k)
                latencies.append(time.perf_counter() - started)

            before = _own_cpu_s()
            before_ops = sum(at)
            elapsed = for_seconds(threads, command.seconds, step, at)
            conn.send(SliceResult(sum(at) - before_ops, elapsed, latencies, _own_cpu_s() - before))
    finally:
        for channel in channels:
            channel.close()


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Clients:
    """The client processes, driven slice by slice."""

    def __init__(self, processes: int, threads: int, configs: list[Configuration], run_id: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        addresses = [c.addresses for c in configs]
        for index in range(processes):
            parent, child = context.Pipe()
            proc = context.Process(
                target=client_main,
                args=(child, index, threads, addresses, run_id),
                name=f"scale-out-client-{index}",
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:  # each has made its channels (and marked its backlog jobs)
            if conn.recv() != "ready":
                raise RuntimeError("a client process did not start")

    def run(self, command: Command) -> list[SliceResult]:
        for conn in self.conns:
            conn.send(command)
        results = []
        for conn, proc in zip(self.conns, self.procs, strict=True):
            try:
                results.append(conn.recv())
            except EOFError:
                raise RuntimeError(f"{proc.name} exited (code {proc.exitcode}): its error is above") from None
        return results

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # that process is gone already; joined below
                conn.send(None)
        for proc in self.procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()


# --- the servers ---------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # exited meanwhile
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs so far (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextmanager
def deployments(zk_hosts: str, bucket: str, most: int, tmp: Path) -> Iterator[list[Configuration]]:
    """The replicas and the ``--processes N`` servers on one root; yields the configurations in
    the order printed: 1 process, 2..most processes, 2..most replicas."""
    run_id = uuid.uuid4().hex[:8]
    args = [
        "--metadata", f"zk://{zk_hosts}/bench-{run_id}", "--blobs", f"s3://{bucket}/bench-{run_id}",
        "--cleanup-interval", "0s", "--log-level", "WARNING",
    ]  # fmt: skip
    with ExitStack() as stack:
        replicas = [
            CoordinatorProcess(tmp / f"replica-{i}", args=args, start_timeout_s=180) for i in range(most)
        ]
        many = {
            n: CoordinatorProcess(tmp / f"p{n}", args=[*args, "--processes", str(n)], start_timeout_s=180)
            for n in range(2, most + 1)
        }
        servers = [*replicas, *many.values()]

        def stop_all() -> None:
            """Stop every server that started, all at once (each drains its calls first)."""
            with ThreadPoolExecutor(len(servers)) as pool:
                list(pool.map(lambda server: server.__exit__(None, None, None), servers))

        stack.callback(stop_all)
        with ThreadPoolExecutor(len(servers)) as pool:  # they start at once: mostly waiting
            list(pool.map(CoordinatorProcess.start, servers))

        def workers(proc: CoordinatorProcess, n: int) -> Callable[[], list[int]]:
            def pids() -> list[int]:
                found = children_of(proc.pid)  # the workers, and multiprocessing's resource tracker
                spawned = [p for p in found if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
                if len(spawned) != n:
                    raise RuntimeError(f"--processes {n} runs {len(spawned)} workers, not {n}")
                return [proc.pid, *found]

            return pids

        def each(chosen: list[CoordinatorProcess]) -> Callable[[], list[int]]:
            return lambda: [r.pid for r in chosen]

        configs = [Configuration("1 process = 1 replica", (replicas[0].target,), each(replicas[:1]), 1)]
        configs += [Configuration(f"{n} processes", (p.target,), workers(p, n), n) for n, p in many.items()]
        configs += [
            Configuration(f"{n} replicas", tuple(r.target for r in replicas[:n]), each(replicas[:n]), n)
            for n in range(2, most + 1)
        ]
        yield configs


# --- the run -------------------------------------------------------------------------------------


def measure(
    clients: Clients,
    configs: list[Configuration],
    rows: list[str],
    rounds: int,
    seconds: float,
    warmup: int,
    zk_hosts: str,
) -> dict[tuple[str, int], Cell]:
    """Every row on every configuration, ``rounds`` times, the configurations' order rotating.
    ZooKeeper requests are those of every coordinator session (the idle ones send only pings)."""
    cells = {(row, n): Cell() for row in rows for n in range(len(configs))}
    for row in rows if warmup else []:
        for n in range(len(configs)):
            clients.run(Command(n, row, 0, warmup))
    pids = [c.pids() for c in configs]
    for r in range(rounds):
        for row in rows:
            order = list(range(len(configs)))
            order = order[r % len(order) :] + order[: r % len(order)]
            for n in order:
                cell = cells[row, n]
                cpu_before = {pid: cpu_s(pid) for pid in pids[n]}
                busy_before = machine_busy()
                requests_before = session_requests(zk_hosts, set())
                results = clients.run(Command(n, row, seconds))
                cell.zk_requests += session_requests(zk_hosts, set()) - requests_before
                busy_after = machine_busy()
                for pid in pids[n]:
                    cell.per_process_s[pid] = cell.per_process_s.get(pid, 0.0) + cpu_s(pid) - cpu_before[pid]
                ops = sum(x.ops for x in results)
                if ops == 0:
                    raise RuntimeError(f"{row} on {configs[n].name}: no op finished in {seconds}s")
                cell.ops += ops
                elapsed = statistics.mean(x.elapsed_s for x in results)
                cell.elapsed_s += elapsed
                cell.ops_per_s.append(ops / elapsed)
                for x in results:
                    cell.latencies_s += x.latencies_s
                    cell.client_cpu_s += x.cpu_s
                cell.busy.append((busy_after[0] - busy_before[0]) / max(1, busy_after[1] - busy_before[1]))
            print(f"round {r + 1}/{rounds}: {row} done", flush=True)
    for cell in cells.values():
        cell.server_cpu_s = sum(cell.per_process_s.values())
    return cells


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def report(cells: dict[tuple[str, int], Cell], configs: list[Configuration], rows: list[str]) -> None:
    """One markdown table per row: the configurations side by side."""
    for row in rows:
        print(f"\n### {row}\n")
        print(
            "| configuration | ops/s | vs 1 process (band) | p50 ms | p99 ms | server CPU ms/op "
            "| server cores | ZooKeeper requests/op | client CPU ms/op | machine busy | busiest process |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        one = cells[row, 0]
        for n, config in enumerate(configs):
            cell = cells[row, n]
            ratios = [x / y for x, y in zip(cell.ops_per_s, one.ops_per_s, strict=True)]
            band = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            share = max(cell.per_process_s.values()) / max(cell.server_cpu_s, 1e-9)
            print(
                f"| {config.name} | {statistics.median(cell.ops_per_s):,.0f} | {band} "
                f"| {statistics.median(cell.latencies_s) * 1000:.1f} "
                f"| {percentile(cell.latencies_s, 0.99) * 1000:.1f} "
                f"| {cell.server_cpu_s * 1000 / cell.ops:.2f} | {cell.server_cpu_s / cell.elapsed_s:.2f} "
                f"| {cell.zk_requests / cell.ops:.2f} "
                f"| {cell.client_cpu_s * 1000 / cell.ops:.2f} "
                f"| {statistics.median(cell.busy):.0%} | {share:.2f} of {config.serving} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one slice (default 1.0)")
    parser.add_argument("--rounds", type=int, default=3, help="slices per row and configuration (default 3)")
    parser.add_argument("--clients", type=int, default=64, help="client threads in all (default 64)")
    parser.add_argument("--client-processes", type=int, default=4, help="processes they run in (default 4)")
    parser.add_argument("--max", type=int, default=3, help="most processes and replicas (default 3)")
    parser.add_argument(
        "--only", default="", help="comma-separated parts of row names to run (case-insensitive)"
    )
    parser.add_argument("--smoke", action="store_true", help="every row once, briefly, up to 2 (CI)")
    args = parser.parse_args()
    warmup = 5
    if args.smoke:
        args.seconds, args.rounds, args.clients, args.client_processes, args.max, warmup = 0.2, 1, 4, 2, 2, 0
    if args.clients % args.client_processes:
        parser.error("--clients must be a multiple of --client-processes")
    only = [o.strip().lower() for o in args.only.split(",") if o.strip()]
    rows = [r for r in ROWS if not only or any(o in r.lower() for o in only)]
    threads = args.clients // args.client_processes
    with real_servers() as (zk, s3), tempfile.TemporaryDirectory(prefix="snapcoord-bench-scale-out-") as tmp:
        os.environ.update(s3.env())  # the servers' S3 endpoint and keys (they inherit them)
        print(
            f"# scale_out: c={args.clients} ({args.client_processes} client processes x {threads} threads), "
            f"{args.rounds} rounds x {args.seconds}s slices, configurations interleaved; "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start; ZooKeeper {zk.hosts}; "
            f"S3 {s3.endpoint_url}",
            flush=True,
        )
        started = time.perf_counter()
        with deployments(zk.hosts, s3.bucket, args.max, Path(tmp)) as configs:
            print(f"servers up in {time.perf_counter() - started:.1f}s", flush=True)
            channel = grpc.insecure_channel(configs[0].addresses[0])
            make_read_apps(Stubs([channel]), READ_TAG, args.clients, os.urandom(1024))
            channel.close()
            clients = Clients(args.client_processes, threads, configs, uuid.uuid4().hex[:6])
            try:
                cells = measure(clients, configs, rows, args.rounds, args.seconds, warmup, zk.hosts)
            finally:
                clients.close()
        print(f"\n## c={args.clients}, load {os.getloadavg()[0]:.1f} at the end")
        report(cells, configs, rows)


if __name__ == "__main__":
    main()
