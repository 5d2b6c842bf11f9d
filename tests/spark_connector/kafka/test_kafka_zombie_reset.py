"""Exactly-once foreachBatch over a Kafka topic across run changes (``harness.eo_driver``): a zombie
driver stalled at its commit while a second driver takes over its checkpoint, then a checkpoint reset.
A module of its own, beside the kill run (``test_kafka_exactly_once.py``), so that xdist runs the two
on its two workers at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.eo_driver import zombie_then_reset
from harness.kafka import KafkaBroker

pytestmark = pytest.mark.spark


@pytest.mark.timeout(600)
def test_kafka_zombie_driver_stays_invisible_and_a_checkpoint_reset_loses_nothing(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A reset re-reads the topic from its earliest offsets: the replayed batches are the duplicates."""
    zombie_then_reset(tmp_path, kafka)
