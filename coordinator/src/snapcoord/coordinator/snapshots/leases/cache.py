"""This process's copy of the lease records it last wrote, so that a renew needs no read first.

A lease holder renews again and again through the same connection (so, with ``--processes N``,
the same process). After a commit that wrote a lease record, its data and new version are known
without a read: ``Create`` gives version 0, ``SetData`` at v gives v + 1. The next call on that
lease hands the copy to the commit kernel as ``assume`` (a guess the transaction verifies), so a
RenewLease is one ZooKeeper transaction (it writes the record only, whatever the lease holds:
the pin indexes keep the expiry each snapshot was pinned with, see ``snapshots.pins``).

Why a stale copy is harmless: every rewrite of a record is version-checked and checks the
record's incarnation child (``decide.record_ops``). If anyone else wrote the record since (another
process, the janitor), or dropped it and acquired it again (versions restart at 0, the incarnation
does not come back), the transaction fails and the kernel reads and decides again. Only a copy
that is exactly the stored record commits. A copy never answers a refusal on its own: the
registry uses it only where ``decide`` refuses nothing on it (see ``LeaseRegistry._assumed``).

Pin indexes are not cached: one is shared by every lease holding its snapshot, and it is deleted
when empty and created again, so its version alone could match another life of it. They are read
(together, in one round) by the calls that change them: an acquire of new snapshots, a release, a
drop and the janitor's expiry.
"""

from __future__ import annotations

from snapcoord.coordinator.kernel.record_copies import RecordCache, written

__all__ = ["RecordCache", "written"]
