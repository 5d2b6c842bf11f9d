"""Coordinator replicas of different releases on one 3-node ZooKeeper ensemble and one S3: the
deployment of a rolling upgrade (and of its rollback).

``MixedCluster(workdir, blobs_uri, [previous, None])`` is a ``harness.cluster.Cluster`` whose
replica ``i`` runs the ``snapcoord serve`` of ``releases[i]``: an ``InstalledRelease`` (built from
its commit), None for this tree's, or a command in place of ``snapcoord`` (a planted build).
``swap(i, release)`` is one step of an upgrade or rollback:
it replaces replica ``i`` by a process of ``release`` on the same port, so clients holding the
cluster's addresses find it again, as they would behind a stable name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

from harness.cluster import Cluster, Replica
from upgrades.installed import InstalledRelease

#: What a replica runs: a release, this tree (None), or a command in place of ``snapcoord``.
Build: TypeAlias = InstalledRelease | tuple[str, ...] | None

_BUILD_INFO_RE = re.compile(r'^snapcoord_build_info\{[^}]*version="([^"]+)"', re.MULTILINE)


class MixedCluster(Cluster):
    def __init__(
        self,
        workdir: Path,
        blobs_uri: str,
        releases: Sequence[Build],
        *,
        chroot: str = "snapcoord",
    ) -> None:
        #: What each replica runs: a release, or None for this tree (set before the replicas are made).
        self.releases = list(releases)
        super().__init__(workdir, blobs_uri, replicas=len(self.releases), chroot=chroot)

    def __enter__(self) -> MixedCluster:
        super().__enter__()
        return self

    def _replica(self, i: int, metadata: str | None = None, port: int = 0) -> Replica:
        # Cluster starts every replica with ``self.command``: point it at replica i's release.
        release = self.releases[i]
        if isinstance(release, InstalledRelease):
            self.command = [str(release.snapcoord)]
        else:
            self.command = None if release is None else list(release)
        return super()._replica(i, metadata, port)

    def swap(self, i: int, release: Build) -> Replica:
        """Replace replica ``i`` by one of ``release`` (None: this tree), on its port when free."""
        self.releases[i] = release
        return self.replace(i)

    def version(self, i: int) -> str:
        """The version replica ``i`` reports in ``snapcoord_build_info``."""
        found = _BUILD_INFO_RE.search(self.replicas[i].metrics_text())
        if found is None:
            raise AssertionError(f"replica {i} exports no snapcoord_build_info")
        return found[1]
