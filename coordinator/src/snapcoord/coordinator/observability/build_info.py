"""``snapcoord_build_info{version, revision, python}`` = 1: which build a process runs.

The usual Prometheus "info" series (like ``prometheus_build_info``): join on it to break any
series down by version (``* on (instance) group_left(version) snapcoord_build_info``), or alert
when replicas run different versions. ``version`` is the installed package's, ``revision`` the
source revision the image was built from (``SNAPCOORD_REVISION``, "unknown" when the build did
not say), ``python`` the interpreter's version. A collector, not a Gauge: the value never
changes, and with ``--processes`` > 1 the supervisor alone serves it, once for the set.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from snapcoord.coordinator import __version__

NAME = "snapcoord_build_info"


class BuildInfo(Collector):
    """The one ``snapcoord_build_info`` sample of this process."""

    def __init__(self, revision: str) -> None:
        self.labels = {"version": __version__, "revision": revision, "python": platform.python_version()}

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            NAME, "The running build: version, source revision and Python version (always 1).",
            labels=sorted(self.labels),
        )  # fmt: skip
        family.add_metric([self.labels[k] for k in sorted(self.labels)], 1.0)
        return [family]


def register(registry: CollectorRegistry, revision: str) -> None:
    """Add the series to ``registry``."""
    registry.register(BuildInfo(revision))
