"""What holds the image build together without building it: the base the build script makes is the
one the Dockerfile names, the build host's pip settings stay in the build stage, CI installs podman,
and a missing podman fails the image tests with the fix instead of skipping them.
(tests/test_compose.py checks the rest of the Dockerfile statically; the other modules here run it.)
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from harness.image import BASE_IMAGE, BUILD_SCRIPT, ROOT, ImageUnavailable, build_image

DOCKERFILE = (ROOT / "Dockerfile").read_text()
SCRIPT = BUILD_SCRIPT.read_text()


def stages() -> dict[str, str]:
    """The Dockerfile's stages by name, each its text up to the next FROM."""
    parts = re.split(r"^FROM .* AS (\w+)$", DOCKERFILE, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_script_makes_the_base_the_dockerfile_names() -> None:
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, flags=re.M)
    assert default is not None
    assert default[1] == BASE_IMAGE
    assert f'base="{BASE_IMAGE}"' in SCRIPT
    # The Debian release of the made base is the one the upstream tag names.
    assert BASE_IMAGE.endswith("-bookworm") and " bookworm " in SCRIPT.replace('"', " ")


def test_the_build_hosts_pip_settings_reach_the_build_stage_only() -> None:
    build, runtime = stages()["build"], stages()["runtime"]
    passed = set(re.findall(r'--build-arg "?(PIP_\w+)=', SCRIPT))
    assert passed == {"PIP_CERT", "PIP_DEFAULT_TIMEOUT"}
    for name in passed:
        assert re.search(rf"^ARG {name}$", build, flags=re.M), name
        assert name not in runtime, f"{name} must not reach the runtime stage"
    # The CA bundle is mounted over a file the base already has: a new mount point would stay in a layer.
    assert '--volume "$PIP_CERT:/etc/ssl/certs/ca-certificates.crt:ro"' in SCRIPT
    assert "ca-certificates" in SCRIPT


def test_ci_installs_what_the_image_tests_need() -> None:
    install = (ROOT / "scripts" / "install-test-deps").read_text()
    assert 'bash "$root/scripts/install-image-deps"' in install
    image_deps = (ROOT / "scripts" / "install-image-deps").read_text()
    for package in ("podman", "runc", "mmdebstrap", "slirp4netns"):
        assert re.search(rf"^packages=\(.*\b{package}\b", image_deps, flags=re.M), package


def test_without_podman_the_image_tests_fail_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    with pytest.raises(ImageUnavailable, match=r"podman is not installed: run scripts/install-image-deps"):
        build_image(tmp_path / "build.log")
