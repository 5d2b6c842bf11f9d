"""Snapshot responses whose task set is encoded once, not on every call.

A snapshot header carries its whole task set, and CreateSnapshot, GetCurrentSnapshot and every
ReportTaskSnapshot answer with it: at 2,000 tasks, building and serialising the ``task_ids``
field was most of the response's cost (about 60 us of a report's server CPU), for a list that
stays the same for the snapshot's life. ``encode_snapshot`` writes the field's wire bytes from a
memo and the other fields around it, in field-number order: the bytes protobuf itself writes for
the same message (a parser would accept any order; this one is also byte-for-byte the same).
The servicer returns them as they are (``chunk_frames.PreEncoded`` passes bytes through).
"""

from __future__ import annotations

from collections.abc import Mapping

from snapcoord.coordinator.api.convert import snapshot_to_pb
from snapcoord.coordinator.domain.lru import Lru
from snapcoord.coordinator.domain.snapshots import Snapshot
from snapcoord.v1 import snapshot_pb2

#: Task sets smaller than this are encoded with the rest of the message: their field is cheap.
MEMO_MIN_TASKS = 64
#: The most bytes of encoded task sets kept (their tuples, the keys, weigh about as much again).
MEMO_MAX_BYTES = 16 * 1024 * 1024

_TASK_FIELDS: Lru[tuple[str, ...], bytes] = Lru(MEMO_MAX_BYTES)


def _task_ids_field(task_ids: tuple[str, ...]) -> bytes:
    field = _TASK_FIELDS.get(task_ids)
    if field is None:
        field = snapshot_pb2.Snapshot(task_ids=task_ids).SerializeToString()
        _TASK_FIELDS.put(task_ids, field, 2 * len(field))
    return field


def encode_snapshot(
    snapshot: Snapshot, payloads: Mapping[tuple[str, str], bytes] | None = None
) -> bytes | snapshot_pb2.Snapshot:
    """``snapshot_to_pb(snapshot, payloads)``, serialised with a memoised task set when it is
    large; a small one's message as it is (the response serializer takes either)."""
    record = snapshot.record
    whole = snapshot_to_pb(snapshot, payloads, with_task_ids=len(record.task_ids) < MEMO_MIN_TASKS)
    if len(record.task_ids) < MEMO_MIN_TASKS:
        return whole
    # Fields 1-3 (app_id, generation, state) come before task_ids (4), the rest after it.
    head = snapshot_pb2.Snapshot(app_id=whole.app_id, generation=whole.generation, state=whole.state)
    whole.ClearField("app_id")
    whole.ClearField("generation")
    whole.ClearField("state")
    return b"".join((head.SerializeToString(), _task_ids_field(record.task_ids), whole.SerializeToString()))
