"""The CPUs behind ``--processes auto``: the cgroup quota read from the files' texts (v2, v1, no
limit, garbage), capped affinity, and the reader on this machine."""

from __future__ import annotations

import os

import pytest

from snapcoord.coordinator.server.cpus import UsableCpus, cgroup_cpu_limit, usable_cpus


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", None),  # v2 without a limit
        ("150000 100000\n", 2),  # 1.5 CPUs -> 2
        ("200000 100000\n", 2),
        ("100000 100000", 1),
        ("50000 100000\n", 1),  # half a CPU still runs one process
        ("1 100000\n", 1),
        ("400000 50000\n", 8),  # another period
        ("  300000   100000  \n", 3),
    ],
)
def test_cgroup_v2_cpu_max(cpu_max: str, expected: int | None) -> None:
    assert cgroup_cpu_limit(cpu_max, None, None) == expected


@pytest.mark.parametrize(
    ("quota", "period", "expected"),
    [
        ("-1\n", "100000\n", None),  # v1 without a limit
        ("150000\n", "100000\n", 2),
        ("100000\n", "100000\n", 1),
        ("250000\n", "100000\n", 3),
        ("100000\n", None, None),  # period unreadable: no limit, not a guessed period
        (None, "100000\n", None),
    ],
)
def test_cgroup_v1_cfs_quota(quota: str | None, period: str | None, expected: int | None) -> None:
    assert cgroup_cpu_limit(None, quota, period) == expected


@pytest.mark.parametrize(
    "cpu_max",
    [
        "",
        "\n",
        "max",
        "150000",  # no period
        "150000 100000 7",
        "1.5 1",
        "0 100000",
        "150000 0",
        "-150000 100000",
        "abc 100000",
        "\u0661\u0665 1",  # Arabic-Indic digits: str.isdigit would take them, the kernel never writes them
        "\x00\x00",
    ],
)
def test_garbage_cpu_max_sets_no_limit(cpu_max: str) -> None:
    assert cgroup_cpu_limit(cpu_max, None, None) is None


@pytest.mark.parametrize(("quota", "period"), [("", ""), ("x", "100000"), ("100000", "0"), ("0", "100000")])
def test_garbage_cfs_files_set_no_limit(quota: str, period: str) -> None:
    assert cgroup_cpu_limit(None, quota, period) is None


def test_missing_files_set_no_limit() -> None:
    assert cgroup_cpu_limit(None, None, None) is None


def test_the_smaller_of_v1_and_v2_holds() -> None:
    assert cgroup_cpu_limit("300000 100000", "100000", "100000") == 1
    assert cgroup_cpu_limit("100000 100000", "300000", "100000") == 1
    assert cgroup_cpu_limit("max 100000", "300000", "100000") == 3  # v2 unlimited, v1 limited
    assert cgroup_cpu_limit("garbage", "200000", "100000") == 2


@pytest.mark.parametrize(
    ("affinity", "quota", "count"),
    [(8, None, 8), (8, 2, 2), (2, 8, 2), (1, None, 1), (4, 4, 4), (0, None, 1), (3, 0, 1)],
)
def test_the_count_is_affinity_capped_by_the_quota_and_at_least_one(
    affinity: int, quota: int | None, count: int
) -> None:
    assert UsableCpus(affinity=affinity, quota=quota).count == count


def test_the_log_text_says_where_the_count_comes_from() -> None:
    assert str(UsableCpus(affinity=8, quota=2)) == "2 (CPU affinity 8, cgroup CPU quota 2)"
    assert str(UsableCpus(affinity=4, quota=None)) == "4 (CPU affinity 4, no cgroup CPU quota)"


def test_usable_cpus_reads_this_machine() -> None:
    """The reader on the real files: never more than affinity, and the quota it found is the one
    the pure function gives for the same files."""
    found = usable_cpus()
    assert found.affinity == len(os.sched_getaffinity(0))
    assert 1 <= found.count <= found.affinity

    def text(path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    assert found.quota == cgroup_cpu_limit(
        text("/sys/fs/cgroup/cpu.max"),
        text("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        text("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    )
