"""A real OpenSSH server on 127.0.0.1 serving sftp only, for a remote Hadoop filesystem in tests.

Spark reaches it through Hadoop's ``sftp://`` FileSystem (``org.apache.hadoop.fs.sftp.SFTPFileSystem``,
in the pyspark wheel's Hadoop client jar); Python reaches it through paramiko. The server runs Debian's
``/usr/sbin/sshd`` in the foreground (``-D -e``: its log goes to the harness log file) with a config of
its own: loopback only, a free port, public-key login as root with a key pair made for this server, and
``internal-sftp`` in a ``ChrootDirectory``. The chroot makes the remote paths exist nowhere on the local
filesystem (``sftp://root@127.0.0.1:PORT/data/x`` is ``<chroot>/data/x`` on disk, never ``/data/x``), so a
test that finds its data where the URI's path points locally has found a bug.

sshd accepts a chroot only if every component of its path is owned by root and writable by nobody else:
hence not under /tmp (world-writable); the chroots live under ``/var/lib/snapcoord-tests/sftp`` and are
removed on ``stop()``. Hadoop's shaded JSch is old, so the keys are RSA in PEM form and the server
re-enables ``ssh-rsa`` and ``diffie-hellman-group14-sha1`` (otherwise: "Algorithm negotiation fail").
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
import uuid
from pathlib import Path

from harness.ports import LOOPBACK, free_port, is_port_free
from harness.process import HarnessError, ManagedProcess, PortInUseError, ServerProcess

SSHD = Path("/usr/sbin/sshd")  # sshd re-executes itself and insists on an absolute path
INSTALL_HINT = "run `bash scripts/install-test-deps` (it installs Debian's openssh-server)"
DEFAULT_CHROOT_BASE = Path("/var/lib/snapcoord-tests/sftp")
USER = "root"
#: Where sshd keeps its privilege-separation chroot; Debian's service creates it, we do when absent.
PRIVSEP_DIR = Path("/run/sshd")

#: Hadoop's FileSystem for ``sftp://`` (it is not registered for the scheme by default).
HADOOP_SFTP_IMPL = "org.apache.hadoop.fs.sftp.SFTPFileSystem"


def _check_chroot_parents(path: Path) -> None:
    """sshd's own rule for a ChrootDirectory, checked up front for a clear message."""
    for component in [path, *path.parents]:
        st = component.stat()
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise HarnessError(
                f"sshd refuses ChrootDirectory {path}: {component} must be owned by root and not group- "
                f"or world-writable (mode {stat.filemode(st.st_mode)}, uid {st.st_uid})"
            )


def _keygen(path: Path) -> None:
    # -m PEM: "BEGIN RSA PRIVATE KEY", the only private-key form Hadoop's JSch reads.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-C", "", "-f", str(path)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


class SshServer(ServerProcess):
    """``sshd -D`` on ``127.0.0.1:<free port>`` serving ``internal-sftp`` chrooted in ``chroot``.

    ``workdir`` holds the config, the keys and the log (any directory); the chroot is made below
    ``chroot_base`` (see the module docstring). ``start()`` returns once the server answers with its
    SSH banner; ``stop()`` ends it and removes the chroot with everything stored in it.
    """

    stop_timeout_s = 10.0

    def __init__(
        self,
        workdir: Path,
        *,
        chroot_base: Path = DEFAULT_CHROOT_BASE,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "sshd.log"
        self.config_path = self.workdir / "sshd_config"
        self.host_key = self.workdir / "host_rsa_key"
        self.client_key = self.workdir / "client_rsa_key"
        self.chroot = Path(chroot_base) / uuid.uuid4().hex[:12]
        self.start_timeout_s = start_timeout_s
        self.port: int | None = None
        self._proc: ManagedProcess | None = None

    # -- addresses ---------------------------------------------------------------------------------------
    def uri(self, path: str = "") -> str:
        """``sftp://root@127.0.0.1:PORT/<path>`` (absolute inside the chroot)."""
        if self.port is None:
            raise HarnessError("the sshd has no port before start()")
        return f"sftp://{USER}@{LOOPBACK}:{self.port}/{path.strip('/')}"

    def local_path(self, path: str = "") -> Path:
        """Where the server keeps remote ``path`` on this machine's disk (for a test's own inspection)."""
        return self.chroot / path.strip("/")

    def spark_conf(self) -> dict[str, str]:
        """The Spark settings that let a session (classic or Connect server) read and write ``uri()``s."""
        return {
            "spark.hadoop.fs.sftp.impl": HADOOP_SFTP_IMPL,
            "spark.hadoop.fs.sftp.keyfile": str(self.client_key),
        }

    def storage_options(self) -> dict[str, object]:
        """What fsspec's sftp filesystem (paramiko) needs to log in: the key file, no agent, no ~/.ssh."""
        return {"key_filename": str(self.client_key), "allow_agent": False, "look_for_keys": False}

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> SshServer:
        if self.running:
            raise HarnessError(f"sshd on port {self.port} is already running")
        if not SSHD.exists():
            raise HarnessError(f"{SSHD} not found; {INSTALL_HINT}")
        if os.geteuid() != 0:
            raise HarnessError("sshd with a ChrootDirectory must run as root")
        self._prepare()
        for attempt in range(1, 4):
            self.port = free_port()
            try:
                self._start_once()
                return self
            except PortInUseError:
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                _keygen(key)
        (self.workdir / "authorized_keys").write_bytes(Path(f"{self.client_key}.pub").read_bytes())
        self.chroot.mkdir(mode=0o755, parents=True, exist_ok=True)
        for directory in (self.chroot, self.chroot.parent):
            os.chmod(directory, 0o755)  # a umask must not leave them group-writable
        _check_chroot_parents(self.chroot)
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)

    def _config(self, port: int) -> str:
        return "\n".join(
            [
                f"ListenAddress {LOOPBACK}",
                f"Port {port}",
                f"HostKey {self.host_key}",
                f"PidFile {self.workdir / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "AllowTcpForwarding no",
                "X11Forwarding no",
                "PermitTTY no",
                "LogLevel INFO",
                # What Hadoop's shaded JSch can negotiate.
                "KexAlgorithms +diffie-hellman-group14-sha1",
                "HostKeyAlgorithms +ssh-rsa",
                "PubkeyAcceptedAlgorithms +ssh-rsa",
                # Spark opens many sessions at once (one per task and per FileSystem instance).
                "MaxStartups 200",
                "MaxSessions 200",
                "Subsystem sftp internal-sftp",
                f"ChrootDirectory {self.chroot}",
                "ForceCommand internal-sftp",
                "",
            ]
        )

    def _start_once(self) -> None:
        port = self.port
        assert port is not None
        if not is_port_free(port):
            raise PortInUseError(f"sshd port {port} is taken by another process")
        self.config_path.write_text(self._config(port))
        self._proc = ManagedProcess(
            [str(SSHD), "-D", "-e", "-f", str(self.config_path)],
            log_path=self.log_path,
            cwd=self.workdir,
            name=f"sshd:{port}",
        )
        try:
            self._wait_ready()
        except BaseException:
            self._proc.kill()
            self._proc = None
            raise

    def _wait_ready(self) -> None:
        """Until the server sends its SSH banner: it does so only once it accepts sessions."""
        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self.start_timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            if not self._proc.alive():
                error = self._start_error(f"exited with code {self._proc.returncode} during start")
                if "Address already in use" in self._proc.output():
                    raise PortInUseError(str(error))
                raise error
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=5) as s:
                    if s.recv(64).startswith(b"SSH-2.0-"):
                        return
            except OSError as e:
                last_error = f"{type(e).__name__}: {e}"
            time.sleep(0.05)
        raise self._start_error(f"not ready after {self.start_timeout_s:.0f}s (last probe: {last_error})")

    def _describe(self) -> str:
        return f"sshd on {LOOPBACK}:{self.port}"

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM (SIGKILL after ``timeout``), then remove the chroot and what the tests stored there."""
        super().stop(timeout)
        shutil.rmtree(self.chroot, ignore_errors=True)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SshServer({self.port and self.uri()}, {state}, chroot={self.chroot})"
