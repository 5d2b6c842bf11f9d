"""deploy/: the Kubernetes manifests, the Prometheus rules and the Grafana dashboard are true to the code.

The manifests are rendered with ``kubectl kustomize`` and validated against the Kubernetes schemas
that kubernetes-validate ships (offline); every ``SNAPCOORD_*`` name they set must be an option of
the coordinator (read from ``options.OPTIONS``), and every value must load. The rules pass
``promtool check rules`` and their unit tests, are generated from their one source, and every
metric name used by the rules and the dashboard is one a live coordinator (real ZooKeeper and S3)
exports (tests/coordinator/observability/test_prometheus_live.py evaluates them on a real
Prometheus). A missing tool fails the run: ``scripts/install-test-deps`` installs kubectl,
kubernetes-validate and promtool.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from harness.coordinator import SERVING_LINE_RE, CoordinatorProcess, snapcoord_command, split_hostport
from harness.process import ManagedProcess, wait_until
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient, NotFound, Offset, SnapshotRef, TaskSnapshot
from snapcoord.coordinator import api
from snapcoord.coordinator.config import options, settings
from snapcoord.coordinator.observability.logging_setup import serving_message
from snapcoord.coordinator.server.memory_bounds import check_memory_bounds, memory_bounds
from snapcoord.coordinator.transport.health import LIVENESS_SERVICE

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE_DIRS = (
    "deploy/kubernetes/base",
    "deploy/kubernetes/overlays/example",
    "deploy/kubernetes/overlays/mtls",
)
RULES = ROOT / "deploy" / "prometheus" / "snapcoord.rules.yml"
PROMETHEUS_RULE = ROOT / "deploy" / "kubernetes" / "components" / "prometheusrule" / "prometheusrule.yaml"
METRICS_DOC = ROOT / "docs" / "operations" / "metrics.md"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "snapcoord.rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "snapcoord.json"
DOCKERFILE = (ROOT / "Dockerfile").read_text()
#: Kubernetes versions the manifests are valid for: 1.27, where gRPC probes became GA, and the
#: newest whose schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
#: Variables boto3 reads from its standard chain; everything else must be a coordinator option.
BOTO3_CHAIN_VARS = {
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
}
#: Series Prometheus makes itself rather than scraping them from the coordinator.
PROMETHEUS_SYNTHETIC = {"up"}
#: What every directory renders; the overlays add the optional components and the example's keys.
BASE_KINDS = ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "Service", "ServiceAccount"]
OVERLAY_KINDS = ["NetworkPolicy", "PrometheusRule", "Secret", "ServiceMonitor"]
OPTION_ENVS = {opt.env for opt in options.OPTIONS}
DEFAULTS = {opt.name: opt.default for opt in options.OPTIONS}


def tool(name: str) -> str:
    """The tool next to this interpreter (the venv's bin), else on PATH; a missing one fails."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/install-test-deps")
    return found


def render(directory: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [tool("kubectl"), "kustomize", str(ROOT / directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module", params=KUSTOMIZE_DIRS)
def manifests(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c


def coordinator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The environment the coordinator container gets: its ConfigMap, Secret and env entries."""
    c = container(docs)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
        if "secretRef" in source:
            name = source["secretRef"]["name"]
            if source["secretRef"].get("optional") and not secrets(docs, name):
                continue  # workload identity: no keys at all
            env.update(secret_data(one(docs, "Secret", name)))
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return env


def secrets(docs: list[dict[str, Any]], name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "Secret" and (name is None or d["metadata"]["name"] == name)]


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity in binary units (``768Mi``, ``1Gi``) as bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert m, f"use binary units for memory: {quantity}"
    return int(m[1]) * {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[m[2]]


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- Kubernetes --------------------------------------------------------------------------------


@pytest.mark.process
def test_every_manifest_is_valid_for_kubernetes(manifests: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in manifests)
    assert kinds in (sorted(BASE_KINDS), sorted(BASE_KINDS + OVERLAY_KINDS))
    for doc in manifests:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            # CRDs of the Prometheus Operator: not in the Kubernetes schemas kubernetes-validate
            # ships; the ServiceMonitor and PrometheusRule tests below check them instead.
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError


@pytest.mark.process
def test_base_needs_no_operator_and_ships_no_credentials() -> None:
    docs = render("deploy/kubernetes/base")
    assert sorted(d["kind"] for d in docs) == sorted(BASE_KINDS)
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert not secrets(docs)
    env = coordinator_env(docs)
    assert not {k for k in env if k.startswith("AWS_")}, "no credentials in the base"
    # botocore reads environment keys before web identity: the base must leave both to the overlay.
    (ref,) = [s["secretRef"] for s in container(docs)["envFrom"] if "secretRef" in s]
    assert ref["optional"] is True


@pytest.mark.process
def test_memory_limit_covers_the_payload_budget_and_headroom(manifests: list[dict[str, Any]]) -> None:
    deployment = one(manifests, "Deployment")
    cfg = settings.load({}, coordinator_env(manifests))
    budget = cfg.grpc.payload_budget_bytes
    headroom = quantity_bytes(deployment["metadata"]["annotations"]["snapcoord.io/memory-headroom"])
    resources = container(manifests)["resources"]
    limit = quantity_bytes(resources["limits"]["memory"])
    assert limit >= budget + headroom, (limit, budget, headroom)
    # The headroom is the coordinator's own derivation from these settings (memory_bounds).
    bounds = memory_bounds(cfg)
    assert headroom == bounds.headroom_bytes, (headroom, bounds.lines())
    assert limit >= bounds.worst_case_bytes, bounds.lines()
    check_memory_bounds(cfg)
    # Set here, not left at the default (1 GiB, more than the limit leaves room for).
    assert budget < settings.load({}, {}).grpc.payload_budget_bytes
    assert quantity_bytes(resources["requests"]["memory"]) <= limit
    # The comment that explains the sizing states the same numbers.
    text = (ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text()
    sizing = text.split("MEMORY SIZING", 1)[1].split("env:", 1)[0]
    for what, value in (("payload budget", budget), ("headroom", headroom), ("memory limit", limit)):
        assert re.search(rf"{what}\s+{value // 2**20}Mi\b", sizing), f"MEMORY SIZING states another {what}"


def _overlay(name: str = "example") -> list[dict[str, Any]]:
    return render(f"deploy/kubernetes/overlays/{name}")


@pytest.mark.process
def test_network_policy_lets_clients_and_prometheus_in_and_stores_and_dns_out() -> None:
    docs = _overlay()
    policy = one(docs, "NetworkPolicy")["spec"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["podSelector"]["matchLabels"], pod_labels)
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    ingress_ports = [p["port"] for rule in policy["ingress"] for p in rule["ports"]]
    assert sorted(ingress_ports) == ["grpc", "metrics"], "in: clients (gRPC) and Prometheus only"
    assert set(ingress_ports) <= set(ports)
    egress = {(p["port"], p.get("protocol", "TCP")) for rule in policy["egress"] for p in rule["ports"]}
    cfg = settings.load({}, coordinator_env(docs))
    zk_ports = {int(h.rsplit(":", 1)[1]) for h in cfg.storage.metadata_uri[5:].split("/", 1)[0].split(",")}
    assert {(port, "TCP") for port in zk_ports} <= egress, "out: ZooKeeper"
    assert (443, "TCP") in egress, "out: S3 over HTTPS"
    assert {(53, "UDP"), (53, "TCP")} <= egress, "out: DNS"
    assert len(egress) == len(zk_ports) + 3, f"nothing else goes out: {sorted(egress)}"


@pytest.mark.process
def test_prometheus_rule_carries_the_rules_file() -> None:
    docs = _overlay()
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert rule["metadata"]["namespace"] == one(docs, "Deployment")["metadata"]["namespace"]


@pytest.mark.process
def test_generated_rules_are_in_sync_with_their_source() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-rules"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (
        "deploy/prometheus/snapcoord.rules.yml or the PrometheusRule is stale: run scripts/gen-rules\n"
        + done.stdout[-4000:]
        + done.stderr[-4000:]
    )


@pytest.mark.process
def test_service_monitor_scrapes_the_metrics_port() -> None:
    manifests = _overlay()
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    services = [d for d in manifests if d["kind"] == "Service"]
    scraped = [
        s for s in services if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in scraped] == ["snapcoord"], "scrape each replica once"
    (port,) = [p for p in scraped[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    (container_port,) = [p for p in container(manifests)["ports"] if p["name"] == port["targetPort"]]
    assert container_port["containerPort"] == int(coordinator_env(manifests)["SNAPCOORD_METRICS_PORT"])


@pytest.mark.process
def test_every_setting_is_a_coordinator_option_and_loads(manifests: list[dict[str, Any]]) -> None:
    env = coordinator_env(manifests)
    assert env, "the coordinator gets no settings"
    for name in env:
        assert name in OPTION_ENVS or name in BOTO3_CHAIN_VARS, (
            f"the manifests set {name}, which nothing reads"
        )
    cfg = settings.load({}, env)  # raises ConfigError on a value the coordinator rejects
    assert cfg.storage.metadata_uri.startswith("zk://")
    assert cfg.storage.blobs_uri.startswith("s3://")
    # Generated names carry a content hash: a changed setting or key is a new pod template.
    for doc in [one(manifests, "ConfigMap"), *secrets(manifests)]:
        assert re.fullmatch(r"snapcoord(-s3)?-[a-z0-9]{10}", doc["metadata"]["name"]), doc["kind"]
    # Service links would put SNAPCOORD_PORT=tcp://... (from the Service "snapcoord") into the pod.
    assert one(manifests, "Deployment")["spec"]["template"]["spec"]["enableServiceLinks"] is False


@pytest.mark.process
def test_example_secrets_are_marked_as_examples(manifests: list[dict[str, Any]]) -> None:
    for secret in secrets(manifests):
        values = secret_data(secret)
        assert values and all(value.startswith("EXAMPLE") for value in values.values())


@pytest.mark.process
def test_ports_probes_and_graceful_shutdown(manifests: list[dict[str, Any]]) -> None:
    env = coordinator_env(manifests)
    cfg = settings.load({}, env)
    c = container(manifests)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": cfg.grpc.port, "metrics": cfg.metrics.port, "health": cfg.grpc.health_port}
    assert cfg.grpc.health_port > 0 and cfg.grpc.health_port != cfg.grpc.port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc_probe = c[probe]["grpc"]  # Kubernetes' native gRPC probe: grpc.health.v1.Health/Check
        # The plaintext health-only port: the probe needs no client certificate, TLS or not.
        assert grpc_probe["port"] == cfg.grpc.health_port, probe
        assert grpc_probe.get("service", "") in {"", *api.SERVICE_NAMES, LIVENESS_SERVICE}, probe
    # Liveness must not follow ZooKeeper: restarting replicas does not bring a lost quorum back.
    assert c["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    # Probes only: no Service sends clients to the health port.
    for service in (d for d in manifests if d["kind"] == "Service"):
        assert "health" not in {p["targetPort"] for p in service["spec"]["ports"]}
        assert cfg.grpc.health_port not in {p["port"] for p in service["spec"]["ports"]}
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    sleep, seconds = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == "sleep"
    pre_stop_s = int(seconds)
    # SIGTERM comes after the preStop hook; then calls in flight get --shutdown-grace.
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + cfg.grpc.shutdown_grace_ms / 1000
    assert options.parse_duration_ms(str(DEFAULTS["shutdown_grace"])) <= cfg.grpc.shutdown_grace_ms


@pytest.mark.process
def test_mtls_overlay_requires_client_certificates_from_the_mounted_secret() -> None:
    docs = render("deploy/kubernetes/overlays/mtls")
    cfg = settings.load({}, coordinator_env(docs))
    assert cfg.security.tls_cert and cfg.security.tls_key and cfg.security.tls_client_ca
    c = container(docs)
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "tls"]
    for path in (cfg.security.tls_cert, cfg.security.tls_key, cfg.security.tls_client_ca):
        assert Path(path).parent == Path(mount["mountPath"]), path
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    # Group-readable for the pod's fsGroup: the image's user is not the files' owner.
    assert volumes["tls"]["secret"]["defaultMode"] & 0o040
    # Everything else as in the example overlay, probes included (they need no certificate).
    example = container(render("deploy/kubernetes/overlays/example"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe] == example[probe]


@pytest.mark.process
def test_runs_non_root_on_a_read_only_root_filesystem(manifests: list[dict[str, Any]]) -> None:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    uid = int(re.search(r"useradd .*--uid (\d+)", DOCKERFILE)[1])  # type: ignore[index]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid == 10001
    c = container(manifests)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Writable: /tmp and the data directory, both emptyDir; anything else is a read-only Secret.
    writable = {m["mountPath"] for m in c["volumeMounts"] if "emptyDir" in volumes[m["name"]]}
    data_dir = re.search(r"SNAPCOORD_DATA_DIR=(\S+)", DOCKERFILE)[1]  # type: ignore[index]
    assert writable == {"/tmp", data_dir}
    for mount in c["volumeMounts"]:
        if mount["mountPath"] not in writable:
            assert "secret" in volumes[mount["name"]] and mount["readOnly"] is True, mount


@pytest.mark.process
def test_replicas_spread_services_and_disruption_budget(manifests: list[dict[str, Any]]) -> None:
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    affinity = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], pod_labels)
    pdb = one(manifests, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["maxUnavailable"] == 1
    headless = one(manifests, "Service", "snapcoord-headless")["spec"]
    cluster = one(manifests, "Service", "snapcoord")["spec"]
    assert headless["clusterIP"] == "None" and cluster["type"] == "ClusterIP"
    for spec in (headless, cluster):
        assert selects(spec["selector"], pod_labels)
    assert {p["name"] for p in cluster["ports"]} == {"grpc", "metrics"}
    # The image tag is the coordinator's version (the Dockerfile builds it).
    version = tomllib.loads((ROOT / "coordinator" / "pyproject.toml").read_text())["project"]["version"]
    image = container(manifests)["image"]
    assert image.rpartition("/")[2] == f"snapcoord:{version}", image
    resources = container(manifests)["resources"]
    assert resources["requests"]["memory"] and resources["limits"]["memory"]


# --- the image ---------------------------------------------------------------------------------

BUILD_LOCK = ROOT / "deploy" / "build-requirements.lock"


def _dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", DOCKERFILE, flags=re.MULTILINE))


def _expand(text: str, args: dict[str, str]) -> str:
    """Docker's substitution of ``${VAR}`` and ``${VAR:+word}`` (the forms the Dockerfile uses)."""

    def one_var(m: re.Match[str]) -> str:
        value = args.get(m[1], "")
        if m[2] is None:
            return value
        return m[3] if value else ""

    return re.sub(r"\$\{(\w+)(:\+([^}]*))?\}", one_var, text)


def test_image_base_can_be_pinned_by_digest() -> None:
    args = _dockerfile_args()
    # No digest is committed unverified: empty, or a full sha256 digest.
    assert re.fullmatch(r"(sha256:[0-9a-f]{64})?", args["PYTHON_IMAGE_DIGEST"])
    bases = re.findall(r"^FROM (\S+) AS \w+$", DOCKERFILE, flags=re.MULTILINE)
    assert len(bases) == 2 and len(set(bases)) == 1, "both stages build on the same base"
    (base,) = set(bases)
    assert _expand(base, {**args, "PYTHON_IMAGE_DIGEST": ""}) == args["PYTHON_IMAGE"]
    digest = "sha256:" + "0123456789abcdef" * 4
    assert _expand(base, {**args, "PYTHON_IMAGE_DIGEST": digest}) == f"{args['PYTHON_IMAGE']}@{digest}"
    assert "--build-arg PYTHON_IMAGE_DIGEST=sha256:" in DOCKERFILE, "the Dockerfile says how to pin it"


def test_image_serves_its_build_revision() -> None:
    """``snapcoord_build_info{revision}`` reads SNAPCOORD_REVISION: the runtime stage sets it from a
    build argument, and the server knows the variable (an unknown one would stop it)."""
    from snapcoord.coordinator.config.environment import known_variables

    runtime = DOCKERFILE.partition(" AS runtime\n")[2]
    assert re.search(r"^ARG SNAPCOORD_REVISION=unknown$", runtime, flags=re.MULTILINE)
    assert re.search(r"^ENV SNAPCOORD_REVISION=\$\{SNAPCOORD_REVISION\}", runtime, flags=re.MULTILINE)
    assert "--build-arg SNAPCOORD_REVISION=" in DOCKERFILE, "the Dockerfile says how to set it"
    assert "SNAPCOORD_REVISION" in known_variables()


def test_build_backend_is_locked_and_satisfies_both_projects() -> None:
    from packaging.requirements import Requirement

    locked: dict[str, str] = {}
    for line in BUILD_LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(r"([a-z0-9-]+)==(\S+) --hash=sha256:[0-9a-f]{64}", line)
            assert m, f"pin each build package with its hash: {line}"
            locked[m[1]] = m[2]
    for project in ("client", "coordinator"):
        pyproject = tomllib.loads((ROOT / project / "pyproject.toml").read_text())
        for text in pyproject["build-system"]["requires"]:
            req = Requirement(text)
            assert req.name in locked, f"{project}: {req.name} is not in {BUILD_LOCK.name}"
            assert req.specifier.contains(locked[req.name]), f"{project}: {text} vs {locked[req.name]}"
    # The wheels are built by that backend only: no isolated build that would fetch another.
    assert "-r deploy/build-requirements.lock" in DOCKERFILE and "--require-hashes" in DOCKERFILE
    (wheel_build,) = re.findall(r"pip wheel [^&\n]*", DOCKERFILE)
    assert "--no-build-isolation" in wheel_build and wheel_build.startswith("pip wheel")
    assert "/opt/build/bin/pip wheel" in DOCKERFILE


def test_healthcheck_asks_the_configured_port() -> None:
    healthcheck = re.sub(r"\\\n\s*", " ", DOCKERFILE.split("\nHEALTHCHECK ", 1)[1]).splitlines()[0]
    command = json.loads(healthcheck.split("CMD", 1)[1])
    # `snapcoord health` without --target asks 127.0.0.1:$SNAPCOORD_PORT (tests/test_compose.py
    # runs it against a coordinator on another port).
    assert command == ["snapcoord", "health"]


# --- Prometheus rules --------------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


@pytest.mark.process
def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


@pytest.mark.process
def test_promtool_unit_tests_cover_every_alert() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]  # a case where the alert must fire, not only one where it must not
    }
    assert firing == {rule["alert"] for rule in _rules() if "alert" in rule}
    done = subprocess.run(
        [tool("promtool"), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_janitor_alert_waits_two_passes_at_the_default_interval() -> None:
    (rule,) = [r for r in _rules() if r.get("alert") == "SnapcoordNoJanitorLeader"]
    interval_ms = options.parse_duration_ms(str(DEFAULTS["cleanup_interval"]))
    assert options.parse_duration_ms(rule["for"]) == 2 * interval_ms


# --- metric names ------------------------------------------------------------------------------

#: PromQL keywords, and aggregations (which may be followed by ``by (...)`` rather than by ``(``).
_NOT_METRICS = {
    *(
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    ),
    *("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"),
    *("bottomk", "topk", "quantile"),
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords and labels left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[m.end() :].lstrip().startswith("(") or m.group() in _NOT_METRICS:
            continue  # a function or aggregation, or a keyword
        names.add(m.group())
    return names


def test_metric_names_extraction() -> None:
    assert metric_names(
        'sum by (le, grpc_method) (rate(a_bucket{job="x",grpc_code=~"A|B"}[5m])) / on() '
        "(max(b) or on() vector(0)) > bool 0.5 and c"
    ) == {"a_bucket", "b", "c"}


_SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


def _all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in panels:
        yield panel
        yield from _all_panels(panel.get("panels", []))


def _dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for panel in _all_panels(panels) for t in panel.get("targets", [])]


def _recorded() -> set[str]:
    return {rule["record"] for rule in _rules() if "record" in rule}


#: Variables Grafana itself defines for every query.
_GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"}


def test_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "snapcoord" and dashboard["schemaVersion"] >= 36
    variables = dashboard["templating"]["list"]
    (variable,) = variables
    assert variable == {**variable, "name": "datasource", "type": "datasource", "query": "prometheus"}
    panels = list(_all_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    defined = {v["name"] for v in variables} | _GRAFANA_BUILTINS
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]
        for target in [panel, *panel["targets"]]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        text = json.dumps(panel)
        used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", text)) | set(re.findall(r"\[\[(\w+)", text))
        assert used <= defined, f"{panel['title']} uses undefined variables {sorted(used - defined)}"


def test_dashboard_queries_use_recorded_series_that_a_rule_records() -> None:
    used = {name for expr in _dashboard_exprs() for name in metric_names(expr) if ":" in name}
    used |= {name for rule in _rules() for name in metric_names(rule["expr"]) if ":" in name}
    assert used, "the dashboard reads no recorded series"
    assert used <= _recorded(), f"no rule records {sorted(used - _recorded())}"


def _documented_metrics() -> dict[str, tuple[str, set[str]]]:
    """The metrics reference table: name -> (type, labels)."""
    table = METRICS_DOC.read_text().split("## Metrics reference", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        m = re.fullmatch(r"\| `(\w+)` \| (\w+) \|([^|]*)\| .+ \|", line)
        if m:
            rows[m[1]] = (m[2], set(re.findall(r"`(\w+)`", m[3])))
    return rows


@pytest.mark.timeout(180)
def test_rules_dashboard_and_probes_use_what_a_live_coordinator_serves(
    tmp_path: Path, zk_uri: str, s3_server: SeaweedS3Server, s3_uri: str
) -> None:
    env = {"SNAPCOORD_METADATA": zk_uri, "SNAPCOORD_BLOBS": s3_uri, **s3_server.env()}
    # A short janitor interval so that its step metrics exist by the time we scrape; the health
    # port on, as in the manifests.
    args = ["--cleanup-interval", "1s", "--health-port", "0"]
    with CoordinatorProcess(tmp_path / "coordinator", env=env, args=args) as coordinator:
        with CoordinatorClient(coordinator.target, timeout_s=30) as client:
            client.register_producer_offsets("sink", [Offset("orders", 0, 1)])
            with pytest.raises(NotFound):
                client.get_producer_offsets("no-such-sink")
            snapshot = client.create_snapshot("app", ["t"])
            client.report_task_snapshot(
                "app", snapshot.generation, TaskSnapshot("t", (Offset("s", 0, 1),), {})
            )
            with client.lease("restore", [SnapshotRef("app", snapshot.generation)], duration_s=60):
                pass
            client.mark_backlog("job", [Offset("orders", 0, 10)])
            client.report_progress("job", [Offset("orders", 0, 10)])
        # The names the manifests' probes ask for are ones the health service answers SERVING.
        probed = {
            c[p]["grpc"].get("service", "")
            for c in [container(render(KUSTOMIZE_DIRS[0]))]
            for p in ("startupProbe", "readinessProbe", "livenessProbe")
        }
        assert coordinator.health_port is not None
        with grpc.insecure_channel(f"127.0.0.1:{coordinator.health_port}") as channel:
            for service in probed:  # where the probes ask: the health port
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=30
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, service

        def scrape() -> tuple[set[str], dict[str, tuple[str, set[str] | None]]] | None:
            with urllib.request.urlopen(coordinator.metrics_url, timeout=10) as reply:
                text = reply.read().decode()
            names = set()
            families: dict[str, tuple[str, set[str] | None]] = {}
            for family in text_string_to_metric_families(text):
                names |= {sample.name for sample in family.samples}
                # A labelled metric no call has touched yet has HELP and TYPE but no samples.
                names |= {family.name + suffix for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",))}
                name = family.name + ("_total" if family.type == "counter" else "")
                labels = {k for sample in family.samples for k in sample.labels} - {"le"}
                families[name] = (family.type, labels if family.samples else None)
            return (names, families) if "snapcoord_janitor_passes_total" in names else None

        exported, families = wait_until(scrape, timeout=60, interval=0.5, what="janitor step metrics")
    used = {name for rule in _rules() for name in metric_names(rule["expr"])}
    used |= {name for expr in _dashboard_exprs() for name in metric_names(expr)}
    used -= _recorded()  # made by the rules themselves
    assert used - PROMETHEUS_SYNTHETIC, "no metric names found in the rules and dashboard"
    missing = sorted(used - exported - PROMETHEUS_SYNTHETIC)
    assert not missing, f"the rules or the dashboard use metrics the coordinator does not export: {missing}"
    # The metrics reference lists exactly the coordinator's own series, with their types and labels.
    documented = _documented_metrics()
    own = {name: f for name, f in families.items() if name.startswith(("snapcoord_", "grpc_server_"))}
    undocumented, gone = sorted(set(own) - set(documented)), sorted(set(documented) - set(own))
    assert not undocumented and not gone, f"docs/operations/metrics.md: missing {undocumented}, extra {gone}"
    for name, (kind, labels) in own.items():
        assert documented[name][0] == kind, name
        if labels is not None:  # labels show on samples only
            assert documented[name][1] == labels, name


# --- the pod's filesystem: read-only root, uid 10001, writable /tmp and data directory -----------

# Runs inside `unshare --mount` (a private mount namespace: nothing here is visible outside):
# every mount but the kernel's pseudo filesystems becomes read-only, then /tmp alone is made
# writable again (the pod's emptyDir; bound onto itself rather than replaced, so that a venv or
# checkout under /tmp stays visible), and the coordinator runs as the image's uid, its data
# directory and working directory under /tmp.
_READ_ONLY_POD = r"""
set -eu
for mountpoint in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
  case "$mountpoint" in /proc*|/sys*|/dev*) continue ;; esac
  mount -o remount,bind,ro "$mountpoint"
done
if touch "$PROBE" 2>/dev/null; then echo "the root filesystem is still writable" >&2; exit 99; fi
mount --bind /tmp /tmp
cd "$DATA"
exec setpriv --reuid "$UID_GID" --regid "$UID_GID" --clear-groups -- "$@"
"""


@pytest.mark.timeout(180)
def test_coordinator_serves_as_uid_10001_on_a_read_only_root_filesystem(
    tmp_path: Path, zk_uri: str, s3_server: SeaweedS3Server, s3_uri: str
) -> None:
    if os.geteuid() != 0:
        pytest.fail("building the read-only mount namespace needs root (unshare --mount)")
    docs = render(KUSTOMIZE_DIRS[0])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    uid = pod["securityContext"]["runAsUser"]
    assert {m["mountPath"] for m in container(docs)["volumeMounts"]} >= {"/tmp"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCOORD_")}
    env.update(s3_server.env())
    # Not tmp_path: pytest's base directory is private to root. Removed in `finally`.
    data = Path(tempfile.mkdtemp(prefix="snapcoord-read-only-", dir="/tmp"))
    os.chown(data, uid, uid)
    # What the image sets (PYTHONDONTWRITEBYTECODE) and what the pod's user has (HOME = data dir).
    env.update(
        {
            "SNAPCOORD_METADATA": zk_uri,
            "SNAPCOORD_BLOBS": s3_uri,
            "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": str(data),
            "DATA": str(data),
            "UID_GID": str(uid),
            "PROBE": str(tmp_path / "written-through-the-read-only-root"),
        }
    )
    argv = [*snapcoord_command(), "serve", "--port", "0", "--metrics-port", "0", "--data-dir", str(data)]
    proc = ManagedProcess(
        [
            tool("unshare"),
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            _READ_ONLY_POD,
            "pod",
            *argv,
        ],
        log_path=tmp_path / "coordinator.log",
        cwd=tmp_path,
        env=env,
        name="snapcoord (read-only root)",
    )
    try:

        def serving_line() -> str | None:
            assert proc.alive(), proc.output()
            lines = proc.output().splitlines()  # a JSON log (stderr is no terminal): a JSON object
            return next((line for line in lines if SERVING_LINE_RE.match(serving_message(line))), None)

        line = wait_until(serving_line, timeout=60, interval=0.1, what="the serving line")
        m = SERVING_LINE_RE.match(serving_message(line))
        assert m is not None
        target = f"127.0.0.1:{split_hostport(m['grpc'])[1]}"
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{uid}\s+{uid}\s+{uid}\s+{uid}$", status, re.MULTILINE), status
        with CoordinatorClient(target, timeout_s=30) as client:
            client.register_producer_offsets("sink", [Offset("orders", 0, 1)])
            snapshot = client.create_snapshot("app", ["t"])
            report = TaskSnapshot("t", (Offset("s", 0, 1),), {"state": b"x" * (4 << 20)})
            done = client.report_task_snapshot("app", snapshot.generation, report)
            assert done.state.name == "COMPLETED"
            restored = client.get_snapshot("app", snapshot.generation, include_checkpoints=True)
            assert restored.tasks[0].checkpoints == {"state": b"x" * (4 << 20)}
        # One SIGTERM, as the kubelet sends (a second one arriving after the drain restored the
        # default handlers would end the process with -15 on a slow machine).
        assert proc.terminate(timeout=60) == 0, proc.output()
        assert "Traceback" not in proc.output(), proc.output()
    finally:
        proc.kill()
        shutil.rmtree(data)
