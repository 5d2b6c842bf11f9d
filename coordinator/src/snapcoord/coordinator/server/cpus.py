"""How many CPUs this process may use: the count behind ``--processes auto``.

In a container the count that matters is the CPU limit, not the host's cores: Kubernetes and
Docker enforce a limit as a cgroup CPU bandwidth quota, which neither ``os.cpu_count()`` nor
affinity (``os.sched_getaffinity``, Python 3.13's ``os.process_cpu_count``) sees, nor psutil.
loky's ``cpu_count()`` does read the quota, but it would bring a process-pool library (and
cloudpickle) into the server for one function, also obeys its own ``LOKY_MAX_CPU_COUNT``, and
fails on a ``cpu.max`` it cannot parse; hence the few lines here, the parsing pure
(``cgroup_cpu_limit`` takes the files' texts) and the reading thin (``usable_cpus``).
Only the cgroup the process sees at ``/sys/fs/cgroup`` is read (a container's own, in its cgroup
namespace); a quota set only on an ancestor cgroup is not seen.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: cgroup v2: one line ``$QUOTA $PERIOD`` (microseconds), ``max`` for no quota.
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
#: cgroup v1: the quota (-1 for none) and the period (microseconds), one file each.
CFS_QUOTA_US = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CFS_PERIOD_US = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def cgroup_cpu_limit(cpu_max: str | None, cfs_quota_us: str | None, cfs_period_us: str | None) -> int | None:
    """The CPUs a cgroup CPU quota allows, rounded up (1.5 CPUs -> 2), or None for no limit.

    Takes the texts of ``cpu.max`` (v2) and ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1),
    None for a file that is missing or unreadable. A text that is not a positive quota over a
    positive period (``max``, -1, garbage) sets no limit: a guess from a file we do not understand
    must not starve the server. When both versions set one, the smaller holds.
    """
    limits: list[int] = []
    if cpu_max is not None:
        fields = cpu_max.split()
        if len(fields) == 2 and (limit := _cpus(fields[0], fields[1])) is not None:
            limits.append(limit)
    if (
        cfs_quota_us is not None
        and cfs_period_us is not None
        and (limit := _cpus(cfs_quota_us.strip(), cfs_period_us.strip())) is not None
    ):
        limits.append(limit)
    return min(limits, default=None)


_COUNT_RE = re.compile(r"[0-9]+")


def _cpus(quota: str, period: str) -> int | None:
    if not (_COUNT_RE.fullmatch(quota) and _COUNT_RE.fullmatch(period)):  # "max", "-1", garbage
        return None
    q, p = int(quota), int(period)
    if q <= 0 or p <= 0:
        return None
    return -(-q // p)  # ceil(q / p) without floats


@dataclass(frozen=True)
class UsableCpus:
    """The CPUs this process may use, with where the number comes from (for the log)."""

    #: CPUs the scheduler may run this process on.
    affinity: int
    #: ``cgroup_cpu_limit``: None when no quota applies.
    quota: int | None

    @property
    def count(self) -> int:
        """Affinity capped by the quota; at least 1."""
        return max(1, self.affinity if self.quota is None else min(self.affinity, self.quota))

    def __str__(self) -> str:
        quota = "no cgroup CPU quota" if self.quota is None else f"cgroup CPU quota {self.quota}"
        return f"{self.count} (CPU affinity {self.affinity}, {quota})"


def usable_cpus() -> UsableCpus:
    """Read this process's affinity and its cgroup's CPU quota."""
    quota = cgroup_cpu_limit(_read(CPU_MAX), _read(CFS_QUOTA_US), _read(CFS_PERIOD_US))
    return UsableCpus(affinity=len(os.sched_getaffinity(0)), quota=quota)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):  # missing, unreadable, not a cgroup file system
        return None
