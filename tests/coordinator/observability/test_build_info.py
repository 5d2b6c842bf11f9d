"""``snapcoord_build_info``: one sample of value 1 naming the version, the revision and Python, on
every server's registry; the revision comes from SNAPCOORD_REVISION through the config."""

from __future__ import annotations

import platform

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from snapcoord.coordinator import __version__
from snapcoord.coordinator.config.settings import load
from snapcoord.coordinator.observability import build_info
from snapcoord.coordinator.observability.metrics import new_registry


def _samples(text: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == build_info.NAME
    ]


def test_one_sample_of_1_naming_the_build() -> None:
    registry = new_registry()
    build_info.register(registry, "4f2a9c1")
    labels = {"version": __version__, "revision": "4f2a9c1", "python": platform.python_version()}
    assert _samples(generate_latest(registry).decode()) == [(labels, 1.0)]


@pytest.mark.parametrize(
    ("environ", "revision"),
    [
        ({}, "unknown"),
        ({"SNAPCOORD_REVISION": ""}, "unknown"),
        ({"SNAPCOORD_REVISION": "4f2a9c1"}, "4f2a9c1"),
    ],
)
def test_the_revision_comes_from_the_environment(environ: dict[str, str], revision: str) -> None:
    assert load({}, environ).metrics.revision == revision
