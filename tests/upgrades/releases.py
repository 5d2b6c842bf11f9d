"""The repository's record of releases (RELEASES: "version commit" lines, oldest first) and the
version arithmetic around it: a development version X.Y.Z.devN belongs to release X.Y.Z."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "RELEASES"
#: A released number; a development version adds ``.devN``.
RELEASED_NUMBER = re.compile(r"\d+\.\d+\.\d+")


@dataclass(frozen=True)
class Release:
    version: str
    #: The full hash of the one commit the release was built from.
    commit: str


def read_releases(path: Path = RELEASES) -> list[Release]:
    """Every release recorded in ``path``, in file order (comments and blank lines left out)."""
    releases = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected 'version commit', got {line!r}")
        releases.append(Release(fields[0], fields[1]))
    return releases


def release_of(version: str) -> str:
    """The release a version is, or leads to: ``0.4.0.dev0`` -> ``0.4.0``."""
    return re.sub(r"\.dev\d+$", "", version)


def version_key(version: str) -> tuple[int, ...]:
    """``version`` (a released number) as a tuple that sorts like versions."""
    return tuple(int(part) for part in version.split("."))


def find(version: str, path: Path = RELEASES) -> Release:
    """The recorded release ``version``; ``KeyError`` naming the recorded ones when it is not."""
    releases = read_releases(path)
    for release in releases:
        if release.version == version:
            return release
    raise KeyError(f"{version} is not in {path.name} (recorded: {', '.join(r.version for r in releases)})")


def previous(version: str, path: Path = RELEASES) -> Release:
    """The newest recorded release before ``version`` (a released or development version)."""
    target = version_key(release_of(version))
    earlier = [r for r in read_releases(path) if version_key(r.version) < target]
    if not earlier:
        raise KeyError(f"no release before {version} in {path.name}")
    return max(earlier, key=lambda r: version_key(r.version))
