"""Combining: concurrent requests through the ZooKeeper store, combined or each sent alone.

    bench/run combine [--seconds 4] [--clients 1,4,16] [--kinds commit,get,synced] [--fsync]

Each of ``--clients`` threads calls the store for ``--seconds``, for each kind:

- ``commit``: one-op transactions (a 300-byte SetData on a node of its own) through
  ``transaction``: concurrent ones share a ``multi`` (group commit);
- ``get``: ``get`` of its own node: concurrent ones share a ``multiRead``;
- ``synced``: ``synced_get_many`` of its node and a shared one (a consistent read): concurrent
  ones share one sync and one ``multiRead``.

Each kind runs three ways in the same run, each twice in the order A B C C B A (so that a drift
weighs on all alike): as shipped (combined: up to ``MAX_IN_FLIGHT`` requests in flight, the rest
queued into one), with combining off (every call its own requests, as before), and raw kazoo (a
``transaction().commit()``; a ``get``; a ``sync`` and two pipelined gets). Prints calls/s, the
client process's and the ZooKeeper server's CPU per call, p50/p99 latency (the mean of the two
runs), and the combined / alone ratio. ``--fsync`` runs ZooKeeper with ``forceSync=yes``, as
deployed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common import ROOT  # noqa: F401  (puts tests/ on sys.path for the harness)

from harness.zookeeper import ZooKeeperServer
from snapcoord.coordinator.storage.metadata import SetData
from snapcoord.coordinator.storage.zookeeper.combine import MAX_IN_FLIGHT, ReadCombiner, TransactionCombiner
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

DATA = b"y" * 300
UNBOUNDED = 1 << 30


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    zk_pid: int, clients: int, seconds: float, call: Callable[[int], object]
) -> tuple[float, float, float, float, float]:
    """calls/s, client CPU us and ZooKeeper CPU us per call, p50 and p99 ms."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop_at = time.monotonic() + seconds

    def work(c: int) -> None:
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            call(c)
            latencies[c].append(time.perf_counter() - start)

    cpu0, zk0, wall0 = time.process_time(), cpu_s(zk_pid), time.monotonic()
    threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1, zk1, wall1 = time.process_time(), cpu_s(zk_pid), time.monotonic()
    all_latencies = sorted(x for per in latencies for x in per)
    n = len(all_latencies)
    return (
        n / (wall1 - wall0),
        (cpu1 - cpu0) / n * 1e6,
        (zk1 - zk0) / n * 1e6,
        all_latencies[n // 2] * 1000,
        all_latencies[min(n - 1, int(n * 0.99))] * 1000,
    )


def calls(store: ZooKeeperMetadataStore, clients: int) -> dict[str, tuple[Callable[[int], object], ...]]:
    """Per kind: (the store's call, the raw kazoo call)."""
    kazoo = store.kazoo
    versions = [node.version if (node := store.get(f"/n{c}")) else 0 for c in range(clients)]

    def commit(c: int) -> None:
        store.transaction([SetData(f"/n{c}", DATA, versions[c])])
        versions[c] += 1

    def raw_commit(c: int) -> None:
        tx = kazoo.transaction()
        tx.set_data(f"/n{c}", DATA, versions[c])
        tx.commit()
        versions[c] += 1

    def raw_synced(c: int) -> None:
        sync, mine, shared = kazoo.sync_async("/"), kazoo.get_async(f"/n{c}"), kazoo.get_async("/shared")
        sync.get(), mine.get(), shared.get()

    return {
        "commit": (commit, raw_commit),
        "get": (lambda c: store.get(f"/n{c}"), lambda c: kazoo.get(f"/n{c}")),
        "synced": (lambda c: store.synced_get_many("/", [f"/n{c}", "/shared"]), raw_synced),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--kinds", default="commit,get,synced")
    parser.add_argument("--fsync", action="store_true", help="ZooKeeper fsyncs each transaction")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="snapcoord-bench-") as tmp,
        ZooKeeperServer(Path(tmp) / "zk", force_sync=args.fsync) as zk,
    ):
        assert zk.pid is not None
        store = ZooKeeperMetadataStore.from_uri(f"zk://{zk.hosts}/combine")
        try:
            levels = [int(c) for c in args.clients.split(",")]
            for c in range(max(levels)):
                store.create(f"/n{c}", DATA)
            store.create("/shared", DATA)
            shipped = (store._combiner, store._reads)
            alone = (
                TransactionCombiner(store.kazoo, max_bytes=shipped[0]._capacity, max_in_flight=UNBOUNDED),
                ReadCombiner(store.kazoo, max_in_flight=UNBOUNDED),
            )
            print(f"# combine: ZooKeeper {'with' if args.fsync else 'without'} fsync, "
                  f"{os.cpu_count()} cores, MAX_IN_FLIGHT={MAX_IN_FLIGHT}")  # fmt: skip
            print(f"{'kind':<6} {'clients':>7} {'mode':<9} {'calls/s':>8} {'client us':>9} {'zk us':>7} "
                  f"{'p50 ms':>7} {'p99 ms':>7}")  # fmt: skip
            for kind in args.kinds.split(","):
                ours, raw = calls(store, max(levels))[kind]
                for clients in levels:  # warm-up (ZooKeeper's JIT and GC settle; a first row read low)
                    run(zk.pid, clients, min(args.seconds, 1.0), ours)
                for clients in levels:
                    # Each mode twice, in the order A B C C B A, so that a drift (the ZooKeeper
                    # server settling after a heavier level) weighs on all alike.
                    results: dict[str, list[tuple[float, ...]]] = {}
                    for mode in ("combined", "alone", "raw", "raw", "alone", "combined"):
                        store._combiner, store._reads = shipped if mode == "combined" else alone
                        call = raw if mode == "raw" else ours
                        results.setdefault(mode, []).append(run(zk.pid, clients, args.seconds / 2, call))
                    rates = {}
                    for mode, (first, second) in results.items():
                        mean = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
                        rate, client_us, zk_us, p50, p99 = mean
                        rates[mode] = rate
                        print(f"{kind:<6} {clients:7} {mode:<9} {rate:8.0f} {client_us:9.0f} {zk_us:7.0f} "
                              f"{p50:7.2f} {p99:7.2f}")  # fmt: skip
                    store._combiner, store._reads = shipped
                    vs_alone, vs_raw = rates["combined"] / rates["alone"], rates["combined"] / rates["raw"]
                    print(f"{kind:<6} {clients:7} combined / alone: {vs_alone:.2f}x, "
                          f"combined / raw kazoo: {vs_raw:.2f}x")  # fmt: skip
        finally:
            store.close()


if __name__ == "__main__":
    main()
