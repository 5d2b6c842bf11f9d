"""The coordinator's configuration: built once, at start, from flags and ``SNAPCOORD_*`` variables.

Every setting is declared once, in ``options.OPTIONS``, which names the ``Config`` field(s) it
fills; this module holds the sections those fields live in and ``load``, which fills them. The
sections that the registries consume *are* their domain
policies (``ProducerPolicy``, ``SnapshotPolicy``, ``LeasePolicy``, ``BacklogPolicy``,
``CommitClaimPolicy``), built
here, so nothing copies a value from a config object into a policy.

Precedence is flag, then environment, then the config file (``file``), then default; an empty
environment variable counts as unset (docker-compose writes ``VAR=`` for "no value"). This module
is the only place that reads the environment's settings; everything else gets a frozen ``Config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, cast, get_type_hints
from urllib.parse import urlsplit

from snapcoord.coordinator.config.environment import REVISION, processes_refusal
from snapcoord.coordinator.config.file import ConfigFile
from snapcoord.coordinator.config.options import CHECKS, OPTIONS, PAIRS
from snapcoord.coordinator.config.redaction import redact_uri as redact_uri
from snapcoord.coordinator.domain.backlog import BacklogPolicy
from snapcoord.coordinator.domain.claims import CommitClaimPolicy
from snapcoord.coordinator.domain.leases import LeasePolicy
from snapcoord.coordinator.domain.producers import ProducerPolicy
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.storage.backends import BlobOptions, MetadataOptions
from snapcoord.coordinator.storage.zookeeper import auth as zk_auth
from snapcoord.coordinator.storage.zookeeper.request_size import OPEN_ACL_UNSAFE, AclEntry


class ConfigError(ValueError):
    """A setting has a value the coordinator cannot use; the message names the flag or variable."""


# --- the dataclasses: one per concern, units in field names ------------------------------------


@dataclass(frozen=True)
class GrpcConfig:
    """The gRPC listener and its concurrency bounds."""

    host: str
    #: 0 binds a free port (tests); the bound port is reported on the serving line.
    port: int
    #: Threads that run RPC handlers; calls beyond this queue until one is free.
    max_workers: int
    #: Calls in flight (running or queued) before new ones get RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int
    #: How long SIGTERM waits for in-flight calls before cancelling them.
    shutdown_grace_ms: int
    #: Checkpoint payload bytes all calls together may hold (reports uploading, GetSnapshot reading).
    payload_budget_bytes: int
    #: How long a call waits for room in that budget before RESOURCE_EXHAUSTED.
    payload_budget_wait_ms: int
    #: Processes serving the port together (SO_REUSEPORT), each with its own store sessions;
    #: ``auto``: one per CPU this process may use, resolved at start (``processes.process_count``).
    processes: int | Literal["auto"] = 1
    #: Set in each process of ``processes`` > 1 (not an option): share the port instead of
    #: failing the bind when it is taken.
    reuse_port: bool = False
    #: A second, plaintext listener serving grpc.health.v1 only (-1: none; 0: a free port), for
    #: probes that cannot present a client certificate when the gRPC port requires one.
    health_host: str = "0.0.0.0"
    health_port: int = -1
    #: Keepalive pings closer together than this on a connection sending no data are strikes...
    keepalive_min_ping_interval_ms: int = 30_000
    #: ... and a client past this many strikes gets GOAWAY too_many_pings (0: never).
    keepalive_max_ping_strikes: int = 2


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus HTTP exporter."""

    host: str
    #: 0 binds a free port; -1 disables the exporter.
    port: int
    #: PEM files: with both set the exporter serves HTTPS; "" serves plain HTTP.
    tls_cert: str
    tls_key: str
    #: The source revision ``snapcoord_build_info`` reports: ``SNAPCOORD_REVISION``, set by the
    #: image build (not an option: it describes the build, not how to run it).
    revision: str = "unknown"

    @property
    def enabled(self) -> bool:
        return self.port >= 0


@dataclass(frozen=True, kw_only=True)
class StorageConfig(MetadataOptions, BlobOptions):
    """Where metadata and payloads live, and the backend settings that are not part of a URI.

    The backend settings are the stores' own ``MetadataOptions`` and ``BlobOptions``, declared
    once there and inherited here; the options table fills them like any other field, and those
    it does not fill (retry deadlines, S3 timeouts) keep the stores' defaults (``FIXED``).
    """

    data_dir: str
    metadata_uri: str
    blobs_uri: str
    #: How often health probes the blob store (services that write payloads follow it).
    blob_probe_interval_ms: int

    def metadata_options(self) -> MetadataOptions:
        return MetadataOptions(**{f.name: getattr(self, f.name) for f in fields(MetadataOptions)})

    def blob_options(self) -> BlobOptions:
        return BlobOptions(**{f.name: getattr(self, f.name) for f in fields(BlobOptions)})


@dataclass(frozen=True)
class SecurityConfig:
    """TLS on the gRPC port and access control; every path "" when unset."""

    tls_cert: str
    tls_key: str
    #: When set, clients must present a certificate signed by this CA (mutual TLS).
    tls_client_ca: str
    #: Principals, credentials, roles and scopes (``auth.authfile``); re-read when it changes.
    auth_file: str

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def authenticates(self) -> bool:
        return bool(self.auth_file or self.tls_client_ca)


@dataclass(frozen=True)
class JanitorConfig:
    """The leader-elected cleanup loop."""

    #: Time between passes; 0 disables the janitor on this replica.
    cleanup_interval_ms: int
    #: Unreferenced payload objects younger than this are left alone (an upload may be in flight).
    orphan_grace_ms: int
    #: The orphan sweep (over upload intents) runs at most this often, not every pass.
    orphan_sweep_interval_ms: int
    #: The listing sweep (every payload object, for objects written before upload intents
    #: existed) runs at most this often; 0 = never.
    orphan_listing_interval_ms: int
    #: Most deletions per step of one pass, so one pass never runs away.
    batch: int

    @property
    def enabled(self) -> bool:
        return self.cleanup_interval_ms > 0


@dataclass(frozen=True)
class LoggingConfig:
    level: str
    #: ``json`` (one object per line), ``text``, or ``auto``: json unless stderr is a terminal.
    format: Literal["auto", "json", "text"]


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry tracing; the ``OTEL_*`` variables (endpoint, sampler, service name) are read
    by the OpenTelemetry SDK itself, as everywhere else."""

    #: ``none`` (tracing off), ``otlp`` (OTLP over gRPC) or ``console`` (spans printed to stdout).
    exporter: Literal["none", "otlp", "console"]

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"


@dataclass(frozen=True)
class Config:
    """The effective configuration of one coordinator process.

    The five policies are handed as they are to the registries that enforce them.
    """

    grpc: GrpcConfig
    security: SecurityConfig
    metrics: MetricsConfig
    storage: StorageConfig
    producers: ProducerPolicy
    snapshots: SnapshotPolicy
    leases: LeasePolicy
    backlog: BacklogPolicy
    claims: CommitClaimPolicy
    janitor: JanitorConfig
    logging: LoggingConfig
    tracing: TracingConfig

    def describe(self) -> dict[str, dict[str, Any]]:
        """The configuration as plain data, safe to log: credentials in URIs are redacted."""
        out = asdict(self)
        storage = out["storage"]
        storage["metadata_uri"] = redact_uri(storage["metadata_uri"])
        storage["blobs_uri"] = redact_uri(storage["blobs_uri"])
        return cast(dict[str, dict[str, Any]], out)


def hostport(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``_host`` takes them off a bind host)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: Policy fields that no option sets: fixed limits, at their dataclass default. Listed so that the
#: table's completeness test tells a forgotten option from a deliberate constant.
FIXED: frozenset[tuple[str, str]] = frozenset(
    {
        ("snapshots", "max_ttl_ms"),  # the longest TTL a snapshot or a retention policy may ask for
        ("snapshots", "max_offsets_per_task"),
        ("grpc", "reuse_port"),  # set by --processes in each worker process, never by an operator
        ("metrics", "revision"),  # SNAPCOORD_REVISION, from the build
        # Backend settings without an option: the stores' own defaults.
        ("storage", "zk_retry_deadline_ms"),
        ("storage", "s3_connect_timeout_ms"),
        ("storage", "s3_read_timeout_ms"),
        ("storage", "s3_max_attempts"),
    }
)


def sections() -> dict[str, type[Any]]:
    """``Config``'s sections: attribute name -> the dataclass it holds."""
    hints = get_type_hints(Config)
    return {f.name: hints[f.name] for f in fields(Config)}


@dataclass(frozen=True)
class Setting:
    """One option's effective value and where it came from (``check-config`` prints these)."""

    #: The option's name in ``OPTIONS``.
    name: str
    #: ``flag``, ``environment``, ``file``, ``default`` or ``derived`` (from other options).
    origin: Literal["flag", "environment", "file", "default", "derived"]
    #: The value as given (for ``derived``: the value computed), shown through the option's redaction.
    shown: str


@dataclass(frozen=True)
class Resolved:
    """A configuration and where each of its settings came from."""

    config: Config
    settings: tuple[Setting, ...]


def load(
    flags: Mapping[str, str | None], environ: Mapping[str, str], file: ConfigFile | None = None
) -> Config:
    """Build the config from raw flag values (None = not given), the environment and the config
    file's values, in that precedence, then the defaults.

    Raises ``ConfigError`` naming where the bad value came from; the CLI turns it into exit code 2.
    """
    return resolve(flags, environ, file).config


def resolve(
    flags: Mapping[str, str | None], environ: Mapping[str, str], file: ConfigFile | None = None
) -> Resolved:
    """``load``, keeping where each setting came from."""
    values: dict[str, Any] = {}
    shown: list[Setting] = []
    file_values = file.values if file is not None else {}
    for opt in OPTIONS:
        flag_value = flags.get(opt.name)
        env_value = environ.get(opt.env) or None
        file_value = file_values.get(opt.name)
        origin: Literal["flag", "environment", "file", "default"]
        if flag_value is not None:
            raw, origin, source = flag_value, "flag", f"{opt.flag}={flag_value!r}"
        elif env_value is not None:
            raw, origin = env_value, "environment"
            source = f"{opt.env}={env_value!r} (environment; {opt.flag} overrides it)"
        elif file is not None and file_value is not None:
            raw, origin = file_value, "file"
            key = opt.flag.removeprefix("--")
            source = f"{key}: {file_value!r} in {file.path} ({opt.flag} and {opt.env} override it)"
        elif opt.default is not None:
            raw, origin, source = opt.default, "default", f"default of {opt.flag}"
        else:
            continue  # derived below, from the values parsed here
        try:
            values[opt.name] = opt.parse(raw)
        except ValueError as e:
            raise ConfigError(f"invalid {source}: {e}") from None
        shown.append(Setting(opt.name, origin, opt.redact(raw)))
    for opt in OPTIONS:
        if opt.name not in values:
            if opt.derive is None:
                raise AssertionError(f"option {opt.name} has neither a default nor a derive")
            values[opt.name] = opt.derive(values)
            shown.append(Setting(opt.name, "derived", opt.redact(str(values[opt.name]))))

    by_name = {opt.name: opt for opt in OPTIONS}
    for needs, needed in PAIRS:
        if values[needs] and not values[needed]:
            raise ConfigError(f"{by_name[needs].flag} needs {by_name[needed].flag}")
    for check in CHECKS:
        low, high = values[check.low], values[check.high]
        if low > high:
            advice = f": {check.advice}" if check.advice else ""
            raise ConfigError(
                f"{by_name[check.low].flag} ({low} ms) exceeds {by_name[check.high].flag} ({high} ms){advice}"
            )

    refused = processes_refusal(values["processes"], values["metadata"])
    if refused is not None:
        raise ConfigError(refused)

    fed: dict[str, dict[str, Any]] = {name: {} for name in sections()}
    for opt in OPTIONS:
        for section, name in opt.targets:
            fed[section][name] = values[opt.name]
    fed["metrics"]["revision"] = environ.get(REVISION) or "unknown"
    cfg = Config(**{section: cls(**fed[section]) for section, cls in sections().items()})
    zk_create_acl(cfg.storage)
    order = {opt.name: i for i, opt in enumerate(OPTIONS)}
    return Resolved(cfg, tuple(sorted(shown, key=lambda s: order[s.name])))


def zk_create_acl(storage: StorageConfig) -> tuple[AclEntry, ...]:
    """The ACL the metadata store will send with every create: the digest ACL of the
    ``--zk-auth-file`` user (a zk:// store only: no other reads the file), else ZooKeeper's open
    ACL. Its size depends on the user name, so the request-size check needs it; ``load`` calls it
    so that a file that cannot be used is a config error at start, not a failure at connect."""
    if not storage.zk_auth_file or urlsplit(storage.metadata_uri).scheme != "zk":
        return OPEN_ACL_UNSAFE
    try:
        user, password = zk_auth.read_credentials(storage.zk_auth_file)
    except ValueError as e:
        raise ConfigError(f"invalid --zk-auth-file: {e}") from None
    return (zk_auth.digest_acl(user, password),)
