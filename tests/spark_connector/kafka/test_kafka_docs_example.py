"""docs/spark.md's Kafka example runs as written, as its own driver, against a live coordinator and the
session's broker; its printed offsets and the grpcurl answer shown there are what they answer."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from harness.jars import jar_set
from harness.kafka import KafkaBroker

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.spark


def block(page: str, name: str, lang: str) -> str:
    section = page.split(f"<!-- {name}:begin -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]
    (code,) = re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)
    return str(code)


@pytest.mark.timeout(400)
def test_docs_kafka_example_runs(tmp_path: Path, kafka: KafkaBroker) -> None:
    page = (ROOT / "docs" / "spark.md").read_text()
    kafka.create_topic("orders", partitions=2)
    kafka.produce_ids("orders", range(30))  # 15 a partition
    with CoordinatorProcess(tmp_path / "coordinator") as coordinator:
        jars = ",".join(str(j) for j in jar_set("spark-kafka"))
        code = (
            block(page, "kafka-example", "python")
            .replace("localhost:50051", coordinator.target)
            .replace("localhost:9092", kafka.bootstrap)
            .replace("/tmp/snapcoord-kafka-example", str(tmp_path / "example"))
            # The test cache's jars rather than a download at run time.
            .replace(
                '"spark.jars.packages", "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"',
                f'"spark.jars", "{jars}"',
            )
        )
        assert jars in code
        script = tmp_path / "example.py"
        script.write_text(code)
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=380, env=env, cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        assert done.stdout.splitlines() == block(page, "kafka-output", "console").splitlines()

        (command,) = [line[2:] for line in block(page, "kafka-grpcurl", "console").splitlines()]
        argv = shlex.split(command.replace("localhost:50051", coordinator.target))
        argv[0] = str(Path(sys.executable).parent / "grpcurl")
        answer = json.loads(
            subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
        )
        (task,) = answer.get("tasks", [None])
        assert task is not None, answer
        assert task["task_id"] == "orders"
        assert task["committed_offsets"] == json.loads(block(page, "kafka-grpcurl-offsets", "json"))
