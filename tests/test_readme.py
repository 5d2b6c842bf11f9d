"""Facts the code owns: the README's two commands, and the configuration table of docs/operations."""

from __future__ import annotations

from pathlib import Path

from snapcoord.coordinator.config import options

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "operations" / "configuration.md").read_text()


def render_config_table() -> str:
    """docs/operations/configuration.md's table, rendered from options.OPTIONS (the one source)."""
    rows = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for opt in options.OPTIONS:
        rows.append(f"| `{opt.flag}` | `{opt.env}` | `{opt.shown_default}` | {opt.help} |")
    return "\n".join(rows)


def test_configuration_table_matches_the_code() -> None:
    table = render_config_table()
    assert table in CONFIGURATION, (
        "docs/operations/configuration.md's table is stale; replace it with:\n" + table
    )


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    first_block = README.split("```console\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["scripts/serve", "scripts/test"]
    for command in commands:
        assert (ROOT / command).stat().st_mode & 0o111, f"{command} is not executable"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test" in ci
