"""Retries and deadlines over a real network path: a TcpProxy in front of the coordinator is cut and
restored, and a socket that never answers stands in for a hung server."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from harness.coordinator import InProcessCoordinator
from harness.faults import TcpProxy
from snapcoord.client import CoordinatorClient, DeadlineExceeded, Offset, Unavailable


@pytest.fixture
def proxy(coordinator: InProcessCoordinator) -> Iterator[TcpProxy]:
    p = TcpProxy("127.0.0.1", coordinator.port)
    yield p
    p.close()


@pytest.fixture
def proxied(proxy: TcpProxy) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(proxy.address, timeout_s=30) as c:
        yield c


class _FirstRetry(logging.Handler):
    """Sets ``seen`` when the client logs its first UNAVAILABLE retry of ``method``."""

    def __init__(self, method: str) -> None:
        super().__init__(logging.DEBUG)
        self.prefix = f"{method}: UNAVAILABLE"
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.seen.set()


def restore_after_first_retry(proxy: TcpProxy, method: str) -> threading.Thread:
    """Restore the path once the client was refused and is retrying ``method``: on a condition, not
    after a delay that a loaded machine may outlast before the call even starts."""
    handler = _FirstRetry(method)
    logger = logging.getLogger("snapcoord.client")
    logger.addHandler(handler)

    def restore() -> None:
        try:
            handler.seen.wait(60)
        finally:
            logger.removeHandler(handler)
            proxy.restore()

    thread = threading.Thread(target=restore, daemon=True)
    thread.start()
    return thread


def test_idempotent_calls_retry_until_the_coordinator_is_back(
    proxied: CoordinatorClient, proxy: TcpProxy, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="snapcoord.client")
    assert proxied.get_current_snapshot(uid).generation == 0  # connected through the proxy
    proxy.cut()
    restorer = restore_after_first_retry(proxy, "CreateSnapshot")
    created = proxied.create_snapshot(uid, ["t"])  # starts while the path is cut
    restorer.join()
    assert created.generation == 1
    retries = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("CreateSnapshot: UNAVAILABLE")
    ]
    assert retries, "the call succeeded without ever being refused: the test did not test anything"
    # Retrying CreateSnapshot returned the one snapshot it created, nothing more.
    assert proxied.get_current_snapshot(uid, consistent=True) == created


def test_report_progress_is_retried_and_answers_what_it_finished(
    proxied: CoordinatorClient, proxy: TcpProxy, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="snapcoord.client")
    proxied.mark_backlog(uid, [Offset("in", 0, 10), Offset("in", 1, 10)])
    proxy.cut()
    restorer = restore_after_first_retry(proxy, "ReportProgress")
    result = proxied.report_progress(uid, [Offset("in", 0, 10)])  # starts while the path is cut
    restorer.join()
    assert [r for r in caplog.records if r.getMessage().startswith("ReportProgress: UNAVAILABLE")]
    assert result.newly_finished == (Offset("in", 0, 10),)
    # A report sent again by the caller with its report_id (a reply lost for good, a deadline)
    # answers the same; another report finishes nothing more.
    done = proxied.report_progress(uid, [Offset("in", 1, 12)], report_id="run-1.batch-7")
    assert done.newly_finished == (Offset("in", 1, 12),)
    again = proxied.report_progress(uid, [Offset("in", 1, 12)], report_id="run-1.batch-7")
    assert again.newly_finished == (Offset("in", 1, 12),) and not again.status.processing_backlog
    assert proxied.report_progress(uid, [Offset("in", 1, 12)]).newly_finished == ()


def test_retries_stop_at_the_deadline(proxied: CoordinatorClient, proxy: TcpProxy, uid: str) -> None:
    proxied.get_current_snapshot(uid)
    proxy.cut()
    started = time.monotonic()
    with pytest.raises(Unavailable) as e:
        proxied.get_current_snapshot(uid, timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert e.value.attempts > 1  # it did retry
    assert elapsed < 15  # and gave up around its 1.5 s deadline (generous bound for a loaded machine)


@pytest.fixture
def hung_target() -> Iterator[str]:
    """A port that accepts TCP connections (the kernel's backlog) but never speaks HTTP/2."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("rpc", ["get_lease", "report_progress"])
def test_every_call_has_a_deadline(hung_target: str, rpc: str) -> None:
    with CoordinatorClient(hung_target, timeout_s=1.0) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as e:
            if rpc == "get_lease":
                client.get_lease("lease")
            else:
                client.report_progress("job", [Offset("in", 0, 1)])
        elapsed = time.monotonic() - started
    assert e.value.code == "DEADLINE_EXCEEDED"
    assert elapsed < 15  # ended at its 1 s deadline, not whenever the server might answer
