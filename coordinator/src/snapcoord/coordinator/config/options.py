"""The one table of options: each setting's flag and environment variable (both derived from
its name), how to parse a value (with units), its default, its help, and the ``Config`` field(s)
it fills. The argument parser, the ``--help`` text, ``settings.load`` and the tests that keep the
docs and docker-compose naming real options all read ``OPTIONS``, so a new setting is one entry
here plus the field it fills (and the code that reads that field). An option that fills a policy
field (``ProducerPolicy``, ``SnapshotPolicy``, ``LeasePolicy``, ``BacklogPolicy``,
``CommitClaimPolicy``) takes that
field's default as its own, so the default is written once, on the field: the domain's unit
tests and the operator get the same value.

Every parser takes the raw string and raises ``ValueError`` saying what it expected; ``load`` adds
where the value came from.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from snapcoord.coordinator.config.redaction import redact_uri
from snapcoord.coordinator.domain.backlog import BacklogPolicy
from snapcoord.coordinator.domain.claims import CommitClaimPolicy
from snapcoord.coordinator.domain.leases import LeasePolicy
from snapcoord.coordinator.domain.producers import MAX_INLINE_BYTES, ProducerPolicy
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.storage.uris import zk_chroot
from snapcoord.coordinator.storage.zookeeper.request_size import MAX_CHROOT_BYTES

# --- value parsers: each takes the raw string and raises ValueError saying what was expected -----

_DURATION_RE = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``500ms``, ``10s``, ``5m``, ``24h``, ``7d`` -> milliseconds. A unit is required: a bare
    number is ambiguous (seconds? milliseconds?) and is the classic source of 1000x mistakes."""
    m = _DURATION_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(
            "expected a whole number with a unit: ms, s, m, h or d (e.g. 500ms, 10s, 5m, 24h, 7d)"
        )
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def _int_parser(lo: int, hi: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise ValueError(f"expected {what}") from None
        if not lo <= value <= hi:
            raise ValueError(f"expected {what}")
        return value

    return parse


def _processes(text: str) -> int | Literal["auto"]:
    """``auto`` or a count; ``auto`` is resolved when the server starts, not here: it depends on
    the machine (CPUs, cgroup quota) and is logged with its reasons once logging is set up."""
    if text.strip() == "auto":
        return "auto"
    return _int_parser(1, 256, "an integer 1-256, or auto (one process per CPU this process may use)")(text)


def _duration_parser(min_ms: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_duration_ms(text)
        if value < min_ms:
            raise ValueError(f"must be at least {min_ms}ms")
        return value

    return parse


_SIZE_RE = re.compile(r"(\d+)(B|KiB|MiB|GiB)")
_SIZE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _size_parser(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        m = _SIZE_RE.fullmatch(text.strip())
        if not m:
            raise ValueError("expected a whole number with a unit: B, KiB, MiB or GiB (e.g. 64MiB)")
        value = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
        if not lo <= value <= hi:
            raise ValueError(f"must be {lo} B to {hi} B")
        return value

    return parse


def _as_duration(ms: int, unit: str) -> str:
    """A default in milliseconds as an operator types it, in ``unit`` (``parse_duration_ms``
    reads it back): the policies' field defaults are the options' defaults."""
    count, rest = divmod(ms, _UNIT_MS[unit])
    if rest:
        raise ValueError(f"{ms} ms is not a whole number of {unit}")
    return f"{count}{unit}"


def _as_size(size: int, unit: str) -> str:
    """A default in bytes as an operator types it, in ``unit`` (``_size_parser`` reads it back)."""
    count, rest = divmod(size, _SIZE_UNITS[unit])
    if rest:
        raise ValueError(f"{size} B is not a whole number of {unit}")
    return f"{count}{unit}"


def _choice_parser(choices: Sequence[str], *, fold_case: bool) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().upper() if fold_case else text.strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def _host(text: str) -> str:
    value = text.strip()
    if not value or any(c.isspace() for c in value) or "/" in value:
        raise ValueError("expected a host name or IP address to bind (e.g. 0.0.0.0, 127.0.0.1, ::)")
    return value.removeprefix("[").removesuffix("]")


def _optional_file(text: str) -> str:
    """A file path made absolute, or "" (unset). Existence is checked when the server starts."""
    value = text.strip()
    if not value:
        return ""
    if text != value or "\n" in value:
        raise ValueError("expected a file path without surrounding spaces")
    return str(Path(value).expanduser().resolve())


def _kms_key(text: str) -> str:
    value = text.strip()
    if any(c.isspace() for c in value):
        raise ValueError("expected a KMS key id, alias or ARN (no spaces)")
    return value


def _path(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a directory path")
    return str(Path(text.strip()).expanduser().resolve())


def _uri_parser(schemes: Sequence[str], example: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        parts = urlsplit(value)
        if parts.scheme not in schemes:
            raise ValueError(
                f"expected a URI with scheme {' or '.join(s + '://' for s in schemes)} ({example})"
            )
        if parts.scheme == "file" and (
            parts.netloc not in ("", "localhost") or not parts.path.startswith("/")
        ):
            raise ValueError("a file:// URI needs an absolute path: file:///var/lib/snapcoord/...")
        if parts.scheme != "file" and not parts.netloc:
            raise ValueError(f"the URI names no {'bucket' if parts.scheme == 's3' else 'server'} ({example})")
        return value

    return parse


def _metadata_uri(text: str) -> str:
    """A metadata URI; a ``zk://`` one's chroot is checked as the store parses it: well formed and
    at most ``MAX_CHROOT_BYTES`` long, the length the request-size limits are computed for."""
    value = _uri_parser(
        ("zk", "file"), "zk://zk1:2181,zk2:2181/snapcoord or file:///var/lib/snapcoord/metadata"
    )(text)
    if urlsplit(value).scheme == "zk":
        zk_chroot(value)
    return value


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: What each ``--otel-exporter`` needs importable, beyond the API and SDK.
_OTEL_MODULES: Mapping[str, tuple[str, ...]] = {
    "none": (),
    "console": ("opentelemetry.sdk.trace",),
    "otlp": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
}


def _otel_exporter(text: str) -> str:
    """A choice of ``_OTEL_MODULES``, refused when the ``otel`` extra is not installed: better exit
    2 at start, naming the fix, than serve without the traces the operator asked for."""
    value = _choice_parser(tuple(_OTEL_MODULES), fold_case=False)(text)
    missing = [name for name in _OTEL_MODULES[value] if not _importable(name)]
    if missing:
        raise ValueError(
            f"tracing needs the OpenTelemetry extra ({missing[0]} is not installed): "
            "pip install 'snapcoord[otel]'"
        )
    return value


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def _under_data_dir(name: str) -> Callable[[Mapping[str, Any]], str]:
    """The default store URI: ``name`` in the embedded stores' directory."""
    return lambda values: (Path(values["data_dir"]) / name).as_uri()


# --- the one table of options ------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One setting: its flag, its environment variable, its default, how to read a value, and
    which ``Config`` field(s) the value fills."""

    #: Name in the flat namespace, e.g. ``port``; the flag is ``--port``, the variable ``SNAPCOORD_PORT``.
    name: str
    help: str
    #: The default as a person would type it; None when it is derived from other options
    #: (``derive`` computes it, ``default_doc`` says how).
    default: str | None
    parse: Callable[[str], Any]
    #: ``"section.field"`` of ``Config`` that receives the parsed value; a tuple when one setting
    #: feeds several consumers (the clock-skew margin is honoured by snapshots and leases alike).
    to: str | tuple[str, ...] = field(kw_only=True)
    default_doc: str | None = None
    #: The value when the option is unset and has no default, from the other options' parsed
    #: values (which are all there: a derived option never depends on another derived one).
    derive: Callable[[Mapping[str, Any]], Any] | None = None
    metavar: str = "VALUE"
    #: How a value is shown (``check-config``): a URI may carry credentials.
    redact: Callable[[str], str] = str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "SNAPCOORD_" + self.name.upper()

    @property
    def targets(self) -> tuple[tuple[str, str], ...]:
        """``(section, field)`` pairs this option fills."""
        names = (self.to,) if isinstance(self.to, str) else self.to
        return tuple(cast(tuple[str, str], tuple(n.split(".", 1))) for n in names)

    @property
    def shown_default(self) -> str:
        return self.default_doc if not self.default and self.default_doc else str(self.default)


@dataclass(frozen=True)
class NotAbove:
    """A check across two options: ``low``'s value may not exceed ``high``'s (both in ms)."""

    low: str
    high: str
    advice: str = ""


OPTIONS: tuple[Option, ...] = (
    Option("host", "address the gRPC server binds", "0.0.0.0", _host, to="grpc.host", metavar="HOST"),
    Option(
        "port",
        "gRPC port; 0 picks a free port",
        "50051",
        _int_parser(0, 65535, "a port 0-65535"),
        to="grpc.port",
        metavar="PORT",
    ),
    Option(
        "metrics_host",
        "address the Prometheus exporter binds",
        None,
        _host,
        default_doc="same as --host",
        to="metrics.host",
        derive=lambda v: v["host"],
        metavar="HOST",
    ),
    Option(
        "metrics_port",
        "Prometheus exporter port; 0 picks a free port, -1 disables the exporter (with --processes "
        "above 1, the supervisor serves every process's metrics here)",
        "9464",
        _int_parser(-1, 65535, "a port 0-65535, or -1 to disable metrics"),
        to="metrics.port",
        metavar="PORT",
    ),
    Option(
        "metrics_tls_cert",
        "PEM certificate for the Prometheus exporter; with --metrics-tls-key it serves HTTPS",
        "",
        _optional_file,
        default_doc="none: plain HTTP",
        to="metrics.tls_cert",
        metavar="FILE",
    ),
    Option(
        "metrics_tls_key",
        "PEM private key of --metrics-tls-cert",
        "",
        _optional_file,
        default_doc="none",
        to="metrics.tls_key",
        metavar="FILE",
    ),
    Option(
        "health_host",
        "address the health-only port binds",
        None,
        _host,
        default_doc="same as --host",
        to="grpc.health_host",
        derive=lambda v: v["host"],
        metavar="HOST",
    ),
    Option(
        "health_port",
        "plaintext port serving only grpc.health.v1 (for probes that cannot present a client "
        "certificate); 0 picks a free port, -1 serves none",
        "-1",
        _int_parser(-1, 65535, "a port 0-65535, or -1 for no health-only port"),
        to="grpc.health_port",
        metavar="PORT",
    ),
    Option(
        "tls_cert",
        "PEM certificate (chain) of the gRPC port; with --tls-key it serves TLS (re-read on change)",
        "",
        _optional_file,
        default_doc="none: plaintext",
        to="security.tls_cert",
        metavar="FILE",
    ),
    Option(
        "tls_key",
        "PEM private key of --tls-cert",
        "",
        _optional_file,
        default_doc="none",
        to="security.tls_key",
        metavar="FILE",
    ),
    Option(
        "tls_client_ca",
        "PEM CA bundle: clients must present a certificate it signed (mutual TLS); needs --tls-cert",
        "",
        _optional_file,
        default_doc="none: no client certificates",
        to="security.tls_client_ca",
        metavar="FILE",
    ),
    Option(
        "auth_file",
        "principals: token hashes, certificate identities, roles, id scopes (YAML/JSON; re-read on change)",
        "",
        _optional_file,
        default_doc="none: every caller is accepted",
        to="security.auth_file",
        metavar="FILE",
    ),
    Option(
        "data_dir",
        "directory of the embedded stores behind the default --metadata and --blobs",
        "./snapcoord-data",
        _path,
        to="storage.data_dir",
        metavar="DIR",
    ),
    Option(
        "metadata",
        f"metadata store: zk://host:port[,host:port]/chroot (a chroot of at most {MAX_CHROOT_BYTES} "
        "bytes) or file:///dir",
        None,
        _metadata_uri,
        default_doc="file://<data-dir>/metadata",
        to="storage.metadata_uri",
        derive=_under_data_dir("metadata"),
        metavar="URI",
        redact=redact_uri,
    ),
    Option(
        "blobs",
        "blob store: s3://bucket/prefix or file:///dir",
        None,
        _uri_parser(("s3", "file"), "s3://my-bucket/snapcoord or file:///var/lib/snapcoord/blobs"),
        default_doc="file://<data-dir>/blobs",
        to="storage.blobs_uri",
        derive=_under_data_dir("blobs"),
        metavar="URI",
        redact=redact_uri,
    ),
    Option(
        "max_workers",
        "threads running RPC handlers",
        "32",
        _int_parser(1, 10_000, "an integer 1-10000"),
        to="grpc.max_workers",
        metavar="N",
    ),
    Option(
        "processes",
        "processes serving the gRPC port together (SO_REUSEPORT), each with its own ZooKeeper "
        "session, handler threads and janitor candidacy, their metrics served together on the one "
        "--metrics-port; more than 1 needs zk:// metadata; auto: one per CPU this process may use "
        "(its CPU affinity, capped by a container's cgroup CPU limit), 1 with embedded metadata",
        "1",
        _processes,
        to="grpc.processes",
        metavar="N|auto",
    ),
    Option(
        "max_concurrent_rpcs",
        "calls in flight before new ones are refused with RESOURCE_EXHAUSTED",
        "256",
        _int_parser(1, 1_000_000, "an integer 1-1000000"),
        to="grpc.max_concurrent_rpcs",
        metavar="N",
    ),
    Option(
        "shutdown_grace",
        "on SIGTERM, how long in-flight calls may run before they are cancelled",
        "10s",
        _duration_parser(0),
        to="grpc.shutdown_grace_ms",
        metavar="DURATION",
    ),
    Option(
        "keepalive_min_ping_interval",
        "shortest interval between a client's keepalive pings the server accepts (with or without "
        "calls in flight); keep it below every client's keepalive time",
        "30s",
        _duration_parser(0),
        to="grpc.keepalive_min_ping_interval_ms",
        metavar="DURATION",
    ),
    Option(
        "keepalive_max_ping_strikes",
        "pings closer than --keepalive-min-ping-interval tolerated before GOAWAY too_many_pings; 0: no limit",
        "2",
        _int_parser(0, 1000, "an integer 0-1000"),
        to="grpc.keepalive_max_ping_strikes",
        metavar="N",
    ),
    Option(
        "payload_budget",
        "checkpoint payload bytes all calls together may hold in memory (B, KiB, MiB, GiB)",
        "1GiB",
        _size_parser(1024 * 1024, 1024**4),
        to="grpc.payload_budget_bytes",
        metavar="SIZE",
    ),
    Option(
        "max_inline_payload",
        "most checkpoint bytes one ReportTaskSnapshot carries inline; larger payloads stream with "
        "UploadCheckpoint. gRPC refuses a request message over this plus a 4 MiB envelope before "
        "buffering it (B, KiB, MiB, GiB)",
        _as_size(SnapshotPolicy.max_report_bytes, "MiB"),
        _size_parser(1, 1024**3),
        to="snapshots.max_report_bytes",
        metavar="SIZE",
    ),
    Option(
        "payload_budget_wait",
        "how long a call waits for room in --payload-budget before RESOURCE_EXHAUSTED",
        "10s",
        _duration_parser(0),
        to="grpc.payload_budget_wait_ms",
        metavar="DURATION",
    ),
    Option(
        "zk_session_timeout",
        "ZooKeeper session timeout",
        "10s",
        _duration_parser(1),
        to="storage.zk_session_timeout_ms",
        metavar="DURATION",
    ),
    Option(
        "zk_connect_timeout",
        "how long to wait for ZooKeeper at start before giving up",
        "15s",
        _duration_parser(1),
        to="storage.zk_connect_timeout_ms",
        metavar="DURATION",
    ),
    Option(
        "zk_max_request_bytes",
        "ZooKeeper's jute.maxbuffer in bytes (set it to the ensemble's); request-size limits derive from it",
        "1048575",
        _int_parser(
            1_048_575, 1_073_741_824, "an integer 1048575-1073741824 (bytes; 1048575 is ZooKeeper's default)"
        ),
        to=("storage.zk_max_request_bytes", "snapshots.max_request_bytes", "leases.max_request_bytes"),
        metavar="BYTES",
    ),
    Option(
        "blob_probe_interval",
        "how often health probes the blob store (services that write payloads follow it)",
        "5s",
        _duration_parser(1),
        to="storage.blob_probe_interval_ms",
        metavar="DURATION",
    ),
    Option(
        "s3_addressing_style",
        "S3 addressing: auto (path style when an endpoint URL is set), path or virtual",
        "auto",
        _choice_parser(("auto", "path", "virtual"), fold_case=False),
        to="storage.s3_addressing_style",
        metavar="STYLE",
    ),
    Option(
        "zk_auth_file",
        "file holding user:password for ZooKeeper digest auth; the coordinator's znodes get ACLs for it",
        "",
        _optional_file,
        default_doc="none: open ACLs",
        to="storage.zk_auth_file",
        metavar="FILE",
    ),
    Option(
        "zk_tls_ca",
        "PEM CA bundle of ZooKeeper's TLS client port (secureClientPort); set it to connect with TLS",
        "",
        _optional_file,
        default_doc="none: plaintext",
        to="storage.zk_tls_ca",
        metavar="FILE",
    ),
    Option(
        "zk_tls_cert",
        "PEM client certificate for ZooKeeper's TLS port (when it requires one); needs --zk-tls-key",
        "",
        _optional_file,
        default_doc="none",
        to="storage.zk_tls_cert",
        metavar="FILE",
    ),
    Option(
        "zk_tls_key",
        "PEM private key of --zk-tls-cert",
        "",
        _optional_file,
        default_doc="none",
        to="storage.zk_tls_key",
        metavar="FILE",
    ),
    Option(
        "s3_sse",
        "S3 server-side encryption of payload objects: AES256 or aws:kms",
        "",
        _choice_parser(("", "AES256", "aws:kms"), fold_case=False),
        default_doc="none: the bucket's default",
        to="storage.s3_sse",
        metavar="MODE",
    ),
    Option(
        "s3_sse_kms_key_id",
        "KMS key id or ARN for --s3-sse aws:kms",
        "",
        _kms_key,
        default_doc="none: the account's default KMS key",
        to="storage.s3_sse_kms_key_id",
        metavar="KEY",
    ),
    Option(
        "producer_default_ttl",
        "TTL of a producer offset record registered with ttl_ms=0",
        _as_duration(ProducerPolicy.default_ttl_ms, "h"),
        _duration_parser(1),
        to="producers.default_ttl_ms",
        metavar="DURATION",
    ),
    Option(
        "producer_max_ttl",
        "largest ttl_ms a producer registration may ask for",
        _as_duration(ProducerPolicy.max_ttl_ms, "d"),
        _duration_parser(1),
        to="producers.max_ttl_ms",
        metavar="DURATION",
    ),
    Option(
        "producer_max_offsets",
        "most offsets in one producer registration",
        str(ProducerPolicy.max_offsets),
        _int_parser(1, 10_000_000, "an integer 1-10000000"),
        to="producers.max_offsets",
        metavar="N",
    ),
    Option(
        "producer_inline_max_bytes",
        "producer offsets up to this size live in their ZooKeeper record, larger ones in the blob store "
        "(0: all in the blob store, the only record format earlier releases read)",
        str(ProducerPolicy.inline_max_bytes),
        _int_parser(0, MAX_INLINE_BYTES, f"an integer 0-{MAX_INLINE_BYTES} (bytes)"),
        to="producers.inline_max_bytes",
        metavar="BYTES",
    ),
    Option(
        "snapshot_default_timeout",
        "a snapshot still CREATED this long after CreateSnapshot (timeout_ms=0) is aborted",
        _as_duration(SnapshotPolicy.default_timeout_ms, "m"),
        _duration_parser(1),
        to="snapshots.default_timeout_ms",
        metavar="DURATION",
    ),
    Option(
        "snapshot_max_timeout",
        "largest timeout_ms a CreateSnapshot may ask for",
        _as_duration(SnapshotPolicy.max_timeout_ms, "d"),
        _duration_parser(1),
        to="snapshots.max_timeout_ms",
        metavar="DURATION",
    ),
    Option(
        "snapshot_max_tasks",
        "most tasks in one snapshot",
        str(SnapshotPolicy.max_tasks),
        _int_parser(1, 20_000, "an integer 1-20000"),
        to="snapshots.max_tasks",
        metavar="N",
    ),
    Option(
        "snapshot_inline_checkpoint_max_bytes",
        "checkpoints up to this size are stored in their task's report in ZooKeeper, larger ones in the "
        "blob store (0: all in the blob store, the only report format earlier releases read)",
        str(SnapshotPolicy.inline_checkpoint_max_bytes),
        _int_parser(0, MAX_INLINE_BYTES, f"an integer 0-{MAX_INLINE_BYTES} (bytes)"),
        to="snapshots.inline_checkpoint_max_bytes",
        metavar="BYTES",
    ),
    Option(
        "snapshot_max_inline_read",
        "most payload bytes GetSnapshot returns with include_checkpoints; ReadCheckpoint streams beyond",
        _as_size(SnapshotPolicy.max_inline_read_bytes, "MiB"),
        _size_parser(1, 1024**3),
        to="snapshots.max_inline_read_bytes",
        metavar="SIZE",
    ),
    Option(
        "snapshot_max_upload_size",
        "most bytes one UploadCheckpoint may stream (B, KiB, MiB, GiB)",
        _as_size(SnapshotPolicy.max_upload_bytes, "GiB"),
        _size_parser(1, 1024**4),
        to="snapshots.max_upload_bytes",
        metavar="SIZE",
    ),
    Option(
        "snapshot_max_checkpoints",
        "most checkpoint entries (inline and uploaded) in one ReportTaskSnapshot",
        str(SnapshotPolicy.max_checkpoints_per_report),
        _int_parser(1, 10_000, "an integer 1-10000"),
        to="snapshots.max_checkpoints_per_report",
        metavar="N",
    ),
    Option(
        "retention_keep_last_completed",
        "completed snapshots kept per app unless SetRetentionPolicy says otherwise",
        str(SnapshotPolicy.default_keep_last_completed),
        _int_parser(1, 1_000_000, "an integer 1-1000000"),
        to="snapshots.default_keep_last_completed",
        metavar="N",
    ),
    Option(
        "retention_completed_ttl",
        "age after which ended snapshots are deleted unless SetRetentionPolicy says otherwise",
        _as_duration(SnapshotPolicy.default_completed_ttl_ms, "d"),
        _duration_parser(1),
        to="snapshots.default_completed_ttl_ms",
        metavar="DURATION",
    ),
    Option(
        "backlog_max_partitions",
        "most partitions one job may mark for backlog tracking (and report in one call)",
        str(BacklogPolicy.max_partitions),
        _int_parser(1, 100_000, "an integer 1-100000"),
        to="backlog.max_partitions",
        metavar="N",
    ),
    Option(
        "commit_claim_retention",
        "age after which the janitor removes commit claims, except each table's highest (fences stay)",
        _as_duration(CommitClaimPolicy.retention_ms, "d"),
        _duration_parser(3_600_000),
        to="claims.retention_ms",
        metavar="DURATION",
    ),
    Option(
        "lease_min_duration",
        "shortest duration_ms a lease may ask for",
        _as_duration(LeasePolicy.min_duration_ms, "s"),
        _duration_parser(1),
        to="leases.min_duration_ms",
        metavar="DURATION",
    ),
    Option(
        "lease_max_duration",
        "longest duration_ms a lease may ask for",
        _as_duration(LeasePolicy.max_duration_ms, "d"),
        _duration_parser(1),
        to="leases.max_duration_ms",
        metavar="DURATION",
    ),
    Option(
        "lease_max_snapshots",
        "most snapshots in one AcquireSnapshots or ReleaseSnapshots call, and held by one lease",
        str(LeasePolicy.max_snapshots),
        _int_parser(1, 10_000, "an integer 1-10000"),
        to="leases.max_snapshots",
        metavar="N",
    ),
    Option(
        "lease_max_holders",
        "most leases holding one snapshot (an expired one counts until the janitor removes it)",
        str(LeasePolicy.max_holders),
        _int_parser(1, 1_000, "an integer 1-1000"),
        to="leases.max_holders",
        metavar="N",
    ),
    Option(
        "max_clock_skew",
        "how far replicas' clocks may disagree: a lease pins until its expiry plus this",
        _as_duration(LeasePolicy.max_clock_skew_ms, "s"),
        _duration_parser(0),
        to=("snapshots.max_clock_skew_ms", "leases.max_clock_skew_ms"),
        metavar="DURATION",
    ),
    Option(
        "cleanup_interval",
        "time between janitor passes (expiry, orphans); 0s disables the janitor on this replica",
        "60s",
        _duration_parser(0),
        to="janitor.cleanup_interval_ms",
        metavar="DURATION",
    ),
    Option(
        "orphan_grace",
        "age below which an unreferenced payload object is never deleted (uploads in flight)",
        "1h",
        _duration_parser(1),
        to="janitor.orphan_grace_ms",
        metavar="DURATION",
    ),
    Option(
        "orphan_sweep_interval",
        "time between orphan sweeps (each walks the upload intents older than --orphan-grace)",
        "15m",
        _duration_parser(1),
        to="janitor.orphan_sweep_interval_ms",
        metavar="DURATION",
    ),
    Option(
        "orphan_listing_interval",
        "time between listing sweeps of every payload object (objects written by coordinators from "
        "before upload intents); 0s = never",
        "0s",
        _duration_parser(0),
        to="janitor.orphan_listing_interval_ms",
        metavar="DURATION",
    ),
    Option(
        "cleanup_batch",
        "most deletions per janitor step and pass",
        "1000",
        _int_parser(1, 1_000_000, "an integer 1-1000000"),
        to="janitor.batch",
        metavar="N",
    ),
    Option(
        "log_level",
        "log level: DEBUG, INFO, WARNING, ERROR or CRITICAL",
        "INFO",
        _choice_parser(_LOG_LEVELS, fold_case=True),
        to="logging.level",
        metavar="LEVEL",
    ),
    Option(
        "log_format",
        "log lines: json (one object per line; the serving line on stdout and gRPC's own lines too), "
        "text, or auto (json unless stderr is a terminal)",
        "auto",
        _choice_parser(("auto", "json", "text"), fold_case=False),
        to="logging.format",
        metavar="FORMAT",
    ),
    Option(
        "otel_exporter",
        "OpenTelemetry traces: none, otlp (OTLP/gRPC, OTEL_EXPORTER_OTLP_* apply) or console; "
        "needs pip install 'snapcoord[otel]'",
        "none",
        _otel_exporter,
        to="tracing.exporter",
        metavar="EXPORTER",
    ),
)


@dataclass(frozen=True)
class Renamed:
    """A setting that no longer exists under its old name. Given under that name (flag, variable or
    file key) it stops the start with a message naming the new one, rather than "unknown"."""

    old: str
    new: str
    version: str
    note: str

    def message(self, given: str, replacement: str) -> str:
        return f"{given} was renamed to {replacement} in snapcoord {self.version}: {self.note}"


#: Old option name -> its rename.
RENAMED: dict[str, Renamed] = {
    r.old: r
    for r in (
        Renamed(
            "snapshot_max_report_size",
            "max_inline_payload",
            "0.3.0",
            "it now caps the checkpoint bytes one ReportTaskSnapshot carries inline (default 4MiB); larger "
            "checkpoints stream with UploadCheckpoint",
        ),
    )
}


def renamed_env(name: str) -> Renamed | None:
    """The rename of environment variable ``name`` (``SNAPCOORD_<OLD>``), if it is an old name."""
    return RENAMED.get(name.removeprefix("SNAPCOORD_").lower()) if name.startswith("SNAPCOORD_") else None


class _RenamedFlag(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        r = RENAMED[self.dest.removeprefix("renamed__")]
        parser.error(r.message("--" + r.old.replace("_", "-"), "--" + r.new.replace("_", "-")))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option to ``parser``; values stay raw strings (validated in ``load``). An
    old flag (``RENAMED``) is accepted by the parser only to be refused naming its new name."""
    for opt in OPTIONS:
        parser.add_argument(
            opt.flag,
            dest=opt.name,
            default=None,
            metavar=opt.metavar,
            help=f"{opt.help} (env {opt.env}; default {opt.shown_default})",
        )
    for old in RENAMED:
        parser.add_argument(
            "--" + old.replace("_", "-"),
            dest="renamed__" + old,
            action=_RenamedFlag,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )


#: Cross-option checks, run after every value parsed.
CHECKS: tuple[NotAbove, ...] = (
    NotAbove("producer_default_ttl", "producer_max_ttl", "raise the maximum or lower the default"),
    NotAbove("snapshot_default_timeout", "snapshot_max_timeout", "raise the maximum or lower the default"),
    NotAbove("lease_min_duration", "lease_max_duration"),
)

#: Options that only make sense with another one: (option, the option it needs).
PAIRS: tuple[tuple[str, str], ...] = (
    ("tls_cert", "tls_key"),
    ("tls_key", "tls_cert"),
    ("tls_client_ca", "tls_cert"),
    ("metrics_tls_cert", "metrics_tls_key"),
    ("metrics_tls_key", "metrics_tls_cert"),
    ("s3_sse_kms_key_id", "s3_sse"),
    ("zk_tls_cert", "zk_tls_key"),
    ("zk_tls_key", "zk_tls_cert"),
)
