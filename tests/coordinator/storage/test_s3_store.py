"""S3-specific behaviour: configuration through boto3's chain, error translation, outages."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import boto3
import pytest

from harness.seaweed import SeaweedS3Server
from snapcoord.coordinator.errors import BlobNotFound, StoreUnavailable
from snapcoord.coordinator.storage.backends import BlobOptions
from snapcoord.coordinator.storage.s3 import S3BlobStore, resolve_addressing_style

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Few attempts, so that calls to a stopped server (refused at once) fail over quickly. The timeouts
#: stay generous: every call made with these options gets an answer (an error, or data after a
#: restart), and a short read timeout on a loaded machine would turn that answer into a timeout.
#: The hung-server test sets its own short timeouts.
FAST = BlobOptions(s3_connect_timeout_ms=10_000, s3_read_timeout_ms=30_000, s3_max_attempts=2)


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that accepts TCP connections and never answers (a hung server)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_from_uri_makes_no_network_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("from_uri must not build a client (credential lookup can hit the network)")

    monkeypatch.setattr(boto3.session.Session, "client", no_client)
    store = S3BlobStore.from_uri("s3://some-bucket/some/prefix")
    assert store.uri == "s3://some-bucket/some/prefix"
    store.close()


@pytest.mark.parametrize(
    "uri",
    ["s3://", "s3:///prefix", "s3://key:secret@bucket/p", "s3://bucket/a//b", "file:///x", "s3://b/../x"],
)
def test_malformed_uris_are_rejected(uri: str) -> None:
    with pytest.raises(ValueError):
        S3BlobStore.from_uri(uri)


def test_keys_live_under_the_uri_prefix(s3_server: SeaweedS3Server, s3_uri: str, s3_client: S3Client) -> None:
    raw = s3_client
    prefix = s3_uri.removeprefix(f"s3://{s3_server.bucket}/")
    store = S3BlobStore.from_uri(s3_uri)
    store.put("x/y.json", b"mine")
    assert raw.get_object(Bucket=s3_server.bucket, Key=f"{prefix}/x/y.json")["Body"].read() == b"mine"
    # A sibling prefix that merely starts with the same characters is someone else's.
    raw.put_object(Bucket=s3_server.bucket, Key=f"{prefix}-other/x/z.json", Body=b"theirs")
    try:
        assert [info.key for info in store.list()] == ["x/y.json"]
        with pytest.raises(BlobNotFound):
            store.get("x/z.json")
    finally:
        raw.delete_object(Bucket=s3_server.bucket, Key=f"{prefix}-other/x/z.json")
        store.close()


def test_bucket_without_prefix(s3_server: SeaweedS3Server) -> None:
    store = S3BlobStore.from_uri(f"s3://{s3_server.bucket}")
    key = f"t/no-prefix-{uuid.uuid4().hex}"
    try:
        store.put(key, b"top")
        assert store.get(key) == b"top"
        assert [info.key for info in store.list(key)] == [key]
    finally:
        store.delete(key)
        store.close()


def test_addressing_style_resolution() -> None:
    aws = "https://s3.eu-west-1.amazonaws.com"
    assert resolve_addressing_style("auto", aws) == "auto"
    assert resolve_addressing_style("auto", "https://s3.cn-north-1.amazonaws.com.cn") == "auto"
    assert resolve_addressing_style("auto", "http://127.0.0.1:8333") == "path"
    assert resolve_addressing_style("auto", "https://minio.internal.example") == "path"
    assert resolve_addressing_style("virtual", "http://127.0.0.1:8333") == "virtual"
    assert resolve_addressing_style("path", aws) == "path"


def test_addressing_style_follows_the_configured_endpoint(
    s3_server: SeaweedS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An S3-compatible endpoint from the environment: path style unless told otherwise.
    custom = S3BlobStore.from_uri("s3://bucket/p")
    assert custom.endpoint_url == s3_server.endpoint_url
    assert custom.addressing_style == "path"
    forced = S3BlobStore.from_uri("s3://bucket/p", BlobOptions(s3_addressing_style="virtual"))
    assert forced.addressing_style == "virtual"
    # No endpoint configured: AWS itself, where botocore chooses.
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    aws = S3BlobStore.from_uri("s3://bucket/p")
    assert "amazonaws.com" in aws.endpoint_url
    assert aws.addressing_style == "auto"
    for store in (custom, forced, aws):
        store.close()


def test_generic_endpoint_variable_is_honoured(
    s3_server: SeaweedS3Server, s3_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    store = S3BlobStore.from_uri(s3_uri)
    store.put("k", b"via AWS_ENDPOINT_URL")
    assert store.get("k") == b"via AWS_ENDPOINT_URL"
    store.close()


@pytest.mark.parametrize("variable", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"])
def test_wrong_credentials_give_an_actionable_error(
    s3_uri: str, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "wrong" + uuid.uuid4().hex)
    store = S3BlobStore.from_uri(s3_uri, FAST)
    calls = (lambda: store.put("k", b"x"), lambda: store.get("k"), lambda: list(store.list()), store.check)
    for call in calls:
        with pytest.raises(StoreUnavailable) as info:
            call()
        message = str(info.value)
        assert "credentials" in message and "AWS_ACCESS_KEY_ID" in message
        assert store.endpoint_url in message
        assert not isinstance(info.value, BlobNotFound)
    store.close()


def test_missing_credentials_give_an_actionable_error(s3_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = S3BlobStore.from_uri(s3_uri, FAST)
    with pytest.raises(StoreUnavailable, match="credentials"):
        store.get("k")
    store.close()


def test_missing_bucket_gives_an_actionable_error(s3_server: SeaweedS3Server) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    store = S3BlobStore.from_uri(f"s3://{bucket}/p", FAST)
    for call in (lambda: store.get("k"), lambda: list(store.list()), store.check):
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert f"bucket {bucket} does not exist" in str(info.value)
    store.close()


def test_hung_server_ends_in_store_unavailable(silent_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", silent_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    store = S3BlobStore.from_uri(
        "s3://bucket/p", BlobOptions(s3_connect_timeout_ms=500, s3_read_timeout_ms=500, s3_max_attempts=2)
    )
    with pytest.raises(StoreUnavailable) as info:
        store.get("k")
    assert silent_endpoint in str(info.value) and "bucket" in str(info.value)
    store.close()


def test_server_outage_then_recovery(
    private_s3_server: SeaweedS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", private_s3_server.endpoint_url)
    store = S3BlobStore.from_uri(private_s3_server.uri("outage"), FAST)
    store.put("before", b"kept")

    private_s3_server.stop()
    calls: list[Callable[[], object]] = [
        lambda: store.get("before"),
        lambda: store.put("during", b"x"),
        lambda: store.delete("before"),
        lambda: list(store.list()),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert private_s3_server.endpoint_url in str(info.value)
        assert private_s3_server.bucket in str(info.value)

    private_s3_server.start()
    assert store.get("before") == b"kept"
    store.put("after", b"new")
    assert [info.key for info in store.list()] == ["after", "before"]
    store.close()


def test_small_bodies_go_without_expect_continue_large_ones_with_it(s3_uri: str) -> None:
    """botocore asks for ``Expect: 100-continue`` on every put; a small body is sent at once (the
    wait costs a round trip), a large part still waits for the server's go-ahead."""
    from snapcoord.coordinator.storage.s3 import EXPECT_CONTINUE_MIN_BYTES

    store = S3BlobStore.from_uri(s3_uri)
    sent: list[tuple[int, str | None]] = []

    def observe(request: object, **_: object) -> None:  # runs after the store's own handler
        headers = request.headers  # type: ignore[attr-defined]
        expect = headers.get("Expect")
        sent.append(
            (int(headers.get("Content-Length", -1)), expect.decode() if isinstance(expect, bytes) else expect)
        )

    try:
        # Same event as the store's handler, last: botocore runs a more specific event's handlers
        # before a less specific one's, whatever their tier.
        store._s3().meta.events.register_last("before-send.s3", observe)
        small, large = b"x" * 1024, b"y" * EXPECT_CONTINUE_MIN_BYTES
        store.put("small", small)
        store.put("large", large)
        assert sent == [(len(small), None), (len(large), "100-continue")]
        # Both arrive whole.
        assert store.get("small") == small and store.get("large") == large
    finally:
        store.close()
