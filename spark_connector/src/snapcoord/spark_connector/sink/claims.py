"""The coordinator as the commit point of a table whose store has no atomic create-if-absent.

On such a store (``Storage.atomic_exclusive`` False: sftp, S3A without conditional create, fsspec's
sftp/GCS/Azure) a create-if-absent is a check and then a write, so two writers racing for one log
number can both pass the check, and the later write wins. ``PartitionedFileSink`` then takes the
exclusivity from the coordinator's ``CommitClaimService`` (ZooKeeper transactions): a fence raises the
table's epoch and claims the number its run starts at, and every commit claims its number before its
entry is written. Of two writers of one number exactly one is granted it, and a writer of a fenced
epoch is granted nothing, so the loser never writes its entry.

``table_id`` names a table in the coordinator: every driver of every run of the table, reaching it
through Hadoop or fsspec, must derive the same one (a different one would give two writers two
independent sets of claims). It is derived from the table's location with what tells two tables
apart and nothing a client may spell differently: the scheme family (``s3``/``s3a``/``s3n`` are one
store), the host in lower case without the user, the port unless it is the scheme's default, and the
path without a trailing slash, percent-decoded. Its digest keeps it within the API's identifier
syntax; the readable prefix (the table directory's name) is for operators.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from snapcoord.client import CoordinatorClient, TableFenced, Unimplemented
from snapcoord.client.errors import INTRODUCED_IN
from snapcoord.spark_connector.sink.epochs import Fenced

#: The first coordinator release with ``CommitClaimService``.
CLAIMS_VERSION = INTRODUCED_IN["ClaimCommit"]
#: Schemes that name one store under several spellings (Hadoop's and fsspec's).
_SCHEME_FAMILY = {"s3a": "s3", "s3n": "s3", "gs": "gcs", "abfss": "abfs", "wasbs": "wasb"}
_DEFAULT_PORTS = {"sftp": 22, "ssh": 22}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class CoordinatorRequired(RuntimeError):
    """A table on a store without an atomic create was fenced or written without a coordinator (or
    with one that lacks ``CommitClaimService``): its commits would not be exclusive. Nothing was
    written."""


def table_id_of(location: str) -> str:
    """The coordinator's name for the table at ``location`` (a URI or a path); see the module
    docstring for what it keeps and why."""
    parsed = urlparse(location if "://" in location else f"file://{location}")
    scheme = parsed.scheme.lower()
    family = _SCHEME_FAMILY.get(scheme, scheme)
    host = (parsed.hostname or "").lower()
    port = parsed.port
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    path = re.sub(r"/+", "/", unquote(parsed.path)).rstrip("/") or "/"
    canonical = f"{family}://{host}{path}"
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
    name = _SAFE.sub("_", path.rpartition("/")[2])[:60] or "root"
    return f"table.{name}.{digest}"


@dataclass
class CommitPoint:
    """A table's claims in the coordinator: ``fence`` and ``claim`` raise the sink's own errors."""

    client: CoordinatorClient
    table_id: str
    table: str  # for messages: the sink's repr

    def fence(self, epoch: int, seq: int) -> int:
        """Raise the table's fence to ``epoch`` and claim the number its run starts at (``seq`` or
        above every claim already granted); returns that number. ``Fenced`` when a newer epoch holds
        the table."""
        with self._translated(f"epoch {epoch} cannot fence it"):
            fence = self.client.fence_table(self.table_id, epoch, seq)
        return int(fence.from_seq)

    def claim(self, seq: int, epoch: int, attempt: str, batch_id: int | None) -> None:
        """Claim log number ``seq`` for this write before its entry is written. ``Fenced`` when a
        newer epoch fenced the table or holds the number; ``RuntimeError`` when another write of the
        same epoch holds it (two sink objects writing one table as one run)."""
        with self._translated(f"epoch {epoch} cannot claim sequence {seq} (batch {batch_id}): not written"):
            result = self.client.claim_commit(self.table_id, seq, epoch, attempt)
        if result.granted:
            return
        holder = result.holder
        if holder.epoch > epoch or result.fence_epoch > epoch:
            raise Fenced(
                f"{self.table}: epoch {max(holder.epoch, result.fence_epoch)} holds sequence {seq} "
                f"(claimed by {holder.attempt!r}) before epoch {epoch} committed batch {batch_id} "
                "there: not written"
            )
        raise RuntimeError(
            f"{self.table}: sequence {seq} is claimed by another write ({holder.attempt!r}, epoch "
            f"{holder.epoch}) of epoch {epoch} (two sink objects writing one table as one run, or an "
            "earlier attempt of this run that failed before writing its entry: a new run, which "
            "fences the table, goes on after it); batch not written"
        )

    @contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        """The coordinator's refusals as the sink's errors: ``TABLE_FENCED`` is ``Fenced``; a
        coordinator without the service (``UNIMPLEMENTED``) is ``CoordinatorRequired`` naming the
        release needed. Anything else (``Unavailable`` after the client's retries) propagates."""
        try:
            yield
        except TableFenced as e:
            raise Fenced(
                f"{self.table}: the coordinator holds table {self.table_id} fenced by epoch "
                f"{e.fence_epoch}; {what}"
            ) from None
        except Unimplemented as e:
            raise CoordinatorRequired(
                f"{self.table}: the coordinator does not provide CommitClaimService ({e}); a table on "
                f"a store without an atomic create needs snapcoord {CLAIMS_VERSION} or later as its "
                "commit point. Upgrade the coordinator. Nothing was written."
            ) from None
