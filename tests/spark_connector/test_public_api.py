"""The connector's public names: every one importable from the package root, and from its part's package."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import snapcoord.spark_connector as connector

PARTS = ("sink", "savepoints", "backlog")


def test_every_public_name_resolves_from_the_root() -> None:
    for name in connector.__all__:
        value = getattr(connector, name)
        assert getattr(value, "__name__", name) == name, f"{name} resolves to {value!r}"
    assert set(connector.__all__) <= set(dir(connector))


@pytest.mark.parametrize("part", PARTS)
def test_each_part_exports_what_the_root_does(part: str) -> None:
    package = importlib.import_module(f"snapcoord.spark_connector.{part}")
    assert set(package.__all__) <= set(connector.__all__)
    for name in package.__all__:
        assert getattr(package, name) is getattr(connector, name), f"{part}.{name}"


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(
        AttributeError, match=r"'snapcoord\.spark_connector' has no attribute 'exactly_twice'"
    ):
        connector.exactly_twice  # noqa: B018


@pytest.mark.process
def test_the_root_does_not_import_pyspark() -> None:
    """A driver that imports only the guards, or a tool that reads the package, does not load pyspark."""
    code = (
        "import sys, snapcoord.spark_connector as c; assert c.require_driver; print('pyspark' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
