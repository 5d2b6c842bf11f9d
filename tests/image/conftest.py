"""The live image tests: the coordinator image built from the Dockerfile once per session, run with podman.

``snapcoord_image`` builds it with ``scripts/build-image`` (cached base and layers: seconds when
nothing changed). Where podman, the base or the build cannot be had, every test here FAILS with what
to run; nothing skips. ``pytest --fast`` leaves them out (they carry the ``process`` marker).
The build time, size and layers and each container's run-to-SERVING time are in the run's summary.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.image import BuiltImage, ImageUnavailable, build_image

_REPORT_KEY = pytest.StashKey[list[str]]()
_PROPERTY = "image"


@pytest.fixture(scope="session")
def snapcoord_image(tmp_path_factory: pytest.TempPathFactory, image_report: list[str]) -> BuiltImage:
    try:
        image = build_image(tmp_path_factory.mktemp("image-build") / "build.log")
    except ImageUnavailable as e:
        pytest.fail(f"the coordinator image cannot be built: {e}", pytrace=False)
    image_report.append(image.summary())
    return image


@pytest.fixture(scope="session")
def image_report(pytestconfig: pytest.Config) -> list[str]:
    """Lines for the run's summary (build time, size, layers, run-to-SERVING times)."""
    return pytestconfig.stash.setdefault(_REPORT_KEY, [])


@pytest.fixture(autouse=True)
def _report_lines(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[None]:
    """Hand the lines added during a test to its report (``user_properties``), which pytest-xdist
    carries from the workers to the controller that writes the summary."""
    lines = pytestconfig.stash.setdefault(_REPORT_KEY, [])
    yield
    request.node.user_properties.extend((_PROPERTY, line) for line in lines)
    lines.clear()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, line in getattr(report, "user_properties", ()):
                if key == _PROPERTY and getattr(report, "when", "") == "teardown":
                    terminalreporter.write_line(f"image: {line}")
