"""The middleware floor: what snapcoord's interceptor chain costs a small call, beside a bare server.

    bench/run middleware_floor [--seconds 2] [--rounds 3] [--clients 1,16] [--other DIR] [--smoke]

Starts, each in its own process on loopback: a bare grpcio server (grpc_health's servicer, 32
handler threads, no interceptors), and two coordinators built as ``snapcoord serve`` builds them
on a real ZooKeeper and SeaweedFS (log level INFO), one with request admission (every unary
request held from a memory budget before gRPC receives it, ``server.admission``) and one without.
Then, in slices of ``--seconds`` alternating between the servers, ``c`` client threads (one
channel per server) call back to back:

- a health check on all three;
- GetCurrentSnapshot served from the cache (the whole chain: admission, auth, decoding, metrics)
  on the two coordinators.

Each slice records calls/s and the server process's CPU per call (user + system of all its
threads, from /proc). Printed: medians over the rounds, and the ratios of slices run next to each
other (median and band): snapcoord / bare for the health check, admission on / off for both
rows. With ``--other DIR`` the coordinator of another checkout (its sources first on PYTHONPATH)
joins both rows, and the ratios add this checkout / that one: before and after a change, in one
run. The clients share the machine's cores with the servers, so compare ratios of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from common import for_seconds, real_servers
from cpu_per_call import cpu_s
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapcoord.v1 import common_pb2, snapshot_pb2, snapshot_pb2_grpc

BARE = "bare grpcio"
OURS = "snapcoord"
NO_ADMISSION = "snapcoord, admission off"
OTHER = "snapcoord at --other"
KINDS = {BARE: "bare", OURS: "snapcoord", NO_ADMISSION: "no-admission", OTHER: "snapcoord"}


def serve_bare() -> tuple[int, Callable[[], object]]:
    """grpc_health's servicer on a plain grpcio server: 32 handler threads, no interceptors."""
    from concurrent.futures import ThreadPoolExecutor

    from grpc_health.v1 import health

    server = grpc.server(ThreadPoolExecutor(max_workers=32))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return port, lambda: server.stop(None)


def serve_snapcoord(metadata: str, blobs: str, *, admit: bool) -> tuple[int, Callable[[], object]]:
    """A coordinator built as ``snapcoord serve`` builds it (defaults, INFO log on stderr)."""
    from snapcoord.coordinator.config import settings as coordinator_config
    from snapcoord.coordinator.observability import logging_setup
    from snapcoord.coordinator.server.app import build_server
    from snapcoord.coordinator.services import Deps
    from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store

    logging_setup.configure("INFO", "text")
    deps = Deps(metadata=open_metadata_store(metadata), blobs=open_blob_store(blobs))
    flags = {"host": "127.0.0.1", "port": "0", "metrics_port": "-1", "cleanup_interval": "0s"}
    config = coordinator_config.load(flags, {})
    if admit:  # as an older checkout (--other) builds it: without the switch, which it may lack
        coordinator, port = build_server(config, deps)
    else:
        coordinator, port = build_server(config, deps, admit_requests=False)
    coordinator.start()

    def stop() -> None:
        coordinator.shutdown(None)
        deps.blobs.close()
        deps.metadata.close()

    return port, stop


def serve(kind: str, metadata: str, blobs: str) -> None:
    """Server mode (run as a child): serve until stdin closes; print ``port N`` once serving."""
    if kind == "bare":
        port, stop = serve_bare()
    else:
        port, stop = serve_snapcoord(metadata, blobs, admit=kind != "no-admission")
    print(f"port {port}", flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin (or exits)
    stop()


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[str]
    channel: grpc.Channel


@contextmanager
def start_server(name: str, metadata: str, blobs: str, other: Path | None) -> Iterator[Server]:
    """A server of kind ``name`` in its own process; OTHER runs the coordinator of checkout ``other``
    (its sources first on PYTHONPATH)."""
    argv = [sys.executable, __file__, "--serve", KINDS[name], "--metadata", metadata, "--blobs", blobs]
    env = dict(os.environ)
    if name == OTHER and other is not None:
        env["PYTHONPATH"] = f"{other}/coordinator/src:{other}/client/src"
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"{name} did not start (exit {proc.wait(timeout=60)}): {line!r}")
        channel = grpc.insecure_channel(f"127.0.0.1:{int(line.split()[1])}")
        grpc.channel_ready_future(channel).result(timeout=120)
        try:
            yield Server(name, proc, channel)
        finally:
            channel.close()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Slices:
    """Per round: calls/s and server CPU ms per call of one (row, server, c)."""

    rates: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


def run_slice(
    server: Server, op: Callable[[Server], object], clients: int, seconds: float
) -> tuple[float, float]:
    calls = [0] * clients

    def step(c: int, k: int) -> None:
        op(server)
        calls[c] += 1

    before = cpu_s(server.proc.pid)
    elapsed = for_seconds(clients, seconds, step, [0] * clients)
    used = cpu_s(server.proc.pid) - before
    total = sum(calls)
    return total / elapsed, used / total * 1000


def health_check(server: Server) -> object:
    return health_pb2_grpc.HealthStub(server.channel).Check(health_pb2.HealthCheckRequest(), timeout=60)


def cached_read(server: Server) -> object:
    stub = snapshot_pb2_grpc.SnapshotServiceStub(server.channel)
    return stub.GetCurrentSnapshot(snapshot_pb2.GetCurrentSnapshotRequest(app_id="app"), timeout=60)


def complete_one_snapshot(server: Server) -> None:
    """A completed snapshot of ``app``, so that the cached read answers one."""
    stub = snapshot_pb2_grpc.SnapshotServiceStub(server.channel)
    stub.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["a"]), timeout=60)
    task = snapshot_pb2.TaskSnapshot(task_id="a", committed_offsets=[common_pb2.Offset(stream="s", offset=1)])
    stub.ReportTaskSnapshot(
        snapshot_pb2.ReportTaskSnapshotRequest(app_id="app", generation=1, task=task), timeout=60
    )
    if cached_read(server).generation != 1:  # type: ignore[attr-defined]
        raise RuntimeError(f"{server.name}: no current snapshot after completing one")


def ratio_cell(ours: list[float], base: list[float]) -> str:
    ratios = [a / b for a, b in zip(ours, base, strict=True)]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one slice")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,16", help="client threads, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="one short round (CI: proves it runs)")
    parser.add_argument(
        "--other",
        type=Path,
        help="another checkout: its coordinator joins the rows (before/after in one run)",
    )
    parser.add_argument("--serve", default="", help=argparse.SUPPRESS)
    parser.add_argument("--metadata", default="", help=argparse.SUPPRESS)
    parser.add_argument("--blobs", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.metadata, args.blobs)
        return
    if args.smoke:
        args.seconds, args.rounds = 0.3, 1
    levels = [int(c) for c in args.clients.split(",")]
    others = (OTHER,) if args.other else ()
    rows: dict[str, tuple[Callable[[Server], object], tuple[str, ...]]] = {
        "Health/Check": (health_check, (BARE, OURS, NO_ADMISSION, *others)),
        "GetCurrentSnapshot, cached": (cached_read, (OURS, NO_ADMISSION, *others)),
    }
    run_id = uuid.uuid4().hex[:8]
    load_before = os.getloadavg()[0]
    results: dict[tuple[str, str, int], Slices] = {}
    with real_servers() as (zk, s3), ExitStack() as stack, tempfile.TemporaryDirectory():
        os.environ.update(s3.env())
        servers = {
            name: stack.enter_context(
                start_server(
                    name, f"zk://{zk.hosts}/floor-{run_id}-{i}", s3.uri(f"floor-{run_id}-{i}"), args.other
                )
            )
            for i, name in enumerate(KINDS)
            if name != OTHER or args.other
        }
        for name in (OURS, NO_ADMISSION, *others):
            complete_one_snapshot(servers[name])
        for op, names in rows.values():  # warm-up: every method's first call builds its wrappers
            for name in names:
                run_slice(servers[name], op, max(levels), 0.5)
        for r in range(args.rounds):
            for clients in levels:
                for row, (op, names) in rows.items():
                    turn = names[r % len(names) :] + names[: r % len(names)]  # who goes first rotates
                    for name in turn:
                        rate, cpu = run_slice(servers[name], op, clients, args.seconds)
                        slices = results.setdefault((row, name, clients), Slices())
                        slices.rates.append(rate)
                        slices.cpu_ms.append(cpu)
    print(f"\n## middleware floor ({args.rounds} rounds of {args.seconds:g} s slices; medians)")
    load_after = os.getloadavg()[0]
    print(
        f"# {os.cpu_count()} cores; load average {load_before:.1f} at the start, {load_after:.1f} at the end"
    )
    print(f"{'row':<28} {'server':<26} {'c':>3} {'calls/s':>8} {'CPU ms/call':>12}")
    for (row, name, clients), s in results.items():
        rate, cpu = statistics.median(s.rates), statistics.median(s.cpu_ms)
        print(f"{row:<28} {name:<26} {clients:>3} {rate:8.0f} {cpu:12.3f}")
    print("\n## ratios of neighbouring slices: median (band)")
    print("| row | c | calls/s | CPU per call |")
    print("|---|---|---|---|")
    pairs = [("Health/Check", OURS, BARE, "snapcoord / bare grpcio")]
    if args.other:
        pairs.append(("Health/Check", OTHER, BARE, "--other / bare grpcio"))
    pairs += [(row, OURS, NO_ADMISSION, "admission on / off") for row in rows]
    pairs += [(row, OURS, OTHER, "this checkout / --other") for row in rows if args.other]
    for row, a, b, label in pairs:
        for clients in levels:
            x, y = results[(row, a, clients)], results[(row, b, clients)]
            rate_ratio, cpu_ratio = ratio_cell(x.rates, y.rates), ratio_cell(x.cpu_ms, y.cpu_ms)
            print(f"| {row}, {label} | {clients} | {rate_ratio} | {cpu_ratio} |")


if __name__ == "__main__":
    main()
