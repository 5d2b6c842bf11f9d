"""The README's Spark example runs as written, as its own driver, against a live coordinator."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark


@pytest.mark.timeout(300)
def test_readme_spark_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- spark-example:begin -->", 1)[1].split("<!-- spark-example:end -->", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    with CoordinatorProcess(tmp_path / "coordinator") as coordinator:
        script = tmp_path / "example.py"
        script.write_text(
            code.replace("localhost:50051", coordinator.target).replace(
                "/tmp/snapcoord-example", str(tmp_path / "example")
            )
        )
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        assert "checkpoint" in done.stdout  # the restore point names the checkpoint to resume from
