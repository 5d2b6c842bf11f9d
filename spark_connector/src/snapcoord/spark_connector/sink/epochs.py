"""Per-run epochs claimed from the coordinator, the fencing token of ``exactly_once``.

Each run of a query claims the next free number ``k`` by registering the producer record
``<query_name>.epoch.<k>`` (create-if-absent: exactly one caller gets ``registered`` True for a
number, so two drivers starting together never share an epoch). The search starts above ``floor``:
the highest epoch the sink has durably fenced (``FencedSink.max_epoch``), so numbers keep growing even
after old claim records expired (the coordinator keeps a record at most 7 days). A later claim is
a later run: the sink's fence makes every lower epoch's late writes invisible.
"""

from __future__ import annotations

import logging

from snapcoord.client import CoordinatorClient, NotFound, Offset

log = logging.getLogger(__name__)

#: How many taken numbers a claim skips before giving up (each is one RPC).
MAX_PROBES = 10_000


class Fenced(RuntimeError):
    """A later run of the same query (a higher epoch) owns the sink: this driver is a zombie."""


def epoch_producer_id(query_name: str, epoch: int) -> str:
    return f"{query_name}.epoch.{epoch}"


def claim_epoch(
    client: CoordinatorClient, query_name: str, *, floor: int, ttl_ms: int, query_id: str | None
) -> int:
    """Claim the lowest free epoch above ``floor`` and return it."""
    payload = [Offset("_eo:epoch", 0, 0)]
    if query_id is not None:
        payload.append(Offset(f"_eo:query:{query_id}", 0, 0))
    epoch = max(floor, 0) + 1
    for _ in range(MAX_PROBES):
        pid = epoch_producer_id(query_name, epoch)
        try:
            client.get_producer_offsets(pid)  # taken: skip it without a write
        except NotFound:
            claimed = client.register_producer_offsets(pid, payload, ttl_ms=ttl_ms)
            # registered False: another driver won this number between the get and the register, or a
            # lost reply hid our own success (then the stored payload is ours, but a duplicate claim of
            # one run is harmless only if we do not also use a second number: so just move on).
            if claimed.registered:
                log.info("%s: this run holds epoch %d", query_name, epoch)
                return epoch
        epoch += 1
    raise RuntimeError(f"{query_name}: no free epoch between {floor + 1} and {epoch - 1}")
