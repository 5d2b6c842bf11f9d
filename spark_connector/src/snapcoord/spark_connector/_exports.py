"""Lazy re-exports for the connector's package roots (PEP 562).

The modules behind most public names import pyspark, which a driver that only needs the guards, or a
tool that only reads a name, should not pay for. A package lists its public names with the module that
defines each; a name's module is imported the first time the name is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each name to its module
    (relative to ``package``)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
