"""Group commit: concurrent transactions through the ZooKeeper store, combined or each alone.

    bench/run group_commit [--seconds 4] [--clients 1,4,16] [--fsync]

Each of ``--clients`` threads commits one-op transactions (a 300-byte SetData on a node of its
own) through ``ZooKeeperMetadataStore.transaction`` for ``--seconds``, twice: as shipped (combined:
up to ``MAX_IN_FLIGHT`` requests in flight, the rest queued into one multi) and with combining
off (every transaction its own request, as before group commit), then with raw kazoo
(``transaction().commit()``) in the same run. Prints commits/s, the client process's and the
ZooKeeper server's CPU per commit, p50/p99 latency, and the combined / alone ratio. ``--fsync``
runs ZooKeeper with ``forceSync=yes``, as deployed.
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
from snapcoord.coordinator.storage.zk_combine import MAX_IN_FLIGHT, TransactionCombiner
from snapcoord.coordinator.storage.zookeeper import ZooKeeperMetadataStore

DATA = b"y" * 300


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    store: ZooKeeperMetadataStore,
    zk_pid: int,
    clients: int,
    seconds: float,
    commit: Callable[[int, int], None],
) -> tuple[float, float, float, float, float]:
    """commits/s, client CPU us and ZooKeeper CPU us per commit, p50 and p99 ms."""
    versions = [node.version if (node := store.get(f"/n{c}")) else 0 for c in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop_at = time.monotonic() + seconds

    def work(c: int) -> None:
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            commit(c, versions[c])
            latencies[c].append(time.perf_counter() - start)
            versions[c] += 1

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--fsync", action="store_true", help="ZooKeeper fsyncs each transaction")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="snapcoord-bench-") as tmp,
        ZooKeeperServer(Path(tmp) / "zk", force_sync=args.fsync) as zk,
    ):
        assert zk.pid is not None
        store = ZooKeeperMetadataStore.from_uri(f"zk://{zk.hosts}/group-commit")
        try:
            levels = [int(c) for c in args.clients.split(",")]
            for c in range(max(levels)):
                store.create(f"/n{c}", DATA)
            shipped = store._combiner
            alone = TransactionCombiner(store.kazoo, max_bytes=shipped._max_bytes, max_in_flight=1 << 30)
            kazoo = store.kazoo

            def ours(c: int, version: int) -> None:
                store.transaction([SetData(f"/n{c}", DATA, version)])

            def raw(c: int, version: int) -> None:
                tx = kazoo.transaction()
                tx.set_data(f"/n{c}", DATA, version)
                tx.commit()

            print(f"# group_commit: ZooKeeper {'with' if args.fsync else 'without'} fsync, "
                  f"{os.cpu_count()} cores, MAX_IN_FLIGHT={MAX_IN_FLIGHT}")  # fmt: skip
            print(f"{'clients':>7} {'mode':<9} {'commits/s':>9} {'client us':>9} {'zk us':>7} "
                  f"{'p50 ms':>7} {'p99 ms':>7}")  # fmt: skip
            for clients in levels:  # warm-up (ZooKeeper's JIT and GC settle; the first row read low)
                run(store, zk.pid, clients, min(args.seconds, 1.0), ours)
            for clients in levels:
                rates = {}
                for mode in ("combined", "alone", "raw"):
                    store._combiner = shipped if mode == "combined" else alone
                    rate, client_us, zk_us, p50, p99 = run(
                        store, zk.pid, clients, args.seconds, raw if mode == "raw" else ours
                    )
                    rates[mode] = rate
                    print(f"{clients:7} {mode:<9} {rate:9.0f} {client_us:9.0f} {zk_us:7.0f} "
                          f"{p50:7.2f} {p99:7.2f}")  # fmt: skip
                store._combiner = shipped
                print(f"{clients:7} combined / alone: {rates['combined'] / rates['alone']:.2f}x, "
                      f"combined / raw kazoo: {rates['combined'] / rates['raw']:.2f}x")  # fmt: skip
        finally:
            store.close()


if __name__ == "__main__":
    main()
