"""docs/api.md covers the API the code has: every error reason, and every RPC with its idempotency."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from snapcoord.client._retry import idempotency_levels
from snapcoord.coordinator.errors import Reason

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()
LEVELS = idempotency_levels()


def section(title: str) -> str:
    """The text of the ``### title`` section of docs/api.md."""
    match = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^#{{2,3}} |\Z)", API, flags=re.M | re.S)
    assert match, f"docs/api.md has no section '### {title}'"
    return match.group(1)


def test_every_reason_has_a_row_in_the_errors_table() -> None:
    errors = API.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1) for m in re.finditer(r"^\| `([A-Z_]+)` \|", errors, flags=re.M)}
    assert rows == {r.value for r in Reason}


@pytest.mark.parametrize("rpc", sorted(LEVELS))
def test_every_rpc_has_a_section_that_states_its_idempotency(rpc: str) -> None:
    text = section(rpc)
    assert "Request:" in text and "Errors:" in text, rpc
    stated = re.search(r"Idempotency: (`[A-Z_]+`|none)", text)
    assert stated, f"### {rpc} does not state its idempotency"
    level = LEVELS[rpc]
    assert stated.group(1) == ("none" if level == "IDEMPOTENCY_UNKNOWN" else f"`{level}`"), rpc


def test_the_design_covers_what_the_api_relies_on() -> None:
    headings = set(re.findall(r"^## (.+)$", DESIGN, flags=re.M))
    for needed in [
        "Commit point",
        "Write ordering",
        "Records and indexes",
        "Janitor and leader election",
        "Leases and pins",
        "Clock skew",
        "Retention",
        "Orphan collection",
        "Backlog",
    ]:
        assert needed in headings, needed


def test_readme_links_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(docs/api.md)" in readme and "(docs/design.md)" in readme


def test_nothing_in_the_repo_cites_files_outside_it() -> None:
    """Only docs/api.md and docs/design.md may be cited; never the notes they were written from."""
    outside = re.compile(r"(?<![/\w])(" + "API" + r"|" + "DESIGN" + r")\.md|\.\./" + "shared")
    offenders = []
    for directory, dirs, files in os.walk(ROOT):
        # Hidden directories (.git, .venv...) and build output are not the repo's own text.
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in {"build", "dist"}]
        dirs[:] = [d for d in dirs if not d.endswith(".egg-info")]
        for name in files:
            path = Path(directory, name)
            if path.suffix not in {".py", ".md", ".proto", ".toml", ".yml", ".yaml", ".cfg", ".sh"}:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if outside.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
