"""The coordinator as the exactly-once sink's commit point where the store's create is not atomic
(issue #42, points 2 and 3), on a real sftp server (fsspec over paramiko: ``atomic_exclusive`` False)
and a real coordinator (``snapcoord serve`` on ZooKeeper).

The sink is ``harness.one_file_sink.OneFileSink``: its batch is one small part file the driver writes,
so no Spark query runs; the fence, the claims, the entry writes and their checks are the sink's own
code. The races of the same protocol, at many interleavings, are in ``races/``.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.coordinator import CoordinatorProcess
from harness.locations import TestDir, sftp_dir
from harness.one_file_sink import OneFileSink
from harness.sshd import SshServer
from snapcoord.client import CoordinatorClient, RetryPolicy, Unavailable
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, _roll_back_sink
from snapcoord.spark_connector.sink import CoordinatorRequired, Fenced, PartitionedFileSink
from snapcoord.spark_connector.sink.claims import table_id_of
from snapcoord.spark_connector.storage import open_location


def sink_on(d: TestDir, sshd: SshServer, writer: str, **kwargs: Any) -> OneFileSink:
    """A sink of the table ``t`` in ``d`` through fsspec's sftp (a connection of its own)."""
    options = {**sshd.storage_options(), "skip_instance_cache": True}
    return OneFileSink(open_location(d.uri_of("t"), use_jvm=False, storage_options=options), writer, **kwargs)


@pytest.fixture
def table(request: pytest.FixtureRequest, sshd: SshServer) -> Iterator[TestDir]:
    with sftp_dir(sshd, request.node.name) as d:
        yield d


@pytest.fixture
def client(zk_coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(zk_coordinator.target, timeout_s=60) as c:
        yield c


def entries(d: TestDir) -> list[str]:
    return sorted(e.name for e in d.storage.list("t/_spark_metadata"))


def test_the_table_id_names_one_table_however_a_driver_spells_its_location() -> None:
    """Hadoop and fsspec spell one table differently (user, default port, scheme family, a trailing
    slash, escapes); every spelling gets one id, and another table, host or port another."""
    same = [
        "sftp://tester@Host.example:22/data/t",
        "sftp://host.example/data/t/",
        "sftp://host.example//data/t",
        "sftp://host.example/data/%74",
    ]
    assert len({table_id_of(u) for u in same}) == 1
    assert table_id_of("s3a://bucket/a/t") == table_id_of("s3://bucket/a/t/")
    others = ["sftp://host.example/data/u", "sftp://other/data/t", "sftp://host.example:2222/data/t"]
    assert len({table_id_of(u) for u in [same[0], *others]}) == 4
    assert all(
        t.startswith("table.t.") and set(t) <= set("abcdefghijklmnopqrstuvwxyz0123456789.t")
        for t in map(table_id_of, same)
    )


def test_a_pickled_sink_carries_the_coordinators_address_never_a_live_client(tmp_path: Path) -> None:
    """Spark Connect ships the sink as configuration: an address travels, a channel of this process
    does not (the copy's writer hands it its own client)."""
    with CoordinatorClient("127.0.0.1:1") as live:
        by_client = PartitionedFileSink(tmp_path / "a", coordinator=live)
        copy = pickle.loads(pickle.dumps(by_client))
    assert copy.coordinator is None and copy._client is None
    by_address = pickle.loads(pickle.dumps(PartitionedFileSink(tmp_path / "b", coordinator="host:1")))
    assert by_address.coordinator == "host:1" and by_address._client is None


def test_fence_and_commit_claim_their_numbers_before_writing(
    table: TestDir, sshd: SshServer, client: CoordinatorClient
) -> None:
    sink = sink_on(table, sshd, "w", coordinator=client)
    assert sink.needs_coordinator()
    sink.fence(1)
    seq = sink.write(b'{"v": 1}\n', 0)
    assert seq == 1
    claims = client.get_commit_claims(sink.table_id)
    assert claims.fence_epoch == 1
    assert [(c.seq, c.epoch) for c in claims.claims] == [(0, 1), (1, 1)]
    assert claims.claims[0].attempt == "fence"
    assert claims.claims[1].attempt == sink.commits()[-1].attempt
    assert [c.batch_id for c in sink.commits()] == [0]


def test_a_write_the_coordinator_refuses_writes_no_entry(
    table: TestDir, sshd: SshServer, client: CoordinatorClient
) -> None:
    """A zombie that passed the store's fence check before a newer run fenced the table in the
    coordinator is refused its claim, and writes nothing visible; a second writer of the same run at
    a claimed number is refused too, and the holder's entry stays."""
    zombie = sink_on(table, sshd, "w", coordinator=client)
    zombie.fence(1)
    twin = sink_on(table, sshd, "w", coordinator=client)
    twin.fence(1)  # joins epoch 1
    assert twin.positions()[0].offset == zombie.positions()[0].offset == 1
    assert twin.write(b'{"v": "twin"}\n', 0) == 1
    with pytest.raises(RuntimeError, match="claimed by another write"):
        zombie.write(b'{"v": "zombie"}\n', 0)
    assert [c.attempt for c in zombie.commits()] == [twin.commits()[0].attempt]

    client.fence_table(zombie.table_id, 2, 3)  # a newer run, before it announces itself in the store
    with pytest.raises(Fenced, match="fenced by epoch 2; epoch 1 cannot claim sequence 2"):
        zombie.write(b'{"v": "zombie"}\n', 1)
    assert entries(table) == ["0", "1"]
    assert [c.batch_id for c in zombie.commits()] == [0]


def test_a_store_without_atomic_create_needs_a_coordinator(table: TestDir, sshd: SshServer) -> None:
    sink = sink_on(table, sshd, "w")
    with pytest.raises(CoordinatorRequired, match="pass coordinator="):
        sink.fence(1)
    with pytest.raises(CoordinatorRequired):
        sink.write(b'{"v": 1}\n', 0)
    assert table.storage.list("t") == []  # nothing announced, nothing written


def test_an_unreachable_coordinator_fails_the_write_and_writes_nothing(
    table: TestDir, sshd: SshServer, tmp_path: Path
) -> None:
    """No fallback to the store-only commit: with the coordinator gone, the client's retries run out
    and the write fails with its entry unwritten."""
    with CoordinatorProcess(tmp_path / "coordinator") as coordinator:
        retry = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2, max_attempts=4)
        with CoordinatorClient(coordinator.target, timeout_s=30, retry=retry) as client:
            sink = sink_on(table, sshd, "w", coordinator=client)
            sink.fence(1)
            coordinator.terminate()
            with pytest.raises(Unavailable) as failed:
                sink.write(b'{"v": 1}\n', 0)
    assert failed.value.attempts == 4 and failed.value.method == "ClaimCommit"
    assert entries(table) == ["0"]  # the fence's; the batch's entry 1 was never written
    assert sink.commits() == []


def test_a_restore_fences_such_a_table_through_the_coordinator(
    table: TestDir, sshd: SshServer, client: CoordinatorClient
) -> None:
    """A restore's cut of a sink (``restore_to`` after a fence of a new epoch) hands the sink the
    restore's client, so the fence goes through the coordinator, and the old run is refused there."""
    run = sink_on(table, sshd, "run", coordinator=client)
    run.fence(1)
    run.write(b'{"v": 0}\n', 0)
    cut = run.positions()
    run.write(b'{"v": 1}\n', 1)
    restored = sink_on(table, sshd, "restorer")  # no coordinator of its own
    query = f"restore-{uuid.uuid4().hex[:8]}"
    _roll_back_sink(client, RestoreTarget(query, "unused", restored), cut)
    assert [c.batch_id for c in restored.commits()] == [0]
    assert client.get_commit_claims(restored.table_id).fence_epoch == restored.epoch > 1
    run.check_epoch = lambda: None  # type: ignore[method-assign]  # a zombie that checked before the fence
    with pytest.raises(Fenced, match=f"fenced by epoch {restored.epoch}"):
        run.write(b'{"v": 2}\n', 2)
    assert [c.batch_id for c in restored.commits()] == [0]
