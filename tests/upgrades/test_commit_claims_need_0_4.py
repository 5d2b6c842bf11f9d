"""A table whose store has no atomic create, against the previous release's coordinator (built from
its commit), which lacks ``CommitClaimService``: the sink refuses, naming the version it needs, and
writes nothing; it never falls back to the store-only commit (issue #42, point 3). A table on a store
whose create is atomic makes no claim, so the same coordinator serves it as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from harness.locations import sftp_dir
from harness.one_file_sink import OneFileSink
from harness.sshd import SshServer
from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.sink import CoordinatorRequired
from snapcoord.spark_connector.sink.claims import CLAIMS_VERSION
from snapcoord.spark_connector.storage import LocalStorage, open_location
from upgrades.installed import InstalledRelease
from upgrades.releases import version_key

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def old_coordinator(
    tmp_path_factory: pytest.TempPathFactory, previous_release: InstalledRelease
) -> Iterator[CoordinatorProcess]:
    command = [str(previous_release.snapcoord)]
    with CoordinatorProcess(tmp_path_factory.mktemp("previous"), command=command) as process:
        yield process


def test_a_coordinator_without_commit_claims_is_refused_by_name(
    tmp_path: Path, old_coordinator: CoordinatorProcess, previous_release: InstalledRelease
) -> None:
    assert version_key(previous_release.release.version) < version_key(CLAIMS_VERSION)
    sshd = SshServer(tmp_path / "sshd")
    sshd.start()
    try:
        with sftp_dir(sshd, "claims-old") as d, CoordinatorClient(old_coordinator.target) as client:
            options = {**sshd.storage_options(), "skip_instance_cache": True}
            storage = open_location(d.uri_of("t"), use_jvm=False, storage_options=options)
            sink = OneFileSink(storage, "w", coordinator=client)
            assert sink.needs_coordinator()
            with pytest.raises(CoordinatorRequired, match=rf"snapcoord {CLAIMS_VERSION} or later"):
                sink.fence(1)
            assert d.storage.list("t") == []  # nothing announced, nothing written

            atomic = OneFileSink(LocalStorage(tmp_path / "local"), "w", coordinator=client)
            atomic.fence(1)
            assert atomic.write(b'{"v": 1}\n', 0) == 1
            assert [c.batch_id for c in atomic.commits()] == [0]
    finally:
        sshd.stop()
