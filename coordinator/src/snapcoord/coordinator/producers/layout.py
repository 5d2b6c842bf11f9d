"""Where producer offsets live.

Metadata (the commit point): ``/producers/records/<producer_id>`` holds a small versioned record
pointing at the payload; ``/producers/expiry/<minute>/<producer_id>@<registration>`` is the expiry
index, written in the same transaction as the record, so the janitor reads only the buckets that
are due. Blobs: ``producers/<uuid>.json`` holds the offsets (a key the intent pool picked and
announced before the put). Keys of the form ``producers/<producer_id>/<uuid>.json`` are payloads
written without a pooled intent, by releases before the pool; only the listing sweep looks for
them (``domain.producers.producer_of_object``).

Ordering. The payload is written before the record that references it and deleted after the
record is gone, so a reader never sees a record without its payload. Both ways an intent names
it meanwhile (made before the put, and by the transaction that unreferences it), so what a crash
or a failed delete leaves behind, the orphan sweep deletes once it is older than the grace.

Identity. A record's znode version alone cannot tell two registrations apart (delete and create
again restarts at version 0), so every conditional change also deletes or checks the index entry
named after the registration's UUID: a janitor that read an old registration can never delete
the new one that replaced it.
"""

from __future__ import annotations

from snapcoord.coordinator.domain.producers import ProducerRecord
from snapcoord.coordinator.kernel.expiry_index import entry_path

RECORDS = "/producers/records"
EXPIRY = "/producers/expiry"
OBJECT_PREFIX = "producers/"


def record_path(producer_id: str) -> str:
    return f"{RECORDS}/{producer_id}"


def index_path(record: ProducerRecord) -> str:
    """The record's entry in the expiry index."""
    return entry_path(EXPIRY, record.expires_at_ms, record.index_entry)
