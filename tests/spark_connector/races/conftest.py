"""The stores the commit races run on, each a ``scenarios.Store`` made by one factory of ``STORES``.

- ``local``: a local directory (``LocalStorage``: exclusive create is a ``link``, atomic): the control;
- ``hadoop-sftp``: the connector's Hadoop storage over Hadoop's ``SFTPFileSystem`` on the test sshd, in
  the ``spark`` session's JVM (no query runs: only its FileSystem calls);
- ``fsspec-sftp``: the connector's fsspec storage over paramiko on the same sshd;
- ``s3a-unconditional``: the connector's Hadoop storage over S3A (the session's hadoop-aws 3.5) on the
  test SeaweedFS with ``fs.s3a.create.conditional.enabled=false``: an exclusive create is
  ``create(overwrite=false)`` (S3A's existence check) and then the PUT at the stream's close, as on
  hadoop-aws before 3.4.2 or a store without conditional writes. Its reader is s3fs.

The sftp and s3a stores have ``atomic_exclusive`` False. A store is one entry of ``STORES`` (how to
make it, its markers, whether it is atomic), plus its pairs in ``test_commit_races.KNOWN_GAPS`` if it
exposes batches on the store-only path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import s3a
from harness.locations import sftp_dir
from harness.seaweed import SeaweedS3Server
from harness.sshd import SshServer
from snapcoord.spark_connector.storage import LocalStorage, Storage, open_location
from snapcoord.spark_connector.storage.fsspec_storage import FsspecStorage
from snapcoord.spark_connector.storage.hadoop import HadoopStorage

from .scenarios import Store


def _per_actor(open_one: Callable[[], Storage]) -> Callable[[str], Storage]:
    """``storage_for``: one ``Storage`` per actor name, opened on first use."""
    opened: dict[str, Storage] = {}

    def storage_for(actor: str) -> Storage:
        if actor not in opened:
            opened[actor] = open_one()
        return opened[actor]

    return storage_for


@contextmanager
def local_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    tmp: Path = request.getfixturevalue("tmp_path_factory").mktemp("races-local")
    yield Store("local", _per_actor(lambda: LocalStorage(tmp)), LocalStorage(tmp))


@contextmanager
def hadoop_sftp_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    spark = request.getfixturevalue("spark")
    sshd: SshServer = request.getfixturevalue("sshd")
    with sftp_dir(sshd, "races-hadoop") as d:

        def open_one() -> Storage:
            storage = open_location(d.uri, spark=spark)
            assert isinstance(storage, HadoopStorage), storage
            return storage

        yield Store("hadoop-sftp", _per_actor(open_one), d.storage)


@contextmanager
def fsspec_sftp_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    sshd: SshServer = request.getfixturevalue("sshd")
    # An fsspec filesystem object of its own per actor (as each driver has): fsspec would otherwise
    # hand both the same one, whose sftp lock serialises whole storage calls.
    options = {**sshd.storage_options(), "skip_instance_cache": True}
    with sftp_dir(sshd, "races-fsspec") as d:

        def open_one() -> Storage:
            storage = open_location(d.uri, use_jvm=False, storage_options=options)
            assert isinstance(storage, FsspecStorage), storage
            return storage

        yield Store("fsspec-sftp", _per_actor(open_one), d.storage)


#: What makes S3A's exclusive create a check and then a PUT; a FileSystem of its own per actor (the
#: switch is read when one is made, and each driver has its own).
S3A_UNCONDITIONAL = {"fs.s3a.create.conditional.enabled": "false", "fs.s3a.impl.disable.cache": "true"}


@contextmanager
def s3a_unconditional_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    spark = request.getfixturevalue("spark")
    server: SeaweedS3Server = request.getfixturevalue("s3_server")
    with s3a.s3a_dir(server, "races-s3a") as d:

        def open_one() -> Storage:
            for key, value in S3A_UNCONDITIONAL.items():
                spark.conf.set(key, value)
            try:
                storage = open_location(d.uri, spark=spark)
            finally:
                for key in S3A_UNCONDITIONAL:
                    spark.conf.unset(key)
            assert isinstance(storage, HadoopStorage), storage
            return storage

        yield Store("s3a-unconditional", _per_actor(open_one), d.storage)


@dataclass(frozen=True)
class StoreKind:
    """How to make one store for a test (a context manager of the test's request), the markers of the
    servers it starts (requested at run time, which marking by fixtures cannot see), and whether its
    ``Storage`` must say its exclusive create is atomic."""

    make: Callable[[pytest.FixtureRequest], AbstractContextManager[Store]]
    marks: tuple[pytest.MarkDecorator, ...]
    atomic_exclusive: bool


#: Every store the races run on.
STORES: dict[str, StoreKind] = {
    "local": StoreKind(local_store, (), atomic_exclusive=True),
    "hadoop-sftp": StoreKind(
        hadoop_sftp_store, (pytest.mark.spark, pytest.mark.process), atomic_exclusive=False
    ),
    "fsspec-sftp": StoreKind(fsspec_sftp_store, (pytest.mark.process,), atomic_exclusive=False),
    "s3a-unconditional": StoreKind(
        s3a_unconditional_store, (pytest.mark.spark, pytest.mark.s3), atomic_exclusive=False
    ),
}


@pytest.fixture(
    scope="module", params=[pytest.param(name, marks=kind.marks) for name, kind in STORES.items()]
)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """Each store of ``STORES`` in turn, shared by the module's tests; checks its ``atomic_exclusive``."""
    kind = STORES[request.param]
    with kind.make(request) as made:
        assert made.atomic_exclusive == kind.atomic_exclusive, made
        yield made
