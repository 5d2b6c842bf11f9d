"""A real Prometheus (Debian package ``prometheus``) on 127.0.0.1: scrapes test targets, evaluates rules.

The binary is taken from the package into the venv by ``scripts/install-test-deps`` (installing the package
would also start a Prometheus service on :9090). The server gets a fresh data directory, one scrape job and
the given rule files, and answers PromQL over its HTTP API (``query``), as Grafana and Alertmanager would
see it (``rules``, ``alerts``).
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.ports import LOOPBACK, free_port
from harness.process import ManagedProcess, ServerProcess, ServerStartError, wait_until

INSTALL_HINT = "run scripts/install-test-deps (it extracts prometheus from Debian's package into the venv)"


class PromQLError(AssertionError):
    """Prometheus refused a query: the expression does not parse or cannot be evaluated."""


def prometheus_binary() -> Path:
    """The ``prometheus`` next to this interpreter (the venv's bin), else on PATH."""
    local = Path(sys.executable).parent / "prometheus"
    if local.exists():
        return local
    found = shutil.which("prometheus")
    if found is None:
        raise ServerStartError(f"prometheus is not installed: {INSTALL_HINT}")
    return Path(found)


class PrometheusServer(ServerProcess):
    """Prometheus scraping ``targets`` (``host:port``, path ``/metrics``) as job ``job``, with ``rule_files``.

    Intervals are short so that a test sees series and alerts within seconds; ``for:`` durations come
    from the rule files (a test shortens them in its own copy).
    """

    stop_timeout_s = 30.0

    def __init__(
        self,
        root: Path,
        *,
        targets: Sequence[str],
        job: str,
        rule_files: Sequence[Path] = (),
        interval_s: float = 1.0,
    ) -> None:
        self.root = root
        self.targets = list(targets)
        self.job = job
        self.rule_files = list(rule_files)
        self.interval_s = interval_s
        self.port: int | None = None
        self.log_path = root / "prometheus.log"
        self._proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("prometheus has not started")
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        binary = prometheus_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        interval = f"{int(self.interval_s * 1000)}ms"
        config = {
            "global": {
                "scrape_interval": interval,
                "evaluation_interval": interval,
                "scrape_timeout": interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{"job_name": self.job, "static_configs": [{"targets": self.targets}]}],
        }
        config_path = self.root / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self._proc = ManagedProcess(
            [
                str(binary),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address={LOOPBACK}:{self.port}",
                "--log.level=warn",
            ],
            log_path=self.log_path,
            cwd=self.root,
            name="prometheus",
        )
        try:
            wait_until(self._ready, timeout=timeout_s, interval=0.1, what="prometheus /-/ready")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        assert self._proc is not None
        if not self._proc.alive():
            raise ServerStartError(f"prometheus exited at start:\n{self._proc.output()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``; its ``data``, or ``PromQLError`` with Prometheus' own message."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as e:  # 400/422: a bad expression; the body says why
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) ``expr`` evaluates to now."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its ``health`` and ``lastError`` (``/api/v1/rules``)."""
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def alerts(self, state: str = "firing") -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def _describe(self) -> str:
        return f"Prometheus on {LOOPBACK}:{self.port}"

    def output(self) -> str:
        return self._proc.output() if self._proc is not None else ""
