"""The README's Python example runs as written against a live coordinator."""

from __future__ import annotations

import re
from pathlib import Path

from harness.coordinator import embedded_deps, serve_in_process

ROOT = Path(__file__).resolve().parents[1]


def test_readme_client_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- client-example:begin -->", 1)[1].split("<!-- client-example:end -->", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert "localhost:50051" in code
    with embedded_deps(tmp_path) as deps, serve_in_process(deps) as coordinator:
        exec(compile(code.replace("localhost:50051", coordinator.target), "README.md", "exec"), {})
