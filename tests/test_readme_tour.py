"""The README's tour, and its rest in docs/tour.md, run exactly as written against one live `snapcoord serve`.

Each ```console block between the tour markers holds `$ command` lines followed by the output
the command must print (stdout and stderr together). `localhost:50051` and `localhost:9464`
are rewritten to the ports of the coordinator this test starts; nothing else is changed. In the
expected output, `<ms>` stands for any timestamp (the only value that differs between runs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Step:
    command: str
    expected: str


def tour_steps(readme: str) -> list[Step]:
    section = readme.split("<!-- tour:begin -->", 1)[1].split("<!-- tour:end -->", 1)[0]
    steps: list[Step] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        command: str | None = None
        output: list[str] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command is not None:
                    steps.append(Step(command, "\n".join(output)))
                command, output = line[2:], []
            else:
                output.append(line)
        if command is not None:
            steps.append(Step(command, "\n".join(output)))
    return steps


README_STEPS = tour_steps((ROOT / "README.md").read_text())
# The rest of the tour leases the snapshot the README's steps took: it runs after them, on the same server.
REST_STEPS = tour_steps((ROOT / "docs" / "tour.md").read_text())
STEPS = README_STEPS + REST_STEPS


def test_the_tour_has_the_promised_commands() -> None:
    commands = [s.command for s in README_STEPS]
    assert any(c.startswith("grpcurl -plaintext localhost:50051 list") for c in commands)
    assert any("grpc.health.v1.Health/Check" in c for c in commands)
    assert len(README_STEPS) >= 6


def test_the_rest_of_the_tour_describes_tracks_the_backlog_and_leases() -> None:
    commands = [s.command for s in REST_STEPS]
    assert any(" describe snapcoord.v1." in c for c in commands)
    assert any("BacklogService/MarkBacklog" in c for c in commands)
    assert any("LeaseService/AcquireSnapshots" in c for c in commands)


@pytest.mark.timeout(180)
@pytest.mark.process
def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    with CoordinatorProcess(tmp_path / "coordinator") as coordinator:
        for step in STEPS:
            command = step.command.replace("localhost:50051", f"localhost:{coordinator.grpc_port}")
            command = command.replace("localhost:9464", f"localhost:{coordinator.metrics_port}")
            done = subprocess.run(
                ["/bin/sh", "-c", f"{command} 2>&1"], capture_output=True, text=True, env=env, timeout=60
            )
            expected = step.expected.replace("localhost:50051", f"localhost:{coordinator.grpc_port}")
            pattern = re.escape(expected).replace(re.escape("<ms>"), r"\d{13}")
            got = done.stdout.rstrip("\n")
            assert re.fullmatch(pattern, got), f"tour step: $ {step.command}\n{got}"
