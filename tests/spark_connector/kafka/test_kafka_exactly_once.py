"""Exactly-once foreachBatch over a Kafka topic: the kill run of ``harness.eo_driver`` with the job
reading a topic of two partitions from the session's broker, killed once at every kill point.

A Kafka batch is replayed from the offsets Spark logged for it, so a re-run batch reads the records the
killed attempt read: each point here leaves the table, the coordinator and Spark's logs as a lost driver
would, and the next life must roll back exactly the attempt that died. The zombie and the checkpoint
reset over Kafka are in ``test_kafka_zombie_reset.py``, a module of its own so that xdist runs it beside
this one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.eo_driver import FIXED_KILLS, run_kill_schedule
from harness.kafka import KafkaBroker

pytestmark = pytest.mark.spark

#: Every kill point once, in the order of ``FIXED_KILLS`` (whose order makes each point reachable).
_FIRST_OF_POINT = {k.partition(":")[0]: k for k in reversed(FIXED_KILLS)}
KAFKA_KILLS = [k for k in FIXED_KILLS if _FIRST_OF_POINT[k.partition(":")[0]] == k]


def test_the_kafka_schedule_kills_once_at_every_point_in_order() -> None:
    points = [k.partition(":")[0] for k in KAFKA_KILLS]
    assert sorted(points) == sorted({k.partition(":")[0] for k in FIXED_KILLS})
    assert [k for k in FIXED_KILLS if k in KAFKA_KILLS] == KAFKA_KILLS


@pytest.mark.timeout(1200)  # nine driver lives on 2 shared cores
def test_killed_kafka_driver_writes_every_record_exactly_once(
    tmp_path: Path, zk_uri: str, s3_uri: str, kafka: KafkaBroker
) -> None:
    run_kill_schedule(tmp_path, zk_uri, s3_uri, kafka, KAFKA_KILLS)
