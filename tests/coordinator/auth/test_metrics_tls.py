"""The Prometheus exporter over HTTPS (--metrics-tls-cert / --metrics-tls-key)."""

from __future__ import annotations

import http.client
import ssl
import tempfile
import urllib.request
from pathlib import Path

import pytest

from harness.access import Pki
from snapcoord.coordinator.config.settings import MetricsConfig
from snapcoord.coordinator.observability.metrics import new_registry, start_exporter
from snapcoord.coordinator.server.shared_metrics import MULTIPROC_DIR_ENV, SharedMetrics


def fetch_https(port: int, pki: Pki) -> bytes:
    """``/metrics`` over HTTPS, trusting the CA that signed the server's certificate; a client
    trusting another CA is refused."""
    url = f"https://127.0.0.1:{port}/metrics"
    trusting = ssl.create_default_context(cafile=str(pki.ca.pem_path))
    with urllib.request.urlopen(url, context=trusting, timeout=30) as reply:
        assert reply.status == 200
        body: bytes = reply.read()
    other = ssl.create_default_context(cafile=str(pki.other_ca.pem_path))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(url, context=other, timeout=30)
    return body


def test_the_exporter_serves_https_with_the_given_certificate(pki: Pki) -> None:
    exporter = start_exporter(
        new_registry(), "127.0.0.1", 0, certfile=str(pki.server.cert), keyfile=str(pki.server.key)
    )
    try:
        assert b"# TYPE" in fetch_https(exporter.port, pki)
        # Plain HTTP to the HTTPS port gets no metrics.
        conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
        except (http.client.HTTPException, ConnectionError):
            body = b""
        finally:
            conn.close()
        assert b"# TYPE" not in body
    finally:
        exporter.stop()


def test_the_shared_exporter_of_several_processes_serves_https_too(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--processes N: the supervisor's endpoint takes the same --metrics-tls-cert/--metrics-tls-key."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(MULTIPROC_DIR_ENV, raising=False)
    config = MetricsConfig("127.0.0.1", 0, tls_cert=str(pki.server.cert), tls_key=str(pki.server.key))
    shared = SharedMetrics.start(config)
    try:
        body = fetch_https(shared.exporter.port, pki)
        assert b'process_resident_memory_bytes{process="supervisor"}' in body
    finally:
        shared.close()
