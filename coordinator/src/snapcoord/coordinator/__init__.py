"""snapcoord coordinator: the gRPC service that coordinates snapshots of streaming pipelines.

Layers, each in its own subpackage: ``domain`` (pure, typed rules), ``storage`` (metadata and blob
backends behind small interfaces, chosen by URI), ``api`` (gRPC servicers that convert and call
the domain) and the server plumbing (config, interceptors, health, metrics, CLI).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("snapcoord")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0+unknown"
