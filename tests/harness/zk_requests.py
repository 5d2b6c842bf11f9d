"""Count what a coordinator's metadata store sends to ZooKeeper: every request its kazoo client
makes (its ``_call``, as ``bench/hot_rpcs.py`` counts them) and every call into the store (each
one sequential round trip: a ``get_many`` pipelines its reads), and answer some of its requests
with an error instead of sending them (``fail_requests``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from snapcoord.coordinator.storage.metadata import MetadataStore
from snapcoord.coordinator.storage.zookeeper.clock import CLOCK_PATH
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

#: The store calls that each make one round trip.
ROUND_TRIPS = (
    "get",
    "get_many",
    "synced_get_many",
    "create_and_get_many",
    "children",
    "sync",
    "create",
    "set",
    "delete",
    "transaction",
)


def is_clock_check(request: object) -> bool:
    """A request of the server's clock check (a write of its own node every second, on the same
    client), which comes at any time and is no part of what an RPC sends."""
    path = str(getattr(request, "path", ""))
    return path.endswith(CLOCK_PATH) or f"{CLOCK_PATH}/" in path


@dataclass
class Counted:
    requests: int = 0
    rounds: int = 0
    #: The kazoo request types, in order (``GetData``, ``Transaction``...).
    log: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.requests = self.rounds = 0
        self.log.clear()


def count_requests(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> Counted:
    """Start counting on ``store`` (a ZooKeeper store) until ``monkeypatch`` undoes it."""
    assert isinstance(store, ZooKeeperMetadataStore)
    counts = Counted()
    client = store.kazoo
    real_call = client._call

    def counting(request: object, async_object: object) -> object:
        if is_clock_check(request):
            return real_call(request, async_object)
        counts.requests += 1
        counts.log.append(type(request).__name__)
        return real_call(request, async_object)

    monkeypatch.setattr(client, "_call", counting)
    for name in ROUND_TRIPS:
        inner = getattr(store, name)

        def round_trip(*args: object, _inner: object = inner, **kwargs: object) -> object:
            counts.rounds += 1
            return _inner(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(store, name, round_trip)
    return counts


def fail_requests(
    store: MetadataStore,
    monkeypatch: pytest.MonkeyPatch,
    kind: type,
    error: type[Exception],
    *,
    times: int | None = None,
) -> list[object]:
    """Answer the store's kazoo requests of ``kind`` (``GetData``, ``MultiRead``, ``Sync``...) with
    ``error()`` instead of sending them: every one, or the first ``times``. Returns the requests
    so answered. Installed before another hook of ``_call``, it acts behind that hook."""
    assert isinstance(store, ZooKeeperMetadataStore)
    client = store.kazoo
    real_call = client._call
    failed: list[object] = []

    def call(request: object, async_object: Any) -> object:
        if (
            isinstance(request, kind)
            and not is_clock_check(request)
            and (times is None or len(failed) < times)
        ):
            failed.append(request)
            async_object.set_exception(error())
            return True
        return real_call(request, async_object)

    monkeypatch.setattr(client, "_call", call)
    return failed
