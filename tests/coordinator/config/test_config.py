"""Config: the flag/env contract, precedence flag > env > default, validation, redaction, and the
one table: every option fills its fields, every field (policies included) is filled by one option."""

from __future__ import annotations

import argparse
import json
from dataclasses import MISSING, fields
from pathlib import Path

import grpc
import pytest

from harness.coordinator import embedded_deps, serve_in_process
from snapcoord.coordinator.config import options, settings
from snapcoord.coordinator.config.options import OPTIONS, parse_duration_ms
from snapcoord.coordinator.config.settings import FIXED, ConfigError, load, redact_uri, sections
from snapcoord.coordinator.domain.backlog import BacklogPolicy
from snapcoord.coordinator.domain.claims import CommitClaimPolicy
from snapcoord.coordinator.domain.leases import LeasePolicy
from snapcoord.coordinator.domain.producers import ProducerPolicy
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.storage.zookeeper.request_size import MAX_CHROOT_BYTES
from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    common_pb2,
    lease_pb2,
    lease_pb2_grpc,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

# The contract that docker-compose files, the README and operators' scripts rely on.
CONTRACT = {
    "--host": ("SNAPCOORD_HOST", "0.0.0.0"),
    "--port": ("SNAPCOORD_PORT", "50051"),
    "--metrics-host": ("SNAPCOORD_METRICS_HOST", "same as --host"),
    "--metrics-port": ("SNAPCOORD_METRICS_PORT", "9464"),
    "--health-host": ("SNAPCOORD_HEALTH_HOST", "same as --host"),
    "--health-port": ("SNAPCOORD_HEALTH_PORT", "-1"),
    "--keepalive-min-ping-interval": ("SNAPCOORD_KEEPALIVE_MIN_PING_INTERVAL", "30s"),
    "--keepalive-max-ping-strikes": ("SNAPCOORD_KEEPALIVE_MAX_PING_STRIKES", "2"),
    "--data-dir": ("SNAPCOORD_DATA_DIR", "./snapcoord-data"),
    "--metadata": ("SNAPCOORD_METADATA", "file://<data-dir>/metadata"),
    "--blobs": ("SNAPCOORD_BLOBS", "file://<data-dir>/blobs"),
    "--max-workers": ("SNAPCOORD_MAX_WORKERS", "32"),
    "--processes": ("SNAPCOORD_PROCESSES", "1"),
    "--max-concurrent-rpcs": ("SNAPCOORD_MAX_CONCURRENT_RPCS", "256"),
    "--shutdown-grace": ("SNAPCOORD_SHUTDOWN_GRACE", "10s"),
    "--payload-budget": ("SNAPCOORD_PAYLOAD_BUDGET", "1GiB"),
    "--payload-budget-wait": ("SNAPCOORD_PAYLOAD_BUDGET_WAIT", "10s"),
    "--zk-session-timeout": ("SNAPCOORD_ZK_SESSION_TIMEOUT", "10s"),
    "--zk-connect-timeout": ("SNAPCOORD_ZK_CONNECT_TIMEOUT", "15s"),
    "--zk-max-request-bytes": ("SNAPCOORD_ZK_MAX_REQUEST_BYTES", "1048575"),
    "--blob-probe-interval": ("SNAPCOORD_BLOB_PROBE_INTERVAL", "5s"),
    "--s3-addressing-style": ("SNAPCOORD_S3_ADDRESSING_STYLE", "auto"),
    "--producer-default-ttl": ("SNAPCOORD_PRODUCER_DEFAULT_TTL", "24h"),
    "--producer-max-ttl": ("SNAPCOORD_PRODUCER_MAX_TTL", "7d"),
    "--producer-max-offsets": ("SNAPCOORD_PRODUCER_MAX_OFFSETS", "100000"),
    "--producer-inline-max-bytes": ("SNAPCOORD_PRODUCER_INLINE_MAX_BYTES", "1024"),
    "--cleanup-interval": ("SNAPCOORD_CLEANUP_INTERVAL", "60s"),
    "--orphan-grace": ("SNAPCOORD_ORPHAN_GRACE", "1h"),
    "--orphan-sweep-interval": ("SNAPCOORD_ORPHAN_SWEEP_INTERVAL", "15m"),
    "--orphan-listing-interval": ("SNAPCOORD_ORPHAN_LISTING_INTERVAL", "0s"),
    "--cleanup-batch": ("SNAPCOORD_CLEANUP_BATCH", "1000"),
    "--snapshot-default-timeout": ("SNAPCOORD_SNAPSHOT_DEFAULT_TIMEOUT", "10m"),
    "--snapshot-max-timeout": ("SNAPCOORD_SNAPSHOT_MAX_TIMEOUT", "7d"),
    "--snapshot-max-tasks": ("SNAPCOORD_SNAPSHOT_MAX_TASKS", "5000"),
    "--max-inline-payload": ("SNAPCOORD_MAX_INLINE_PAYLOAD", "4MiB"),
    "--snapshot-inline-checkpoint-max-bytes": ("SNAPCOORD_SNAPSHOT_INLINE_CHECKPOINT_MAX_BYTES", "4096"),
    "--snapshot-max-inline-read": ("SNAPCOORD_SNAPSHOT_MAX_INLINE_READ", "64MiB"),
    "--snapshot-max-upload-size": ("SNAPCOORD_SNAPSHOT_MAX_UPLOAD_SIZE", "8GiB"),
    "--snapshot-max-checkpoints": ("SNAPCOORD_SNAPSHOT_MAX_CHECKPOINTS", "64"),
    "--retention-keep-last-completed": ("SNAPCOORD_RETENTION_KEEP_LAST_COMPLETED", "3"),
    "--retention-completed-ttl": ("SNAPCOORD_RETENTION_COMPLETED_TTL", "7d"),
    "--backlog-max-partitions": ("SNAPCOORD_BACKLOG_MAX_PARTITIONS", "10000"),
    "--commit-claim-retention": ("SNAPCOORD_COMMIT_CLAIM_RETENTION", "7d"),
    "--lease-min-duration": ("SNAPCOORD_LEASE_MIN_DURATION", "1s"),
    "--lease-max-duration": ("SNAPCOORD_LEASE_MAX_DURATION", "7d"),
    "--lease-max-snapshots": ("SNAPCOORD_LEASE_MAX_SNAPSHOTS", "256"),
    "--lease-max-holders": ("SNAPCOORD_LEASE_MAX_HOLDERS", "4"),
    "--max-clock-skew": ("SNAPCOORD_MAX_CLOCK_SKEW", "5s"),
    "--log-level": ("SNAPCOORD_LOG_LEVEL", "INFO"),
    "--log-format": ("SNAPCOORD_LOG_FORMAT", "auto"),
    "--otel-exporter": ("SNAPCOORD_OTEL_EXPORTER", "none"),
    "--metrics-tls-cert": ("SNAPCOORD_METRICS_TLS_CERT", "none: plain HTTP"),
    "--metrics-tls-key": ("SNAPCOORD_METRICS_TLS_KEY", "none"),
    "--tls-cert": ("SNAPCOORD_TLS_CERT", "none: plaintext"),
    "--tls-key": ("SNAPCOORD_TLS_KEY", "none"),
    "--tls-client-ca": ("SNAPCOORD_TLS_CLIENT_CA", "none: no client certificates"),
    "--auth-file": ("SNAPCOORD_AUTH_FILE", "none: every caller is accepted"),
    "--zk-auth-file": ("SNAPCOORD_ZK_AUTH_FILE", "none: open ACLs"),
    "--zk-tls-ca": ("SNAPCOORD_ZK_TLS_CA", "none: plaintext"),
    "--zk-tls-cert": ("SNAPCOORD_ZK_TLS_CERT", "none"),
    "--zk-tls-key": ("SNAPCOORD_ZK_TLS_KEY", "none"),
    "--s3-sse": ("SNAPCOORD_S3_SSE", "none: the bucket's default"),
    "--s3-sse-kms-key-id": ("SNAPCOORD_S3_SSE_KMS_KEY_ID", "none: the account's default KMS key"),
}

# option name -> (a valid raw value, another valid raw value, where it lands, expected for the first)
SAMPLES: dict[str, tuple[str, str, tuple[str, str], object]] = {
    "host": ("127.0.0.1", "10.0.0.1", ("grpc", "host"), "127.0.0.1"),
    "port": ("6000", "7000", ("grpc", "port"), 6000),
    "metrics_host": ("127.0.0.2", "10.0.0.2", ("metrics", "host"), "127.0.0.2"),
    "metrics_port": ("-1", "9000", ("metrics", "port"), -1),
    "health_host": ("127.0.0.3", "10.0.0.3", ("grpc", "health_host"), "127.0.0.3"),
    "health_port": ("8081", "0", ("grpc", "health_port"), 8081),
    "keepalive_min_ping_interval": ("10s", "0s", ("grpc", "keepalive_min_ping_interval_ms"), 10_000),
    "keepalive_max_ping_strikes": ("0", "5", ("grpc", "keepalive_max_ping_strikes"), 0),
    "data_dir": ("/srv/a", "/srv/b", ("storage", "data_dir"), "/srv/a"),
    "metadata": (
        "zk://zk1:2181,zk2:2181/sc",
        "file:///x",
        ("storage", "metadata_uri"),
        "zk://zk1:2181,zk2:2181/sc",
    ),
    "blobs": ("s3://bucket/prefix", "file:///y", ("storage", "blobs_uri"), "s3://bucket/prefix"),
    "max_workers": ("4", "8", ("grpc", "max_workers"), 4),
    "max_concurrent_rpcs": ("16", "32", ("grpc", "max_concurrent_rpcs"), 16),
    "processes": ("4", "2", ("grpc", "processes"), 4),
    "shutdown_grace": ("500ms", "1m", ("grpc", "shutdown_grace_ms"), 500),
    "payload_budget": ("256MiB", "2GiB", ("grpc", "payload_budget_bytes"), 256 * 1024 * 1024),
    "payload_budget_wait": ("0s", "1m", ("grpc", "payload_budget_wait_ms"), 0),
    "zk_session_timeout": ("5s", "6s", ("storage", "zk_session_timeout_ms"), 5000),
    "zk_connect_timeout": ("2m", "3m", ("storage", "zk_connect_timeout_ms"), 120_000),
    "zk_max_request_bytes": ("4194304", "2097152", ("storage", "zk_max_request_bytes"), 4_194_304),
    "blob_probe_interval": ("500ms", "30s", ("storage", "blob_probe_interval_ms"), 500),
    "s3_addressing_style": ("path", "virtual", ("storage", "s3_addressing_style"), "path"),
    "producer_default_ttl": ("1h", "2h", ("producers", "default_ttl_ms"), 3_600_000),
    "producer_max_ttl": ("30d", "14d", ("producers", "max_ttl_ms"), 30 * 86_400_000),
    "producer_max_offsets": ("10", "20", ("producers", "max_offsets"), 10),
    "producer_inline_max_bytes": ("0", "4096", ("producers", "inline_max_bytes"), 0),
    "snapshot_inline_checkpoint_max_bytes": ("0", "100", ("snapshots", "inline_checkpoint_max_bytes"), 0),
    "cleanup_interval": ("0s", "5m", ("janitor", "cleanup_interval_ms"), 0),
    "orphan_grace": ("2h", "3h", ("janitor", "orphan_grace_ms"), 7_200_000),
    "orphan_sweep_interval": ("1m", "2m", ("janitor", "orphan_sweep_interval_ms"), 60_000),
    "orphan_listing_interval": ("1d", "2d", ("janitor", "orphan_listing_interval_ms"), 86_400_000),
    "cleanup_batch": ("50", "60", ("janitor", "batch"), 50),
    "snapshot_default_timeout": ("1m", "2m", ("snapshots", "default_timeout_ms"), 60_000),
    "snapshot_max_timeout": ("1d", "2d", ("snapshots", "max_timeout_ms"), 86_400_000),
    "snapshot_max_tasks": ("10", "20", ("snapshots", "max_tasks"), 10),
    "max_inline_payload": ("512KiB", "1GiB", ("snapshots", "max_report_bytes"), 512 * 1024),
    "snapshot_max_inline_read": ("1MiB", "2MiB", ("snapshots", "max_inline_read_bytes"), 1024 * 1024),
    "snapshot_max_upload_size": ("1MiB", "2MiB", ("snapshots", "max_upload_bytes"), 1024 * 1024),
    "snapshot_max_checkpoints": ("8", "9", ("snapshots", "max_checkpoints_per_report"), 8),
    "retention_keep_last_completed": ("7", "8", ("snapshots", "default_keep_last_completed"), 7),
    "retention_completed_ttl": (
        "30d",
        "31d",
        ("snapshots", "default_completed_ttl_ms"),
        30 * 86_400_000,
    ),
    "backlog_max_partitions": ("100000", "20000", ("backlog", "max_partitions"), 100_000),
    "commit_claim_retention": ("30d", "2h", ("claims", "retention_ms"), 30 * 86_400_000),
    "lease_min_duration": ("500ms", "2s", ("leases", "min_duration_ms"), 500),
    "lease_max_duration": ("1d", "2d", ("leases", "max_duration_ms"), 86_400_000),
    "lease_max_snapshots": ("50", "60", ("leases", "max_snapshots"), 50),
    "lease_max_holders": ("2", "3", ("leases", "max_holders"), 2),
    "max_clock_skew": ("0s", "10s", ("leases", "max_clock_skew_ms"), 0),
    "log_level": ("debug", "ERROR", ("logging", "level"), "DEBUG"),
    "log_format": ("json", "text", ("logging", "format"), "json"),
    "otel_exporter": ("console", "otlp", ("tracing", "exporter"), "console"),
    # The file options pair up (cert needs key...): samples come in pairs in the tests that use two.
    "metrics_tls_cert": ("/etc/m.pem", "/etc/m2.pem", ("metrics", "tls_cert"), "/etc/m.pem"),
    "metrics_tls_key": ("/etc/m.key", "/etc/m2.key", ("metrics", "tls_key"), "/etc/m.key"),
    "tls_cert": ("/etc/s.pem", "/etc/s2.pem", ("security", "tls_cert"), "/etc/s.pem"),
    "tls_key": ("/etc/s.key", "/etc/s2.key", ("security", "tls_key"), "/etc/s.key"),
    "tls_client_ca": ("/etc/ca.pem", "/etc/ca2.pem", ("security", "tls_client_ca"), "/etc/ca.pem"),
    "auth_file": ("/etc/auth.yaml", "/etc/auth.json", ("security", "auth_file"), "/etc/auth.yaml"),
    "zk_auth_file": ("/etc/zk", "/etc/zk2", ("storage", "zk_auth_file"), "/etc/zk"),
    "zk_tls_ca": ("/etc/zkca.pem", "/etc/zkca2.pem", ("storage", "zk_tls_ca"), "/etc/zkca.pem"),
    "zk_tls_cert": ("/etc/zk.pem", "/etc/zk2.pem", ("storage", "zk_tls_cert"), "/etc/zk.pem"),
    "zk_tls_key": ("/etc/zk.key", "/etc/zk2.key", ("storage", "zk_tls_key"), "/etc/zk.key"),
    "s3_sse": ("AES256", "aws:kms", ("storage", "s3_sse"), "AES256"),
    "s3_sse_kms_key_id": ("key-1", "key-2", ("storage", "s3_sse_kms_key_id"), "key-1"),
}

# option name -> an invalid raw value
BAD: dict[str, str] = {
    "host": "two words",
    "port": "65536",
    "metrics_host": "",  # empty flag value (an empty env var means unset instead)
    "metrics_port": "-2",
    "health_host": "",
    "health_port": "-2",
    "keepalive_min_ping_interval": "30",
    "keepalive_max_ping_strikes": "-1",
    "data_dir": " ",
    "metadata": "s3://bucket",
    "blobs": "zk://h:2181/x",
    "max_workers": "0",
    "max_concurrent_rpcs": "many",
    "processes": "0",
    "shutdown_grace": "10",
    "payload_budget": "1KiB",
    "payload_budget_wait": "10",
    "zk_session_timeout": "0s",
    "zk_connect_timeout": "1.5s",
    "zk_max_request_bytes": "1MiB",
    "blob_probe_interval": "0s",
    "s3_addressing_style": "Path",
    "producer_default_ttl": "0s",
    "producer_max_ttl": "forever",
    "producer_max_offsets": "0",
    "producer_inline_max_bytes": "65537",
    "snapshot_inline_checkpoint_max_bytes": "-1",
    "cleanup_interval": "-1s",
    "orphan_grace": "0s",
    "orphan_sweep_interval": "0s",
    "orphan_listing_interval": "-1s",
    "cleanup_batch": "0",
    "snapshot_default_timeout": "10",
    "snapshot_max_timeout": "0s",
    "snapshot_max_tasks": "0",
    "max_inline_payload": "64MB",
    "snapshot_max_inline_read": "big",
    "snapshot_max_upload_size": "8GB",
    "snapshot_max_checkpoints": "0",
    "retention_keep_last_completed": "0",
    "retention_completed_ttl": "never",
    "backlog_max_partitions": "100001",
    "commit_claim_retention": "59m",
    "lease_min_duration": "0s",
    "lease_max_duration": "1",
    "lease_max_snapshots": "0",
    "lease_max_holders": "0",
    "max_clock_skew": "-1s",
    "log_level": "verbose",
    "log_format": "JSON",
    "otel_exporter": "jaeger",
    "metrics_tls_cert": " /x",
    "metrics_tls_key": " /x",
    "tls_cert": " /x",
    "tls_key": " /x",
    "tls_client_ca": " /x",
    "auth_file": " /x",
    "zk_auth_file": " /x",
    "zk_tls_ca": " /x",
    "zk_tls_cert": " /x",
    "zk_tls_key": " /x",
    "s3_sse": "aes256",
    "s3_sse_kms_key_id": "two words",
}

#: Options that only work with another one: the partner values each sample is loaded with.
PARTNERS: dict[str, dict[str, str]] = {
    "tls_cert": {"tls_key": "/etc/p.key"},
    "tls_key": {"tls_cert": "/etc/p.pem"},
    "tls_client_ca": {"tls_cert": "/etc/p.pem", "tls_key": "/etc/p.key"},
    "metrics_tls_cert": {"metrics_tls_key": "/etc/p.key"},
    "metrics_tls_key": {"metrics_tls_cert": "/etc/p.pem"},
    "s3_sse_kms_key_id": {"s3_sse": "aws:kms"},
    "zk_tls_cert": {"zk_tls_key": "/etc/p.key"},
    "zk_tls_key": {"zk_tls_cert": "/etc/p.pem"},
}

#: Options whose sample values need another option's value: more than one process needs ZooKeeper.
NEEDS: dict[str, dict[str, str]] = {"processes": {"metadata": "zk://zk1:2181/sc"}}


def _get(cfg: settings.Config, where: tuple[str, str]) -> object:
    return getattr(getattr(cfg, where[0]), where[1])


def test_options_match_the_contract() -> None:
    assert {o.flag: (o.env, o.shown_default) for o in OPTIONS} == CONTRACT


def test_every_option_has_samples() -> None:
    names = {o.name for o in OPTIONS}
    assert set(SAMPLES) == names
    assert set(BAD) == names


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load({}, {})
    data_dir = tmp_path / "snapcoord-data"
    assert cfg.grpc == settings.GrpcConfig(
        host="0.0.0.0",
        port=50051,
        max_workers=32,
        max_concurrent_rpcs=256,
        shutdown_grace_ms=10_000,
        payload_budget_bytes=1024**3,
        payload_budget_wait_ms=10_000,
    )
    assert cfg.metrics == settings.MetricsConfig(host="0.0.0.0", port=9464, tls_cert="", tls_key="")
    assert cfg.security == settings.SecurityConfig(tls_cert="", tls_key="", tls_client_ca="", auth_file="")
    assert not cfg.security.tls and not cfg.security.authenticates
    assert cfg.metrics.enabled
    assert cfg.storage == settings.StorageConfig(
        data_dir=str(data_dir),
        metadata_uri=f"file://{data_dir}/metadata",
        blobs_uri=f"file://{data_dir}/blobs",
        zk_session_timeout_ms=10_000,
        zk_connect_timeout_ms=15_000,
        zk_max_request_bytes=1_048_575,
        s3_addressing_style="auto",
        blob_probe_interval_ms=5_000,
        zk_auth_file="",
        zk_tls_ca="",
        zk_tls_cert="",
        zk_tls_key="",
        s3_sse="",
        s3_sse_kms_key_id="",
    )
    assert cfg.producers == ProducerPolicy(
        default_ttl_ms=86_400_000, max_ttl_ms=7 * 86_400_000, max_offsets=100_000
    )
    assert cfg.janitor == settings.JanitorConfig(
        cleanup_interval_ms=60_000,
        orphan_grace_ms=3_600_000,
        orphan_sweep_interval_ms=900_000,
        orphan_listing_interval_ms=0,
        batch=1000,
    )
    assert cfg.janitor.enabled
    assert not load({"cleanup_interval": "0s"}, {}).janitor.enabled
    assert cfg.backlog == BacklogPolicy(max_partitions=10_000)
    assert cfg.logging.level == "INFO"


def test_the_default_ttl_may_not_exceed_the_maximum() -> None:
    with pytest.raises(
        ConfigError, match=r"--producer-default-ttl \(172800000 ms\) exceeds --producer-max-ttl"
    ):
        load({"producer_default_ttl": "2d", "producer_max_ttl": "1d"}, {})


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_flag_beats_env_beats_default(name: str) -> None:
    first, second, where, expected = SAMPLES[name]
    env_name = "SNAPCOORD_" + name.upper()
    partners = {**PARTNERS.get(name, {}), **NEEDS.get(name, {})}
    from_flag = load({**partners, name: first}, {env_name: second})
    assert _get(from_flag, where) == expected
    from_env = load(partners, {env_name: first})
    assert _get(from_env, where) == expected
    assert _get(load({}, {}), where) != expected  # the samples differ from the defaults


def test_empty_env_var_counts_as_unset() -> None:
    cfg = load({}, {"SNAPCOORD_PORT": "", "SNAPCOORD_METRICS_HOST": ""})
    assert cfg.grpc.port == 50051
    assert cfg.metrics.host == cfg.grpc.host


def test_metrics_host_follows_host_unless_set() -> None:
    assert load({"host": "127.0.0.1"}, {}).metrics.host == "127.0.0.1"
    assert load({}, {"SNAPCOORD_HOST": "127.0.0.1"}).metrics.host == "127.0.0.1"
    assert load({"host": "127.0.0.1", "metrics_host": "0.0.0.0"}, {}).metrics.host == "0.0.0.0"


def test_data_dir_moves_the_default_uris_only(tmp_path: Path) -> None:
    cfg = load({"data_dir": str(tmp_path / "d")}, {})
    assert cfg.storage.metadata_uri == (tmp_path / "d" / "metadata").as_uri()
    assert cfg.storage.blobs_uri == (tmp_path / "d" / "blobs").as_uri()
    cfg = load({"data_dir": str(tmp_path / "d"), "metadata": "zk://h:2181/x"}, {})
    assert cfg.storage.metadata_uri == "zk://h:2181/x"
    assert cfg.storage.blobs_uri == (tmp_path / "d" / "blobs").as_uri()


def test_relative_data_dir_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load({"data_dir": "rel/dir"}, {}).storage.data_dir == str(tmp_path / "rel" / "dir")


def test_metrics_port_minus_one_disables_the_exporter() -> None:
    assert not load({"metrics_port": "-1"}, {}).metrics.enabled
    assert load({"metrics_port": "0"}, {}).metrics.enabled


def test_ipv6_host_without_brackets() -> None:
    assert load({"host": "[::1]"}, {}).grpc.host == "::1"
    assert load({"host": "::"}, {}).grpc.host == "::"


def test_processes_takes_auto_from_the_flag_or_the_environment() -> None:
    """``auto`` stays ``auto`` in the config: the count depends on the machine and is resolved
    (and logged) when the server starts, see test_processes.py."""
    zk = NEEDS["processes"]
    assert load({"processes": "auto"}, {}).grpc.processes == "auto"
    assert load({}, {"SNAPCOORD_PROCESSES": "auto"}).grpc.processes == "auto"
    assert load({**zk, "processes": "3"}, {"SNAPCOORD_PROCESSES": "auto"}).grpc.processes == 3
    assert load({"processes": "auto"}, {"SNAPCOORD_PROCESSES": "3"}).grpc.processes == "auto"
    assert load({"processes": " auto "}, {}).grpc.processes == "auto"
    assert load({}, {}).grpc.processes == 1


@pytest.mark.parametrize(("text", "count"), [("1", 1), ("2", 2), ("256", 256), (" 16 ", 16)])
def test_processes_takes_a_count_1_to_256(text: str, count: int) -> None:
    assert load({**NEEDS["processes"], "processes": text}, {}).grpc.processes == count


@pytest.mark.parametrize("metadata", [None, "file:///srv/metadata"])
def test_more_than_one_process_on_the_embedded_store_is_refused(metadata: str | None) -> None:
    """Its files belong to one process; the count is refused, not lowered (auto is lowered, with a
    warning at start: environment.embedded_store_warnings)."""
    flags = {"processes": "2"} if metadata is None else {"processes": "2", "metadata": metadata}
    with pytest.raises(ConfigError) as e:
        load(flags, {})
    assert str(e.value) == (
        "--processes=2 needs ZooKeeper metadata (--metadata zk://...); the embedded store serves one process"
    )
    assert load({"processes": "1"}, {}).grpc.processes == 1


@pytest.mark.parametrize("text", ["two", "0", "257", "-1", "1.5", "AUTO", "Auto", "auto2", "", "2 auto"])
def test_a_bad_processes_value_says_what_is_accepted(text: str) -> None:
    wanted = "expected an integer 1-256, or auto (one process per CPU this process may use)"
    with pytest.raises(ConfigError) as e:
        load({"processes": text}, {})
    assert str(e.value) == f"invalid --processes={text!r}: {wanted}"
    if text:
        with pytest.raises(ConfigError) as e:
            load({}, {"SNAPCOORD_PROCESSES": text})
        source = f"SNAPCOORD_PROCESSES={text!r} (environment; --processes overrides it)"
        assert str(e.value) == f"invalid {source}: {wanted}"


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("10s", 10_000), ("5m", 300_000), ("24h", 86_400_000), ("7d", 604_800_000), ("0s", 0)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["10", "", "s", "1.5s", "-1s", "10 sec", "10S", "1h30m", "ten s"])
def test_durations_need_a_whole_number_and_a_unit(text: str) -> None:
    with pytest.raises(ValueError, match="unit"):
        parse_duration_ms(text)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_flag_value_names_the_flag_and_the_value(name: str) -> None:
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError) as e:
        load({name: BAD[name]}, {})
    assert flag in str(e.value)
    assert repr(BAD[name]) in str(e.value)


@pytest.mark.parametrize("name", sorted(n for n in BAD if BAD[n].strip()))
def test_bad_env_value_names_the_variable_and_the_value(name: str) -> None:
    env_name = "SNAPCOORD_" + name.upper()
    with pytest.raises(ConfigError) as e:
        load({}, {env_name: BAD[name]})
    assert env_name in str(e.value)
    assert repr(BAD[name]) in str(e.value)


@pytest.mark.parametrize("name", sorted(PARTNERS))
def test_an_option_without_its_partner_names_both(name: str) -> None:
    with pytest.raises(ConfigError, match="--" + name.replace("_", "-") + " needs --"):
        load({name: SAMPLES[name][0]}, {})


def test_a_good_flag_hides_a_bad_env_value() -> None:
    assert load({"port": "1234"}, {"SNAPCOORD_PORT": "nope"}).grpc.port == 1234


def test_unsupported_uri_scheme_says_what_is_supported() -> None:
    with pytest.raises(ConfigError, match=r"zk:// or file://"):
        load({"metadata": "etcd://h:2379"}, {})
    with pytest.raises(ConfigError, match=r"s3:// or file://"):
        load({}, {"SNAPCOORD_BLOBS": "gs://bucket"})
    with pytest.raises(ConfigError, match="absolute path"):
        load({"blobs": "file://relative/dir"}, {})


@pytest.mark.parametrize(
    ("uri", "secret", "kept"),
    [
        ("zk://alice:s3cr3t@zk1:2181,zk2:2181/sc", "s3cr3t", "zk://alice:***@zk1:2181,zk2:2181/sc"),
        ("zk://tokenonly@zk1:2181/sc", "tokenonly", "zk://***@zk1:2181/sc"),
        ("s3://bucket/prefix?secret_key=abc123&region=eu", "abc123", "region=eu"),
        ("file:///var/lib/sc/metadata", None, "file:///var/lib/sc/metadata"),
    ],
)
def test_redact_uri(uri: str, secret: str | None, kept: str) -> None:
    redacted = redact_uri(uri)
    if secret is not None:
        assert secret not in redacted
    assert kept in redacted


def test_describe_is_json_and_has_no_secrets() -> None:
    cfg = load({"metadata": "zk://u:hunter2@zk:2181/sc", "blobs": "s3://b/p"}, {})
    described = cfg.describe()
    text = json.dumps(described)
    assert "hunter2" not in text
    assert described["storage"]["metadata_uri"] == "zk://u:***@zk:2181/sc"
    assert described["grpc"]["port"] == 50051
    # the config itself keeps the real value for the backend
    assert cfg.storage.metadata_uri == "zk://u:hunter2@zk:2181/sc"


def test_config_is_frozen() -> None:
    cfg = load({}, {})
    with pytest.raises(AttributeError):
        cfg.grpc.port = 1  # type: ignore[misc]


def test_storage_options_carry_the_timeouts() -> None:
    cfg = load({"zk_session_timeout": "4s", "zk_connect_timeout": "1m", "s3_addressing_style": "path"}, {})
    assert cfg.storage.metadata_options().zk_session_timeout_ms == 4000
    assert cfg.storage.metadata_options().zk_connect_timeout_ms == 60_000
    assert cfg.storage.blob_options().s3_addressing_style == "path"


# --- the one table: options -> Config fields, policies included ---------------------------------


def _feeders() -> dict[tuple[str, str], list[str]]:
    fed: dict[tuple[str, str], list[str]] = {}
    for opt in OPTIONS:
        for target in opt.targets:
            fed.setdefault(target, []).append(opt.name)
    return fed


def test_every_option_fills_fields_that_exist() -> None:
    known = {(section, f.name) for section, cls in sections().items() for f in fields(cls)}
    for opt in OPTIONS:
        assert opt.targets, f"{opt.flag} fills no Config field"
        # Unset, an option takes its default or, without one, a value derived from the others.
        assert (opt.default is None) == (opt.derive is not None), opt.flag
        for target in opt.targets:
            assert target in known, f"{opt.flag} fills {target}, which Config does not have"


def test_every_field_is_filled_by_exactly_one_option_or_is_a_declared_constant() -> None:
    """A new field without an option (or a second option for one field) fails here, not in production
    with a silently kept dataclass default."""
    fed = _feeders()
    for section, cls in sections().items():
        for f in fields(cls):
            where = (section, f.name)
            if where in FIXED:
                assert where not in fed, f"{where} is declared FIXED but {fed[where]} set it"
                assert (f.default, f.default_factory) != (MISSING, MISSING), f"FIXED {where} has no default"
            else:
                assert len(fed.get(where, [])) == 1, f"{where} is filled by {fed.get(where, [])}"
    assert {s for s, _ in FIXED} <= set(sections())


def test_only_the_clock_skew_and_the_request_limit_fan_out() -> None:
    assert [o.name for o in OPTIONS if len(o.targets) > 1] == ["zk_max_request_bytes", "max_clock_skew"]
    cfg = load({"max_clock_skew": "7s"}, {})
    assert cfg.snapshots.max_clock_skew_ms == cfg.leases.max_clock_skew_ms == 7000


def test_the_policy_sections_are_the_domain_policies_with_the_same_defaults() -> None:
    """Unit tests of the domain use the dataclass defaults; operators get the option defaults."""
    cfg = load({}, {})
    assert cfg.producers == ProducerPolicy()
    assert cfg.snapshots == SnapshotPolicy()
    assert cfg.leases == LeasePolicy()
    assert cfg.backlog == BacklogPolicy()
    assert cfg.claims == CommitClaimPolicy()


def test_a_policy_default_is_shown_whole_in_its_options_unit_or_refused() -> None:
    """An option shows its policy field's default as an operator types it; a default that is not
    a whole number of the option's unit fails the import instead of being shown rounded."""
    assert options._as_duration(86_400_000, "h") == "24h"
    assert options._as_size(8 * 1024**3, "GiB") == "8GiB"
    with pytest.raises(ValueError, match="90000 ms is not a whole number of m"):
        options._as_duration(90_000, "m")
    with pytest.raises(ValueError, match="1536 B is not a whole number of KiB"):
        options._as_size(1536, "KiB")


def test_every_option_is_a_flag_that_load_reads() -> None:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    assert vars(parser.parse_args([])) == {o.name: None for o in OPTIONS}  # unset: env or default decide
    for name, (first, _, where, expected) in SAMPLES.items():
        flags = vars(parser.parse_args([f"--{name.replace('_', '-')}", first]))
        flags.update({**PARTNERS.get(name, {}), **NEEDS.get(name, {})})
        assert _get(load(flags, {}), where) == expected


def _invalid(call: object) -> str:
    assert isinstance(call, grpc.RpcError) and isinstance(call, grpc.Call)
    assert call.code() == grpc.StatusCode.INVALID_ARGUMENT, call.details()
    return call.details() or ""


def test_policy_options_reach_the_running_services(tmp_path: Path) -> None:
    """Services.build hands the config's policies to the registries: a limit set by a flag is the one
    a real server enforces."""
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(
            deps,
            producer_max_ttl="1h",
            producer_default_ttl="1m",
            snapshot_max_tasks="2",
            lease_max_duration="1m",
            backlog_max_partitions="2",
        ) as coord,
        coord.channel() as ch,
    ):
        producers = producer_pb2_grpc.ProducerOffsetServiceStub(ch)
        offset = common_pb2.Offset(stream="s", partition=0, offset=1)
        with pytest.raises(grpc.RpcError) as e:
            producers.RegisterProducerOffsets(
                producer_pb2.RegisterProducerOffsetsRequest(
                    producer_id="p", offsets=[offset], ttl_ms=7_200_000
                ),
                timeout=30,
            )
        assert "at most 3600000 ms" in _invalid(e.value)
        reply = producers.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id="p", offsets=[offset]), timeout=30
        )
        assert reply.snapshot.expires_at_ms - reply.snapshot.created_at_ms == 60_000

        snapshots = snapshot_pb2_grpc.SnapshotServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            snapshots.CreateSnapshot(
                snapshot_pb2.CreateSnapshotRequest(app_id="a", task_ids=["t1", "t2", "t3"]), timeout=30
            )
        assert "the limit is 2" in _invalid(e.value)

        leases = lease_pb2_grpc.LeaseServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            leases.AcquireSnapshots(
                lease_pb2.AcquireSnapshotsRequest(lease_id="l", duration_ms=120_000), timeout=30
            )
        assert "1000-60000 ms" in _invalid(e.value)

        backlog = backlog_pb2_grpc.BacklogServiceStub(ch)
        boundaries = [common_pb2.Offset(stream="s", partition=p, offset=1) for p in range(3)]
        with pytest.raises(grpc.RpcError) as e:
            backlog.MarkBacklog(backlog_pb2.MarkBacklogRequest(job_id="j", boundaries=boundaries), timeout=30)
        assert "2 partitions per job" in _invalid(e.value)


def _zk_auth_file(tmp_path: Path, user: str) -> str:
    path = tmp_path / "zk-auth"
    path.write_text(f"{user}:zk-secret\n")
    return str(path)


def test_a_zookeeper_auth_file_that_cannot_be_used_is_a_config_error(tmp_path: Path) -> None:
    """config reads it (for the ACL's size), so a missing or malformed one fails there, not later."""
    zk = {"metadata": "zk://zk1:2181/sc"}
    with pytest.raises(ConfigError, match=r"invalid --zk-auth-file: cannot read the ZooKeeper auth file"):
        load({**zk, "zk_auth_file": str(tmp_path / "missing")}, {})
    with pytest.raises(ConfigError, match=r"longer than 256 bytes"):
        load({**zk, "zk_auth_file": _zk_auth_file(tmp_path, "u" * 257)}, {})
    bad = tmp_path / "bad"
    bad.write_text("just-a-password\n")
    with pytest.raises(ConfigError, match="user:password") as e:
        load({**zk, "zk_auth_file": str(bad)}, {})
    assert "just-a-password" not in str(e.value)


def _zk_uri_with_chroot_of(size: int, char: str = "c") -> str:
    """A zk:// URI whose chroot is ``size`` bytes of UTF-8: "/" then ``char`` (1 or 2 bytes each),
    padded with "c"."""
    body = char * ((size - 1) // len(char.encode()))
    chroot = "/" + body + "c" * (size - 1 - len(body.encode()))
    assert len(chroot.encode()) == size
    return f"zk://zk1:2181,zk2:2181{chroot}"


@pytest.mark.parametrize("char", ["c", "é"], ids=["ascii", "two-byte-utf8"])
def test_a_zk_chroot_may_be_as_long_as_the_request_budgets_assume_and_no_longer(char: str) -> None:
    """Every path goes to ZooKeeper with the chroot before it, and the request-size limits (the
    start-up lease check, zk_budget's worst cases) are computed for a chroot of MAX_CHROOT_BYTES:
    one that long loads, one byte more is refused, counted in UTF-8 bytes as ZooKeeper sends it
    (32 two-byte characters are 64 characters' worth)."""
    at_limit = _zk_uri_with_chroot_of(MAX_CHROOT_BYTES, char)
    assert load({"metadata": at_limit}, {}).storage.metadata_uri == at_limit
    with pytest.raises(ConfigError, match=rf"chroot is {MAX_CHROOT_BYTES + 1} bytes long"):
        load({"metadata": _zk_uri_with_chroot_of(MAX_CHROOT_BYTES + 1, char)}, {})


def test_an_over_long_zk_chroot_is_refused_with_a_message_that_says_what_to_do() -> None:
    uri = "zk://zk1:2181/" + "/".join(["team-orders-snapshots"] * 14)  # 308 bytes
    with pytest.raises(ConfigError) as e:
        load({}, {"SNAPCOORD_METADATA": uri})
    message = str(e.value)
    assert message.startswith("invalid SNAPCOORD_METADATA=")  # where the value came from
    assert f"chroot is 308 bytes long (UTF-8) and may be at most {MAX_CHROOT_BYTES}" in message
    assert "--zk-max-request-bytes" in message  # why
    assert "use a shorter path" in message  # what to do
    # Embedded metadata has no chroot, and no length limit comes with it.
    assert load({"metadata": "file:///" + "d" * 300}, {}).storage.metadata_uri.endswith("d" * 300)
