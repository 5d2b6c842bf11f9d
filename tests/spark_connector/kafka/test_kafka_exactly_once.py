"""Exactly-once foreachBatch over a Kafka topic: the kill and zombie runs of ``harness.eo_driver`` with
the job reading a topic of two partitions from the session's broker.

A Kafka batch is replayed from the offsets Spark logged for it, so what the source adds is the replay
of a cut batch: the kills here are the points that leave a batch written but not committed by Spark
(mid-write, after the write, at the commit), the first batch, and a rollback cut short. The points
that differ only in the sink's own steps run over files (``test_exactly_once.py``); every point runs
here too with ``SNAPCOORD_KAFKA_ALL_KILLS=1``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.eo_driver import FIXED_KILLS, run_kill_schedule, zombie_then_reset
from harness.kafka import KafkaBroker

pytestmark = pytest.mark.spark

#: In the order of ``FIXED_KILLS``, whose order makes each point reachable.
KAFKA_KILLS = ["batch_start:1", "mid_write:1", "after_write:1", "mid_rollback:1", "commit:1"]


def kill_schedule() -> list[str]:
    if os.environ.get("SNAPCOORD_KAFKA_ALL_KILLS") == "1":
        points = [k.partition(":")[0] for k in FIXED_KILLS]
        return [k for i, k in enumerate(FIXED_KILLS) if points[i] not in points[:i]]
    return [k for k in FIXED_KILLS if k in KAFKA_KILLS]


def test_the_kafka_schedule_keeps_the_kill_points_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCOORD_KAFKA_ALL_KILLS", raising=False)
    assert kill_schedule() == KAFKA_KILLS


@pytest.mark.timeout(1200)
def test_killed_kafka_driver_writes_every_record_exactly_once(
    tmp_path: Path, zk_uri: str, s3_uri: str, kafka: KafkaBroker
) -> None:
    run_kill_schedule(tmp_path, zk_uri, s3_uri, kafka, kill_schedule())


@pytest.mark.timeout(600)
def test_kafka_zombie_driver_stays_invisible_and_a_checkpoint_reset_loses_nothing(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A reset re-reads the topic from its earliest offsets: the replayed batches are the duplicates."""
    zombie_then_reset(tmp_path, kafka)
