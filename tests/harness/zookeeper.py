"""A real standalone ZooKeeper (Debian package ``zookeeper``) run with plain java on 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from harness.ports import LOOPBACK, free_port, is_port_free
from harness.process import HarnessError, ManagedProcess, PortInUseError, ServerProcess

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# Without an slf4j binding ZooKeeper logs nothing at all. The jar's manifest Class-Path already names
# every other jar it needs (netty, jute, metrics, commons-*, jackson, jetty), all from Debian packages.
SLF4J_SIMPLE_JAR = Path("/usr/share/java/slf4j-simple.jar")
INSTALL_HINT = "run scripts/install-test-deps (it does: apt-get install -y zookeeper)"

_MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
#: The TLS port is served by the Netty connection factory; Debian splits netty into these jars.
_NETTY_JARS = tuple(
    Path(f"/usr/share/java/netty-{name}.jar")
    for name in (
        "buffer",
        "codec",
        "common",
        "handler",
        "resolver",
        "transport",
        "transport-native-epoll",
        "transport-native-unix-common",
    )
)


@dataclass(frozen=True)
class ZooKeeperTls:
    """PEM files for ZooKeeper's TLS client port: the server's key and certificate in one file, and
    the CA bundle it verifies client certificates with (clients must present one)."""

    keystore_pem: Path
    truststore_pem: Path


def four_letter_word(host: str, port: int, word: str, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter command (must be whitelisted in zoo.cfg) and return the reply."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperServer(ServerProcess):
    """A standalone ZooKeeper in ``workdir`` (zoo.cfg, data/, zookeeper.log).

    ``stop()``/``kill()`` keep the data dir and the port, so ``start()`` brings back the same server with
    the same znodes and sessions (a client whose session has not timed out yet reconnects to it).

    ``tick_time_ms`` is small so that session expiry is prompt; sessions may ask for 2 ticks up to 60 s, so
    kazoo's default 10 s timeout is honoured unchanged.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        tick_time_ms: int = 200,
        heap_mb: int = 256,
        start_timeout_s: float = 60.0,
        tls: ZooKeeperTls | None = None,
        force_sync: bool = False,
    ) -> None:
        self.workdir = Path(workdir)
        #: With TLS, a second (secure) client port; the plain one stays for readiness checks.
        self.tls = tls
        self.secure_port: int | None = None
        self.data_dir = self.workdir / "data"
        self.config_path = self.workdir / "zoo.cfg"
        self.log_path = self.workdir / "zookeeper.log"
        self.tick_time_ms = tick_time_ms
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        #: fsync each transaction, as a deployed ZooKeeper does (benchmarks' ``--fsync``); tests need not.
        self.force_sync = force_sync
        self._port_fixed = port is not None
        self._port: int | None = port
        self._proc: ManagedProcess | None = None
        self._starts = 0
        self.last_start_s: float | None = None  # spawn-to-ready time of the latest successful start

    # -- addresses ---------------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def port(self) -> int:
        if self._port is None:
            raise HarnessError("ZooKeeperServer has no port before its first start()")
        return self._port

    @property
    def hosts(self) -> str:
        """Connection string for kazoo / zk:// URIs: ``127.0.0.1:PORT``."""
        return f"{self.host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> ZooKeeperServer:
        """Start (or restart on the same port and data dir) and wait until it serves requests."""
        if self.running:
            raise HarnessError(f"ZooKeeper on {self.hosts} is already running")
        self._reap_dead()
        _check_installed()
        # Only the very first start may move to another port: afterwards clients know this address.
        attempts = 3 if (self._starts == 0 and not self._port_fixed) else 1
        for attempt in range(1, attempts + 1):
            if self._port is None or (attempt > 1):
                self._port = free_port()
            t0 = time.monotonic()
            try:
                self._start_once()
                self._starts += 1
                self.last_start_s = time.monotonic() - t0
                return self
            except PortInUseError:
                if attempt < attempts:
                    continue  # another process took the port between our check and java's bind
                raise
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        port = self.port
        if not is_port_free(port):
            # A restart right after stop(): the old process has exited, so this is someone else.
            raise PortInUseError(f"ZooKeeper port {port} is taken by another process")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config(port))
        java = shutil.which("java")
        if java is None:
            raise HarnessError(f"java not found on PATH; {INSTALL_HINT} (it pulls in a JRE)")
        argv = [
            java,
            "-Xms32m",
            f"-Xmx{self.heap_mb}m",
            # Serial GC: one GC thread instead of one per core fighting the tests for 2 cores.
            "-XX:+UseSerialGC",
            "-XX:-UsePerfData",  # no /tmp/hsperfdata_* files
            "-Djava.net.preferIPv4Stack=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            *(
                ["-Dzookeeper.serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory"]
                if self.tls
                else []
            ),
            "-cp",
            ":".join(
                str(j)
                for j in (ZOOKEEPER_JAR, SLF4J_SIMPLE_JAR, *(_NETTY_JARS if self.tls else ()))
                if j.exists()
            ),
            _MAIN_CLASS,
            str(self.config_path),
        ]
        self._proc = ManagedProcess(argv, log_path=self.log_path, cwd=self.workdir, name=f"zookeeper:{port}")
        try:
            self._wait_ready()
        except BaseException:
            self._proc.kill()
            self._proc = None
            raise

    def _config(self, port: int) -> str:
        tls: list[str] = []
        if self.tls is not None:
            if self.secure_port is None:
                self.secure_port = free_port()
            tls = [
                f"secureClientPort={self.secure_port}",
                f"secureClientPortAddress={LOOPBACK}",
                f"ssl.keyStore.location={self.tls.keystore_pem}",
                "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={self.tls.truststore_pem}",
                "ssl.trustStore.type=PEM",
                "ssl.clientAuth=need",
            ]
        return "\n".join(
            [
                *tls,
                f"tickTime={self.tick_time_ms}",
                f"minSessionTimeout={2 * self.tick_time_ms}",
                "maxSessionTimeout=60000",
                f"dataDir={self.data_dir}",
                f"clientPort={port}",
                # Without this it binds every interface.
                f"clientPortAddress={LOOPBACK}",
                # Otherwise the AdminServer (jetty) grabs port 8080.
                "admin.enableServer=false",
                "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
                # The default of 60 connections per client IP is easy to reach when every client is 127.0.0.1.
                "maxClientCnxns=0",
                # Test data need no fsync per transaction (unknown keys become zookeeper.* system properties).
                f"forceSync={'yes' if self.force_sync else 'no'}",
                "",
            ]
        )

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            self._proc.check_running(self._start_error)
            # `ruok` answers before the server serves; `srvr` shows `Mode:` only once it does.
            try:
                if "Mode:" in four_letter_word(self.host, self.port, "srvr", timeout=1.0):
                    return
            except OSError as e:
                last_error = repr(e)
            time.sleep(0.05)
        raise self._start_error(f"not ready after {self.start_timeout_s:.0f}s (last probe: {last_error})")

    def _describe(self) -> str:
        return f"ZooKeeper on {LOOPBACK}:{self._port}"

    def restart(self) -> ZooKeeperServer:
        self.stop()
        return self.start()

    def four_letter_word(self, word: str) -> str:
        return four_letter_word(self.host, self.port, word)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"ZooKeeperServer({self._port and self.hosts}, {state}, workdir={self.workdir})"


def _check_installed() -> None:
    missing = [str(p) for p in (ZOOKEEPER_JAR, SLF4J_SIMPLE_JAR) if not p.exists()]
    if missing:
        raise HarnessError(f"ZooKeeper is not installed ({', '.join(missing)} missing); {INSTALL_HINT}")
