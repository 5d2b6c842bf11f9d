"""docs/operations/security.md's "Securing it" walk-through, run as written against a live `snapcoord serve`.

Same conventions as the tour (tests/test_readme_tour.py): ```console blocks between the markers
hold `$ command` lines and the output they must print; `localhost:50051` becomes the port of the
coordinator this test starts, `<ms>` stands for a timestamp. The one `snapcoord serve ...` step is
not run by the shell: the test starts the coordinator with exactly those flags (plus its own port
and data directory) and waits until it is SERVING over mutual TLS.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from test_readme_tour import Step, tour_steps

from harness.coordinator import CoordinatorProcess

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SECURITY = (ROOT / "docs" / "operations" / "security.md").read_text()


def secure_steps() -> list[Step]:
    section = SECURITY.split("<!-- secure:begin -->", 1)[1].split("<!-- secure:end -->", 1)[0]
    return tour_steps(f"<!-- tour:begin -->{section}<!-- tour:end -->")


STEPS = secure_steps()


def test_the_section_shows_tls_mtls_and_tokens_with_grpcurl() -> None:
    commands = [s.command for s in STEPS]
    serve = [c for c in commands if c.startswith("snapcoord serve ")]
    assert len(serve) == 1
    for flag in ("--tls-cert", "--tls-key", "--tls-client-ca", "--auth-file deploy/auth.example.yaml"):
        assert flag in serve[0]
    grpcurls = [c for c in commands if c.startswith("grpcurl ")]
    assert all("-cacert " in c and "-cert " in c and "-key " in c for c in grpcurls)
    assert any("-H 'authorization: Bearer " in c for c in grpcurls)
    assert "## Securing it" in README
    assert "## Securing it: a walk-through" in SECURITY


@pytest.mark.timeout(180)
@pytest.mark.process
def test_readme_securing_it_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "auth.example.yaml", tmp_path / "deploy" / "auth.example.yaml")
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCOORD_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    coordinator: CoordinatorProcess | None = None
    try:
        for step in STEPS:
            if step.command.startswith("snapcoord serve "):
                pki = tmp_path / "pki"
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=(pki / "ca.pem").read_bytes(),
                    private_key=(pki / "team-a.key").read_bytes(),
                    certificate_chain=(pki / "team-a.pem").read_bytes(),
                )
                coordinator = CoordinatorProcess(
                    tmp_path,
                    args=shlex.split(step.command)[2:],
                    env={"PATH": env["PATH"]},
                    health_credentials=credentials,
                ).start()
                continue
            port = str(coordinator.grpc_port) if coordinator is not None else "50051"
            command = step.command.replace("localhost:50051", f"localhost:{port}")
            done = subprocess.run(
                ["/bin/bash", "-c", f"( {command} ) 2>&1"],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp_path,
                timeout=60,
            )
            expected = step.expected.replace("localhost:50051", f"localhost:{port}")
            pattern = re.escape(expected).replace(re.escape("<ms>"), r"\d{13}")
            got = done.stdout.rstrip("\n")
            assert re.fullmatch(pattern, got), f"security.md step: $ {step.command}\n{got}"
        assert coordinator is not None
        audit = [line for line in coordinator.stderr_text().splitlines() if "snapcoord.audit" in line]
        assert any(" principal=team-a-driver " in line and " code=OK " in line for line in audit), audit
        assert not any("example-token" in line for line in audit)
    finally:
        if coordinator is not None:
            coordinator.terminate()
