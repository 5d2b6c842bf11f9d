"""Where generation snapshots live.

Metadata (the commit point)::

    /snapshots/apps/<app>                                  {"current_generation": N}
    /snapshots/apps/<app>/retention                        the app's retention override
    /snapshots/apps/<app>/gens/<generation, 20 digits>     the snapshot header (state, task set...)
    /snapshots/apps/<app>/gens/<generation>/tasks/<task>   one task's report: offsets, checkpoint refs
    /snapshots/deadlines/<minute>/<app>@<generation>       CREATED snapshots by timeout (ExpiryIndex)
    /snapshots/retention/<minute>/<app>@<generation|policy> "evaluate this app's retention then"
    /snapshots/pins/<app>@<generation>                     leases pinning a snapshot (snapshots.pins)

Checkpoint payloads go to the blob store under ``snapshots/<app>/<generation>/<task>/<uuid>``,
written before the report that points at them commits and deleted after the snapshot is gone.

Every change is one version-checked transaction: a report creates its task node and bumps the
header (flipping it to COMPLETED when it is the last one) in the same commit, so concurrent reports
never lose one and exactly one of them completes the snapshot; a new generation moves the app's
current pointer and creates the header together, so generations never repeat or go back.
"""

from __future__ import annotations

from snapcoord.coordinator.domain.snapshots import SnapshotRecord
from snapcoord.coordinator.kernel.expiry_index import entry_path

APPS = "/snapshots/apps"
DEADLINES = "/snapshots/deadlines"
RETENTION = "/snapshots/retention"
OBJECT_PREFIX = "snapshots/"


def app_path(app_id: str) -> str:
    return f"{APPS}/{app_id}"


def retention_path(app_id: str) -> str:
    return f"{APPS}/{app_id}/retention"


def gens_path(app_id: str) -> str:
    return f"{APPS}/{app_id}/gens"


def gen_path(app_id: str, generation: int) -> str:
    return f"{APPS}/{app_id}/gens/{generation:020d}"


def tasks_path(app_id: str, generation: int) -> str:
    return f"{gen_path(app_id, generation)}/tasks"


def task_path(app_id: str, generation: int, task_id: str) -> str:
    return f"{tasks_path(app_id, generation)}/{task_id}"


def checkpoint_key(app_id: str, generation: int, task_id: str, unique: str) -> str:
    return f"{OBJECT_PREFIX}{app_id}/{generation}/{task_id}/{unique}"


def owner_of_checkpoint(key: str) -> tuple[str, int, str] | None:
    """(app, generation, task) of a checkpoint object; None for a key that is not one."""
    parts = key.split("/")  # snapshots/<app>/<generation>/<task>/<uuid>
    return (parts[1], int(parts[2]), parts[3]) if len(parts) == 5 and parts[2].isdigit() else None


def ref(app_id: str, generation: int) -> str:
    return f"{app_id}@{generation}"


def parse_ref(name: str) -> tuple[str, str] | None:
    app_id, sep, rest = name.rpartition("@")
    return (app_id, rest) if sep and app_id and rest else None


def deadline_entry(record: SnapshotRecord) -> str:
    return entry_path(DEADLINES, record.deadline_ms, ref(record.app_id, record.generation))


def retention_entry(due_ms: int, name: str) -> str:
    return entry_path(RETENTION, due_ms, name)
