"""Keeping a snapshot lease alive for the length of a ``with`` block, and lease ids that survive
a driver restart.

``LeaseKeeper`` acquires on entry, renews from a daemon thread every ``duration / 3`` (two
renewals may fail before the lease lapses), and drops the lease on exit. A coordinator that
predates leases answers UNIMPLEMENTED: the keeper logs one warning and lets the block run
unprotected, as Fluss's tiering service does, because refusing to run would turn an upgrade
order problem into an outage.

A driver that dies inside the block leaves its lease until expiry. ``load_or_create_lease_id``
keeps the id in a file, so the restarted driver acquires the same lease again (AcquireSnapshots
creates if absent and otherwise takes the lease over) instead of leaking a second one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from snapcoord.client._types import Lease, SnapshotRef
from snapcoord.client.errors import NotFound, SnapcoordError, Unimplemented

if TYPE_CHECKING:
    from snapcoord.client.client import CoordinatorClient

_log = logging.getLogger("snapcoord.client")


class LeaseKeeper:
    """Holds lease ``lease_id`` on ``snapshots`` while inside ``with``; see ``CoordinatorClient.lease``.

    State for the block to look at: ``lease`` (latest answer, None when unsupported),
    ``unavailable`` (requested snapshots that could not be pinned on entry), ``lost`` (snapshots
    pinned once but gone when an expired lease had to be acquired again), ``last_error`` (of the
    latest renewal; None after a success), ``supported`` (False against a coordinator without
    leases) and ``healthy`` (the lease is held, its latest renewal succeeded, nothing was lost, and
    ``duration_s`` has not passed since that renewal was sent: a renewal still in flight when the
    lease runs out does not keep it healthy).
    """

    def __init__(
        self,
        client: CoordinatorClient,
        lease_id: str,
        snapshots: Iterable[SnapshotRef],
        duration_s: float,
        *,
        renew_every_s: float | None = None,
        drop_on_exit: bool = True,
    ) -> None:
        if duration_s <= 0:
            raise ValueError(f"duration_s must be positive, got {duration_s}")
        interval_s = duration_s / 3 if renew_every_s is None else renew_every_s
        if not 0 < interval_s < duration_s:
            raise ValueError(f"renew_every_s must be within (0, duration_s={duration_s}), got {interval_s}")
        self._client = client
        self.lease_id = lease_id
        self._refs = tuple(snapshots)
        self._duration_ms = max(1, round(duration_s * 1000))
        self._interval_s = interval_s
        self._drop_on_exit = drop_on_exit
        self._lease: Lease | None = None
        self._unavailable: tuple[SnapshotRef, ...] = ()
        self._lost: tuple[SnapshotRef, ...] = ()
        self._last_error: BaseException | None = None
        # time.monotonic() until which the latest successful acquire or renewal holds the lease
        # (from when it was sent: the coordinator counts the duration from later).
        self._held_until = 0.0
        self._supported = True
        self._entered = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state -----------------------------------------------------------------------------------------
    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def unavailable(self) -> tuple[SnapshotRef, ...]:
        return self._unavailable

    @property
    def lost(self) -> tuple[SnapshotRef, ...]:
        return self._lost

    @property
    def last_error(self) -> BaseException | None:
        return self._last_error

    @property
    def supported(self) -> bool:
        return self._supported

    @property
    def healthy(self) -> bool:
        return (
            self._supported
            and self._lease is not None
            and self._last_error is None
            and not self._lost
            and time.monotonic() < self._held_until
        )

    # -- with ------------------------------------------------------------------------------------------
    def __enter__(self) -> LeaseKeeper:
        if self._entered:
            raise RuntimeError("a LeaseKeeper can be entered once; make a new one")
        self._entered = True
        sent = time.monotonic()
        try:
            result = self._client.acquire_snapshots(self.lease_id, self._refs, duration_ms=self._duration_ms)
        except Unimplemented as e:
            self._degrade(e)
            return self
        self._lease, self._unavailable = result.lease, result.unavailable
        self._held_until = sent + self._duration_ms / 1000
        self._thread = threading.Thread(
            target=self._run, name=f"snapcoord-lease-{self.lease_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            # Joined before the drop, so no renewal can re-create the lease after it. Each renewal
            # ends within its deadline, so this wait is bounded.
            self._thread.join()
        if not (self._supported and self._drop_on_exit):
            return
        try:
            self._client.drop_lease(self.lease_id)
        except Unimplemented:
            pass
        except SnapcoordError as e:
            # Not raised: the block's own outcome matters more, and the lease expires by itself.
            self._last_error = e
            _log.warning("could not drop lease %s (%s); it ends when it expires", self.lease_id, e)

    # -- renewal thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        delay = self._interval_s
        while not self._stop.wait(delay):
            try:
                self._renew()
            except Unimplemented as e:  # the coordinator was downgraded under us
                self._degrade(e)
                return
            except Exception as e:  # the thread must outlive any one failure
                self._last_error = e
                delay = max(0.05, self._interval_s / 4)  # try again soon: the lease is running out
                _log.warning("renewing lease %s failed: %s; retrying in %.1fs", self.lease_id, e, delay)
            else:
                self._last_error = None
                delay = self._interval_s

    def _renew(self) -> None:
        # A renewal that takes longer than the interval is of no use: the next one is due.
        timeout_s = min(self._client.timeout_s, self._interval_s)
        sent = time.monotonic()
        try:
            self._lease = self._client.renew_lease(
                self.lease_id, duration_ms=self._duration_ms, timeout_s=timeout_s
            )
            self._held_until = sent + self._duration_ms / 1000
            return
        except NotFound:
            if self._stop.is_set():
                return  # exiting: __exit__ drops it anyway, never re-create it now
        # The lease expired (renewals failed for a whole duration) or someone dropped it: acquire
        # what it held again. A snapshot deleted in the gap cannot be pinned again: that is lost.
        held = self._lease.snapshots if self._lease is not None else self._refs
        sent = time.monotonic()
        result = self._client.acquire_snapshots(
            self.lease_id, held, duration_ms=self._duration_ms, timeout_s=timeout_s
        )
        self._lease = result.lease
        self._held_until = sent + self._duration_ms / 1000
        if result.unavailable:
            self._lost = tuple(dict.fromkeys((*self._lost, *result.unavailable)))
            _log.error(
                "lease %s had expired; snapshots deleted meanwhile are no longer pinned: %s",
                self.lease_id,
                ", ".join(f"{r.app_id}@{r.generation}" for r in result.unavailable),
            )
        else:
            _log.warning("lease %s had expired or was dropped; acquired it again", self.lease_id)

    def _degrade(self, error: Unimplemented) -> None:
        self._supported = False
        self._lease = None
        _log.warning(
            "the coordinator at %s does not support leases (%s); lease %s is not held and its snapshots "
            "are not protected from cleanup",
            self._client.target,
            error.details or error.code,
            self.lease_id,
        )

    def __reduce__(self) -> Any:
        raise TypeError("a LeaseKeeper cannot be pickled: it runs a thread in the driver")


# --- lease ids in a file ---------------------------------------------------------------------------

_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def _check_id(lease_id: str, what: str) -> str:
    if not _ID_RE.fullmatch(lease_id) or lease_id in (".", ".."):
        raise ValueError(f"{what} {lease_id!r} is not a valid lease id (1-200 of [A-Za-z0-9._:-])")
    return lease_id


def _read_id(path: Path) -> str:
    return _check_id(path.read_text(encoding="utf-8").strip(), f"{path} holds")


def _write_temp(path: Path, lease_id: str) -> Path:
    """A fully written, fsynced file next to ``path`` (same filesystem, for rename and link)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(lease_id + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_lease_id(path: str | os.PathLike[str], lease_id: str) -> None:
    """Write ``lease_id`` to ``path`` atomically (a reader sees the old id or the new one, whole)."""
    target = Path(path)
    _check_id(lease_id, "lease_id")
    tmp = _write_temp(target, lease_id)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def load_or_create_lease_id(path: str | os.PathLike[str], prefix: str = "lease") -> str:
    """The lease id stored at ``path``; when there is none, a new ``<prefix>-<uuid>`` stored there.

    Creation is create-if-absent (a hard link of a complete file), so drivers racing on a fresh
    path all end up with the one id that won, and nobody ever reads a half-written file.
    """
    target = Path(path)
    try:
        return _read_id(target)
    except FileNotFoundError:
        pass
    new_id = _check_id(f"{prefix}-{uuid.uuid4().hex}", "prefix gives")
    tmp = _write_temp(target, new_id)
    try:
        os.link(tmp, target)
    except FileExistsError:
        return _read_id(target)  # another driver won the race
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(target.parent)
    return new_id
