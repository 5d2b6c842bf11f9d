"""The Prometheus exporter over HTTPS (--metrics-tls-cert / --metrics-tls-key)."""

from __future__ import annotations

import http.client
import ssl
import urllib.request

import pytest

from harness.access import Pki
from snapcoord.coordinator.metrics import new_registry, start_exporter


def test_the_exporter_serves_https_with_the_given_certificate(pki: Pki) -> None:
    exporter = start_exporter(
        new_registry(), "127.0.0.1", 0, certfile=str(pki.server.cert), keyfile=str(pki.server.key)
    )
    try:
        url = f"https://127.0.0.1:{exporter.port}/metrics"
        trusting = ssl.create_default_context(cafile=str(pki.ca.pem_path))
        with urllib.request.urlopen(url, context=trusting, timeout=30) as reply:
            assert reply.status == 200
            assert b"# TYPE" in reply.read()
        # Not the CA that signed it: refused.
        other = ssl.create_default_context(cafile=str(pki.other_ca.pem_path))
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(url, context=other, timeout=30)
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
