"""The docs hold to the code and to themselves.

docs/api.md covers the API the code has (every error reason, every RPC with its idempotency);
every page under docs/ opens with a table of contents that matches its headings; every link
between the README and the pages lands on a file and, inside a page, on a heading.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from snapcoord.client._retry import idempotency_levels
from snapcoord.coordinator.errors import Reason

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
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


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of the ## and ### headings, skipping fenced code (whose # lines are comments)."""
    found: list[tuple[int, str]] = []
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (match := re.match(r"(#{2,3}) (.+)$", line)):
            found.append((len(match.group(1)), match.group(2)))
    return found


def anchors(path: Path) -> set[str]:
    return {github_anchor(title) for _, title in headings(path.read_text())}


def test_docs_has_the_pages_the_readme_promises() -> None:
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    for page in ["api.md", "design.md", "tour.md", "spark.md", "performance.md", "development.md"]:
        assert page in names, page
    for page in ["configuration.md", "security.md", "production.md", "metrics.md", "upgrades.md"]:
        assert f"operations/{page}" in names, page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_every_page_opens_with_a_table_of_contents_of_its_headings(page: Path) -> None:
    text = page.read_text()
    first_heading = re.search(r"^## ", text, flags=re.M)
    assert first_heading, f"{page.name} has no ## sections"
    head = text[: first_heading.start()]
    assert "**Contents**" in head, f"{page.name}: no table of contents before its first section"
    entries = re.findall(r"^( *)- \[(.+)\]\(#([^)]+)\)$", head.split("**Contents**", 1)[1], flags=re.M)
    listed = [(2 + len(indent) // 2, title, fragment) for indent, title, fragment in entries]
    # The contents list every ## section, and every ### one too when they nest any.
    deepest = max(level for level, _, _ in listed)
    expected = [(level, title) for level, title in headings(text) if level <= deepest]
    assert [(level, title) for level, title, _ in listed] == expected, page.name
    for _, title, fragment in listed:
        assert fragment == github_anchor(title), f"{page.name}: [{title}](#{fragment})"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("source", [ROOT / "README.md", *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_land_on_a_file_and_a_heading(source: Path) -> None:
    broken = []
    text = re.sub(r"^```.*?^```", "", source.read_text(), flags=re.M | re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, fragment = target.partition("#")
        resolved = (source.parent / path).resolve() if path else source
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{source.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_page_is_linked_from_the_readme_or_another_page() -> None:
    linked = set()
    for source in [ROOT / "README.md", *PAGES]:
        for target in LINK.findall(source.read_text()):
            path = target.partition("#")[0]
            if path and not re.match(r"[a-z]+:", path):
                linked.add((source.parent / path).resolve())
    assert not [p for p in PAGES if p.resolve() not in linked]
