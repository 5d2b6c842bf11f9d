"""The coordinator image, built by ``scripts/build-image`` and run with podman, for the live image tests.

``build_image`` builds it once (the build script caches the base and podman keeps the layers, so a
second build with nothing changed takes seconds); ``Container`` runs one container of it the way this
kind of machine needs (runc, ulimits within the VM's hard limits, slirp4netns networking) and stops
and removes it on exit. A container reaches this machine's loopback servers (the harness's ZooKeeper
and SeaweedFS listen on 127.0.0.1) at ``HOST_LOOPBACK``: slirp4netns' ``allow_host_loopback``.

podman runs no timed healthchecks without systemd, so ``Container.healthcheck`` runs the image's
HEALTHCHECK command once (``podman healthcheck run``), as a Docker engine or the kubelet would.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

from harness.process import log_tail, wait_until

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-image"
INSTALL_SCRIPT = ROOT / "scripts" / "install-image-deps"
#: The tag the tests build and run (docker-compose.yml's snapcoord:latest is left to users).
TEST_TAG = "localhost/snapcoord:test"
#: The Dockerfile's base, as scripts/build-image makes or finds it.
BASE_IMAGE = "python:3.11-slim-bookworm"
#: This machine's 127.0.0.1 as a container on slirp4netns with allow_host_loopback sees it.
HOST_LOOPBACK = "10.0.2.2"
#: The image's user and data directory (the Dockerfile's USER and SNAPCOORD_DATA_DIR).
IMAGE_UID = 10001
DATA_DIR = "/var/lib/snapcoord"


class TourStep(Protocol):
    """One ``$ command`` of the README's tour and the output it must print (tests/test_readme_tour.py)."""

    @property
    def command(self) -> str: ...

    @property
    def expected(self) -> str: ...


class ImageUnavailable(RuntimeError):
    """podman, the base image or the build is missing or failed; the message says what to run."""


def podman_command() -> list[str]:
    """podman with the runtime this kind of machine needs (crun refuses cgroups in hybrid mode)."""
    return ["podman", "--runtime", "runc"]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one podman command; with ``check`` a failure raises with its output."""
    done = subprocess.run(
        [*podman_command(), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done


def ulimit_flags() -> list[str]:
    """``--ulimit`` flags within this machine's hard limits (podman's defaults exceed a VM's)."""
    flags: list[str] = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(which)[1]
        value = 20000 if hard == resource.RLIM_INFINITY else min(hard, 20000)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


def run_once(image: str, entrypoint: str, *args: str) -> str:
    """The stdout of ``entrypoint args`` in a throwaway container of ``image`` (no network)."""
    return podman(
        "run",
        "--rm",
        "--network",
        "none",
        "--no-healthcheck",
        *ulimit_flags(),
        "--entrypoint",
        entrypoint,
        image,
        *args,
    ).stdout


#: Each test container carries the pid of the test process that started it.
OWNER_LABEL = "org.snapcoord.test-pid"


def remove_orphans() -> list[str]:
    """Remove the test containers (and their anonymous volumes) whose test process is gone, say a
    run killed outright; containers of a live process (another worker's) stay. Their names."""
    listed = podman("ps", "--all", "--filter", f"label={OWNER_LABEL}", "--format", "json").stdout
    removed: list[str] = []
    for entry in json.loads(listed or "[]"):
        pid = int(entry["Labels"][OWNER_LABEL])
        if not Path(f"/proc/{pid}").exists():
            name = entry["Names"][0]
            podman("rm", "--force", "--ignore", "--volumes", name, check=False)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class Layer:
    size_bytes: int
    created_by: str


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    revision: str
    build_seconds: float
    size_bytes: int
    layers: tuple[Layer, ...]

    def summary(self) -> str:
        big = [f"{layer.size_bytes / 1e6:.1f} MB" for layer in self.layers if layer.size_bytes > 0]
        return (
            f"image {self.tag}: built in {self.build_seconds:.1f}s, {self.size_bytes / 1e6:.0f} MB, "
            f"{len(self.layers)} layers ({len(big)} with content: {', '.join(big)})"
        )


def build_image(log_path: Path, tag: str = TEST_TAG) -> BuiltImage:
    """Build the image with ``scripts/build-image`` (podman: SNAPCOORD_IMAGE_BUILDER=podman) and
    describe it; ImageUnavailable with the log's tail and the fix when that cannot be done."""
    if shutil.which("podman") is None:
        raise ImageUnavailable(
            f"podman is not installed: run {INSTALL_SCRIPT.relative_to(ROOT)} "
            "(scripts/install-test-deps runs it); the live image tests need it"
        )
    described = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    revision = described.stdout.strip() if described.returncode == 0 else "unknown"  # not a git checkout
    remove_orphans()
    env = {**os.environ, "SNAPCOORD_IMAGE_BUILDER": "podman", "SNAPCOORD_REVISION": revision}
    started = time.monotonic()
    with log_path.open("w") as log:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT), tag],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=1200,
            stdin=subprocess.DEVNULL,
        )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise ImageUnavailable(
            f"scripts/build-image {tag} failed (exit {done.returncode}; log {log_path}):\n"
            + log_tail(log_path)
        )
    size = int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
    history = json.loads(podman("history", "--format", "json", tag).stdout)
    layers = tuple(
        Layer(int(h.get("size", 0)), str(h.get("CreatedBy", h.get("createdBy", "")))) for h in history
    )
    return BuiltImage(tag=tag, revision=revision, build_seconds=seconds, size_bytes=size, layers=layers)


@dataclass
class Container:
    """One detached container of ``image``; ``with`` starts it and removes it (forcibly) at the end.

    ``publish`` maps container ports to host ports on 127.0.0.1. ``read_only`` is ``--read-only``
    (with a tmpfs on /tmp, as the Kubernetes base mounts an emptyDir there)."""

    image: str
    name: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    publish: Mapping[int, int] = field(default_factory=dict)
    volumes: Sequence[str] = ()
    read_only: bool = False
    add_hosts: Mapping[str, str] = field(default_factory=dict)
    #: A healthcheck command (JSON exec form) in place of the image's HEALTHCHECK, as compose's ``test``.
    health_cmd: str | None = None
    started_at: float = 0.0

    def run_args(self) -> list[str]:
        args = [
            "run",
            "--detach",
            "--name",
            self.name,
            "--label",
            f"{OWNER_LABEL}={os.getpid()}",
            *ulimit_flags(),
        ]
        args += ["--network", "slirp4netns:allow_host_loopback=true", "--health-interval", "disable"]
        for container_port, host_port in self.publish.items():
            args += ["--publish", f"127.0.0.1:{host_port}:{container_port}"]
        for key, value in self.env.items():
            args += ["--env", f"{key}={value}"]
        for volume in self.volumes:
            args += ["--volume", volume]
        for host, address in self.add_hosts.items():
            args += ["--add-host", f"{host}:{address}"]
        if self.health_cmd is not None:
            args += ["--health-cmd", self.health_cmd]
        if self.read_only:
            args += ["--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=64m"]
        return [*args, self.image, *self.args]

    def start(self) -> Container:
        podman("rm", "--force", "--ignore", self.name)
        self.started_at = time.monotonic()
        podman(*self.run_args())
        return self

    def __enter__(self) -> Container:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        podman("rm", "--force", "--ignore", "--volumes", "--time", "5", self.name, check=False)

    def healthcheck(self) -> subprocess.CompletedProcess[str]:
        """Run the image's HEALTHCHECK command once inside the container (exit 0: healthy)."""
        return podman("healthcheck", "run", self.name, check=False, timeout=60)

    def wait_healthy(self, timeout: float = 90) -> float:
        """Seconds from ``start`` until the HEALTHCHECK first passes; the log in the error otherwise."""
        try:
            wait_until(
                lambda: self.healthcheck().returncode == 0 or self.check_running(),
                timeout=timeout,
                interval=0.2,
                what=f"{self.name}'s HEALTHCHECK",
            )
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None
        return time.monotonic() - self.started_at

    def check_running(self) -> bool:
        """False while running; raises (with the log) once the container has exited."""
        if self.state()["Running"]:
            return False
        raise AssertionError(f"{self.name} exited ({self.state()['ExitCode']}):\n{self.logs()}")

    def state(self) -> dict[str, object]:
        out = podman("inspect", "--format", "{{json .State}}", self.name).stdout
        state: dict[str, object] = json.loads(out)
        return state

    def exec(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, check=False, timeout=timeout)

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def signal(self, name: str) -> None:
        podman("kill", "--signal", name, self.name)

    def wait_exit(self, timeout: float) -> int:
        """The container's exit code once it has stopped (AssertionError after ``timeout``)."""
        try:
            wait_until(
                lambda: not self.state()["Running"],
                timeout=timeout,
                interval=0.1,
                what=f"{self.name} to exit",
            )
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None
        code = self.state()["ExitCode"]
        assert isinstance(code, int)
        return code

    def stop(self, grace_seconds: int = 30) -> int:
        """``podman stop`` (SIGTERM, SIGKILL after ``grace_seconds``); the exit code."""
        podman("stop", "--time", str(grace_seconds), self.name, timeout=grace_seconds + 60)
        return self.wait_exit(timeout=30)

    def restart(self) -> None:
        """Start the stopped container again: same filesystem, volumes and settings."""
        self.started_at = time.monotonic()
        podman("start", self.name)


def data_volume(directory: Path) -> str:
    """A host directory the image's user owns, mounted as the data volume (an emptyDir in Kubernetes)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, IMAGE_UID, IMAGE_UID)
    return f"{directory}:{DATA_DIR}"


def tools_path() -> dict[str, str]:
    """The environment with the venv's bin (grpcurl) first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def run_tour(steps: Sequence[TourStep], grpc_port: int, metrics_port: int) -> None:
    """The tour's commands, as written but for the ports, against a running container; each output
    must match the tour's (``<ms>`` stands for a timestamp)."""
    for step in steps:
        command = step.command.replace("localhost:50051", f"localhost:{grpc_port}")
        command = command.replace("localhost:9464", f"localhost:{metrics_port}")
        done = subprocess.run(
            ["/bin/sh", "-c", f"{command} 2>&1"], capture_output=True, text=True, env=tools_path(), timeout=60
        )
        expected = step.expected.replace("localhost:50051", f"localhost:{grpc_port}")
        pattern = re.escape(expected).replace(re.escape("<ms>"), r"\d{13}")
        got = done.stdout.rstrip("\n")
        assert re.fullmatch(pattern, got), f"tour step: $ {step.command}\n{got}"


def record_serving(container: Container, image_report: list[str], what: str) -> None:
    seconds = container.wait_healthy()
    image_report.append(f"run to SERVING ({what}): {seconds:.2f}s")
