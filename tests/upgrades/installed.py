"""A recorded release installed in a virtualenv of its own, so that a test can run a previous
release's coordinator (``snapcoord serve``) or client beside the tree's.

The release is built from its commit by ``scripts/build-release`` (git history only, no tags) and
installed as its image installs it: the third-party packages from the release's own
``deploy/requirements.lock`` with their hashes (resolved from the pyproject ranges for 0.1.0,
which had none), then its three wheels without dependencies. The result is cached on disk by
commit (``SNAPCOORD_RELEASE_CACHE``, default ``~/.cache/snapcoord/releases``) and reused while its
wheels still match their recorded SHA-256 and the venv reports the release's version: the first
install takes minutes (pip's own cache helps), later ones a second. A lock per commit makes
concurrent test workers wait for one install instead of racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from upgrades.releases import ROOT, Release

CACHE = Path(
    os.environ.get("SNAPCOORD_RELEASE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "snapcoord" / "releases"
)
#: The distributions a release venv holds (the connector without PySpark: its code, not its runs).
DISTRIBUTIONS = ("snapcoord_client", "snapcoord", "snapcoord_spark")
_PIP = ("-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input")
#: Generous: the first install downloads grpcio, boto3... on a busy 2-core machine.
INSTALL_TIMEOUT_S = 1800


@dataclass(frozen=True)
class InstalledRelease:
    release: Release
    #: The virtualenv's directory.
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def snapcoord(self) -> Path:
        """The release's coordinator command."""
        return self.venv / "bin" / "snapcoord"

    def versions(self) -> dict[str, str]:
        """The installed version of each distribution, as the venv's Python reports it."""
        script = (
            "import json, sys; from importlib.metadata import version; "
            "print(json.dumps({d: version(d) for d in sys.argv[1:]}))"
        )
        out = subprocess.run(
            [str(self.python), "-c", script, *DISTRIBUTIONS],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        return {str(k): str(v) for k, v in json.loads(out).items()}

    def site_packages(self) -> Path:
        (found,) = (self.venv / "lib").glob("python3*/site-packages")
        return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sums_hold(dist: Path) -> bool:
    """Every file ``SHA256SUMS`` in ``dist`` lists is there with its hash."""
    sums = dist / "SHA256SUMS"
    if not sums.exists():
        return False
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        if not (dist / name).exists() or _sha256(dist / name) != digest:
            return False
    return True


def _intact(home: Path, release: Release) -> InstalledRelease | None:
    """The cached install of ``release`` in ``home``, if it is complete and unchanged."""
    stamp = home / "installed.json"
    if not stamp.exists() or not _sums_hold(home / "dist"):
        return None
    recorded = json.loads(stamp.read_text())
    if recorded != {
        "version": release.version,
        "commit": release.commit,
        "sums": _sha256(home / "dist/SHA256SUMS"),
    }:
        return None
    installed = InstalledRelease(release, home / "venv")
    try:
        versions = installed.versions()
    except (OSError, subprocess.CalledProcessError):
        return None
    return installed if set(versions.values()) == {release.version} else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(release: Release, cache: Path = CACHE) -> InstalledRelease:
    """``release`` installed in a venv under ``cache``: the cached one when intact, else built."""
    home = cache / release.commit
    with _locked(cache / f"{release.commit}.lock"):
        found = _intact(home, release)
        if found is not None:
            return found
        shutil.rmtree(home, ignore_errors=True)
        dist = home / "dist"

        def run(*command: str) -> None:
            subprocess.run(command, check=True, timeout=INSTALL_TIMEOUT_S)

        run(str(ROOT / "scripts/build-release"), release.version, "--out", str(dist))
        venv = home / "venv"
        run(sys.executable, "-m", "venv", str(venv))
        python = str(venv / "bin" / "python")
        wheels = {name: next(dist.glob(f"{name}-{release.version}-*.whl")) for name in DISTRIBUTIONS}
        lock = dist / "requirements.lock"
        if lock.exists():  # what the release's image installs, hashes checked
            run(python, *_PIP, "--require-hashes", "-r", str(lock))
            run(python, *_PIP, "--no-deps", *map(str, wheels.values()))
        else:  # 0.1.0: no lock; its pyproject ranges, resolved now
            run(python, *_PIP, str(wheels["snapcoord_client"]), str(wheels["snapcoord"]))
            run(python, *_PIP, "--no-deps", str(wheels["snapcoord_spark"]))
        stamp = {"version": release.version, "commit": release.commit, "sums": _sha256(dist / "SHA256SUMS")}
        (home / "installed.json").write_text(json.dumps(stamp))
        found = _intact(home, release)
        if found is None:
            raise RuntimeError(f"the install of {release.version} in {home} does not hold together")
        return found
