"""Helpers for race tests: start many callers at the same instant."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_threads(n: int, target: Callable[[int], None]) -> None:
    """Run ``target(i)`` in ``n`` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
