"""snapcoord coordinator: the gRPC service that coordinates snapshots of streaming pipelines.

The layers are the folders, from the bottom up: ``domain`` (pure, typed rules and formats),
``storage`` (metadata and blob backends behind small interfaces, chosen by URI), ``config``,
``observability``, ``kernel`` (the commit machinery every aggregate shares), the aggregates
``producers``, ``snapshots`` and ``backlog``, ``services`` (the composition root), the gRPC edge
``api``, ``transport`` and ``auth``, and ``server`` (the process); no import runs back up
(docs/design.md, "Layout"). This module holds only the package version.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("snapcoord")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0+unknown"
