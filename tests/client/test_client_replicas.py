"""The client spreads calls over several coordinator replicas (round_robin) and parses their addresses.

Each in-process replica here has its *own* embedded store, so where a registration landed shows which
replica served the call: through a round-robin client every replica must receive some.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from harness.process import wait_until
from snapcoord.client import CoordinatorClient, NotFound, Offset
from snapcoord.client._channel import normalize_target


@contextlib.contextmanager
def replicas(tmp_path: Path, n: int) -> Iterator[list[InProcessCoordinator]]:
    with contextlib.ExitStack() as stack:
        servers = []
        for i in range(n):
            deps = stack.enter_context(embedded_deps(tmp_path / f"r{i}"))
            servers.append(stack.enter_context(serve_in_process(deps)))
        yield servers


def stored_on(server: InProcessCoordinator, producer_ids: list[str]) -> set[str]:
    """Which of ``producer_ids`` this replica's own store holds (asked through a one-address client)."""
    found = set()
    with CoordinatorClient(server.target, timeout_s=30) as direct:
        for pid in producer_ids:
            with contextlib.suppress(NotFound):
                direct.get_producer_offsets(pid)
                found.add(pid)
    return found


@pytest.mark.parametrize("form", ["ipv4-list", "comma-list", "sequence"])
def test_calls_spread_over_every_replica(tmp_path: Path, form: str) -> None:
    with replicas(tmp_path, 3) as servers:
        addresses = [s.target for s in servers]
        forms: dict[str, str | list[str]] = {
            "ipv4-list": "ipv4:" + ",".join(addresses),
            "comma-list": ",".join(addresses),
            "sequence": addresses,
        }
        target = forms[form]
        ids = [f"p{i}" for i in range(30)]
        with CoordinatorClient(target, timeout_s=30) as client:
            # round_robin connects to the replicas one by one and meanwhile uses the READY ones, so
            # warm up until each replica has served a call before counting.
            warm: list[str] = []

            def everyone_served() -> bool:
                warm.append(f"warm{len(warm)}")
                client.register_producer_offsets(warm[-1], [Offset("s", 0, 1)])
                return all(stored_on(s, warm) for s in servers)

            wait_until(everyone_served, timeout=60, interval=0.05, what="every replica to serve a call")
            for pid in ids:
                assert client.register_producer_offsets(pid, [Offset("s", 0, 7)]).registered
        per_replica = [stored_on(s, ids) for s in servers]
        assert set().union(*per_replica) == set(ids)
        assert sum(len(p) for p in per_replica) == len(ids)  # each registered exactly once, somewhere
        # Strict rotation over READY subchannels: 30 calls over 3 replicas give 10 each.
        assert [len(p) for p in per_replica] == [10, 10, 10]


def test_dns_name_resolving_to_one_address_works(tmp_path: Path) -> None:
    with replicas(tmp_path, 1) as (server,):
        port = server.target.rsplit(":", 1)[1]
        with CoordinatorClient(f"dns:///localhost:{port}", timeout_s=30) as client:
            assert client.register_producer_offsets("d", [Offset("s", 0, 1)]).registered
            assert client.get_producer_offsets("d").offsets == (Offset("s", 0, 1),)


def test_a_killed_replica_drops_out_of_the_rotation(tmp_path: Path) -> None:
    with (
        replicas(tmp_path, 2) as servers,
        CoordinatorClient([s.target for s in servers], timeout_s=30) as client,
    ):
        for i in range(4):
            client.register_producer_offsets(f"warm{i}", [Offset("s", 0, 1)])
        servers[0].server.shutdown(0)
        # Every later call succeeds (UNAVAILABLE from the dead replica is retried for this idempotent
        # RPC, and round_robin stops picking it once its connection is gone) and lands on replica 1.
        ids = [f"after{i}" for i in range(10)]
        for pid in ids:
            client.register_producer_offsets(pid, [Offset("s", 0, 2)])
        assert stored_on(servers[1], ids) == set(ids)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("localhost:50051", "localhost:50051"),
        ("dns:///coordinators:50051", "dns:///coordinators:50051"),
        ("ipv4:127.0.0.1:1,127.0.0.1:2", "ipv4:127.0.0.1:1,127.0.0.1:2"),
        ("127.0.0.1:1, 127.0.0.1:2", "ipv4:127.0.0.1:1,127.0.0.1:2"),
        (["127.0.0.1:1", "127.0.0.1:2"], "ipv4:127.0.0.1:1,127.0.0.1:2"),
        (["[::1]:1", "[::1]:2"], "ipv6:[::1]:1,[::1]:2"),
        (["10.0.0.1:50051"], "10.0.0.1:50051"),
    ],
)
def test_target_forms(given: str | list[str], expected: str) -> None:
    assert normalize_target(given) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("", "gRPC target"),
        ([], "gRPC target"),
        ("a.example:1,b.example:2", "dns:///name:port"),
        (["127.0.0.1:1", "[::1]:2"], "all be IPv4 or all IPv6"),
        ("127.0.0.1,127.0.0.2", "with ports"),
    ],
)
def test_bad_target_forms_are_refused_with_advice(given: str | list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        CoordinatorClient(given)
