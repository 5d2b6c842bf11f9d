"""The one LRU behind the coordinator's in-memory copies: eviction by weight, least recently used
first, the newest entry kept however heavy, replacement and conditional removal."""

from __future__ import annotations

from snapcoord.coordinator.domain.lru import Lru


def test_least_recently_used_goes_first_once_over_the_bound() -> None:
    lru: Lru[str, int] = Lru(3)
    for key, value in (("a", 1), ("b", 2), ("c", 3)):
        lru.put(key, value)
    assert lru.get("a") == 1  # now the most recently used
    lru.put("d", 4)
    assert lru.get("b") is None and [lru.get(k) for k in "acd"] == [1, 3, 4]
    assert len(lru) == 3


def test_weights_bound_the_total_and_the_newest_entry_stays() -> None:
    lru: Lru[str, str] = Lru(10)
    lru.put("small", "s", 4)
    lru.put("medium", "m", 5)
    lru.put("large", "l", 6)  # 15 > 10: "small", then "medium" go
    assert (lru.get("small"), lru.get("medium"), lru.get("large")) == (None, None, "l")
    lru.put("huge", "h", 50)  # heavier than the bound alone: kept, the rest dropped
    assert (lru.get("large"), lru.get("huge"), len(lru)) == (None, "h", 1)


def test_a_replacement_counts_its_new_weight_only() -> None:
    lru: Lru[str, str] = Lru(10)
    lru.put("a", "a1", 6)
    lru.put("a", "a2", 2)  # 2, not 8, in the total
    lru.put("b", "b", 8)
    assert (lru.get("a"), lru.get("b")) == ("a2", "b")


def test_pop_only_if_the_value_matches() -> None:
    lru: Lru[str, int] = Lru(10)
    lru.put("job", 1)
    assert lru.pop("job", only_if=lambda v: v == 2) is None and lru.get("job") == 1
    assert lru.pop("job", only_if=lambda v: v == 1) == 1 and lru.get("job") is None
    assert lru.pop("absent") is None
    lru.put("x", 9, 10)  # the weight of what was popped no longer counts
    assert lru.get("x") == 9
