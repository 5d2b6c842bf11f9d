"""The coordinator's folders are its layers, and no import runs back up (docs/design.md, "Layout").

Every ``snapcoord.coordinator`` import in the package's source (at module level, inside functions and
under ``TYPE_CHECKING`` alike) is read with ``ast`` and checked against the layer order below: a module
may import its own layer or one below it, never one above. The order is the table of docs/design.md,
which this test also holds to the folders that exist.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "snapcoord.coordinator"
ROOT = Path(__file__).resolve().parents[2] / "coordinator" / "src" / "snapcoord" / "coordinator"

#: From the bottom up; names in one row are one layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "domain"),
    ("storage",),
    ("config",),
    ("observability",),
    ("kernel",),
    ("producers", "snapshots", "backlog", "claims"),
    ("services",),
    ("api", "transport", "auth"),
    ("server",),
    ("cli", "__main__"),
)
RANK = {name: i for i, row in enumerate(LAYERS) for name in row}


def _top(module: str) -> str:
    """The first component below the package: the folder or root module a module belongs to."""
    return module.removeprefix(PACKAGE + ".").split(".")[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] or ["__init__"]
    return ".".join([PACKAGE, *parts])


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import of the package in ``path``."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == PACKAGE:  # a submodule, or a name of the package's own __init__
                for alias in node.names:
                    sub = ROOT / alias.name
                    is_module = sub.is_dir() or sub.with_suffix(".py").exists()
                    yield node.lineno, f"{PACKAGE}.{alias.name if is_module else '__init__'}"
            elif target.startswith(PACKAGE + "."):
                yield node.lineno, target


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_folder_and_root_module_has_a_layer() -> None:
    tops = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in _sources()}
    assert tops - RANK.keys() == set(), "a new folder or root module: give it a layer here and in docs"


def test_no_import_runs_back_up() -> None:
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {target} "
        f"({_top(target)} is above {_top(_module_name(path))})"
        for path in _sources()
        for line, target in _imports(path)
        if RANK[_top(target)] > RANK[_top(_module_name(path))]
    ]
    assert upward == []


@pytest.mark.parametrize("folder", sorted(n for n in RANK if (ROOT / n).is_dir()))
def test_the_design_doc_names_every_folder(folder: str) -> None:
    design = (ROOT.parents[3] / "docs" / "design.md").read_text("utf-8")
    assert f"`{folder}/`" in design


def test_the_checker_sees_an_import_that_runs_back_up(tmp_path: Path) -> None:
    """The scan resolves relative imports: a planted ``from ..server import app`` in ``kernel`` counts."""
    planted = ROOT / "kernel" / "_planted_for_test.py"
    planted.write_text("from ..server import app\nfrom . import commit\n", "utf-8")
    try:
        found = list(_imports(planted))
    finally:
        planted.unlink()
    assert found == [(1, f"{PACKAGE}.server"), (2, f"{PACKAGE}.kernel")]
    assert RANK[_top(found[0][1])] > RANK["kernel"]
