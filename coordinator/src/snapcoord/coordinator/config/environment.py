"""What the environment may hold: every ``SNAPCOORD_*`` variable must be known, and the embedded
stores are flagged where they cannot be right.

A misspelt variable (``SNAPCOORD_METADTA=zk://...``) would otherwise be ignored, and the server
would start on its default, the embedded store, with nothing said. So an unknown ``SNAPCOORD_*``
variable stops the start, naming the closest known one. Known are the server's settings, the
config file's variable, and the variables other parts of snapcoord read from the same
environment (``OTHER_VARIABLES``): a shell that runs a client next to the server, a script or a
test run must not be refused. Kubernetes' service links (``<SERVICE>_SERVICE_HOST``,
``<SERVICE>_PORT_<N>_TCP`` ...) for a Service whose name starts with ``snapcoord-`` are not ours
and are let through by their shape.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from snapcoord.coordinator.config.options import OPTIONS, renamed_env

PREFIX = "SNAPCOORD_"
#: The variable naming the config file (``snapcoord serve --config``).
CONFIG_FILE = "SNAPCOORD_CONFIG"
#: The source revision ``snapcoord_build_info`` reports (set by the image build); "unknown" unset.
REVISION = "SNAPCOORD_REVISION"

#: ``SNAPCOORD_*`` variables that are not server settings, and who reads them.
OTHER_VARIABLES: Mapping[str, str] = {
    CONFIG_FILE: "snapcoord serve: the config file (--config)",
    REVISION: "snapcoord serve: the source revision snapcoord_build_info reports",
    "SNAPCOORD_TOKEN": "the client: a bearer token",
    "SNAPCOORD_TOKEN_FILE": "the client: a file holding a bearer token",
    "SNAPCOORD_CLIENT_CA": "the client: the CA bundle of the coordinator's certificate",
    "SNAPCOORD_CLIENT_CERT": "the client: its certificate for mutual TLS",
    "SNAPCOORD_CLIENT_KEY": "the client: the key of its certificate",
    "SNAPCOORD_CLIENT_SERVER_NAME": "the client: the name checked against the server certificate",
    "SNAPCOORD_VENV": "scripts: the virtualenv they run in",
    "SNAPCOORD_CODEGEN_VENV": "scripts/gen-proto: the virtualenv of the pinned code generator",
    "SNAPCOORD_JAR_CACHE": "scripts/fetch-maven: where the test jars from Maven Central are kept",
    "SNAPCOORD_DELTA_BENCH_CACHE": "scripts/install-delta-bench: where its PySpark wheel is kept",
    "SNAPCOORD_IMAGE_BUILDER": "scripts/build-image: docker or podman",
    "SNAPCOORD_IMAGE_CACHE": "scripts/build-image: where the image's Debian base is cached",
    "SNAPCOORD_RELEASE_CACHE": "tests/upgrades: where the venvs of earlier releases are cached",
    "SNAPCOORD_RELEASE_GATE": "scripts/release: the upgrade tests it runs before a release",
    "SNAPCOORD_UPGRADE_LONG": "tests/upgrades: the long rolling upgrade of every compatible pair",
    "SNAPCOORD_FUZZ_EXAMPLES": "tests: examples per fuzzed RPC",
    "SNAPCOORD_FUZZ_SEED": "tests: the fuzzer's seed",
}

#: Kubernetes service-link variables (``enableServiceLinks``) of a Service named ``snapcoord-*``.
_SERVICE_LINK = re.compile(
    r"SNAPCOORD(_[A-Z0-9_]+)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)"
)
_SERVICE_LINK_PORT = re.compile(r"(tcp|udp|sctp)://\S+:\d+")


def known_variables() -> frozenset[str]:
    """Every ``SNAPCOORD_*`` name the server accepts in its environment."""
    return frozenset({opt.env for opt in OPTIONS} | set(OTHER_VARIABLES))


def unknown_variable(environ: Mapping[str, str]) -> str | None:
    """The message refusing the first unknown ``SNAPCOORD_*`` variable (in name order), or None."""
    known = known_variables()
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in known or _is_service_link(name, environ[name]):
            continue
        renamed = renamed_env(name)
        if renamed is not None:
            return renamed.message(f"environment variable {name}", PREFIX + renamed.new.upper())
        suffixes = {k.removeprefix(PREFIX): k for k in known}
        # Compared without the prefix every name shares, which would make any two look alike.
        close = difflib.get_close_matches(name.removeprefix(PREFIX), suffixes, n=1, cutoff=0.6)
        hint = f"; did you mean {suffixes[close[0]]}?" if close else ""
        return (
            f"unknown environment variable {name}{hint} (a SNAPCOORD_* variable must be a setting of "
            "snapcoord serve, see --help, or one the client reads: unset it or correct its name)"
        )
    return None


def _is_service_link(name: str, value: str) -> bool:
    if _SERVICE_LINK.fullmatch(name):
        return True
    return name.endswith("_PORT") and _SERVICE_LINK_PORT.fullmatch(value) is not None


def processes_refusal(processes: int | str, metadata_uri: str) -> str | None:
    """Why ``--processes`` cannot run on this metadata store, or None: the embedded store belongs
    to one process (others would not see its watches, their janitors would elect no one leader)."""
    if isinstance(processes, int) and processes > 1 and not metadata_uri.startswith("zk://"):
        return (
            f"--processes={processes} needs ZooKeeper metadata (--metadata zk://...); "
            "the embedded store serves one process"
        )
    return None


def embedded_store_warnings(
    metadata_uri: str, blobs_uri: str, processes: int | str, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """Why the embedded (``file://``) stores cannot be right here, one message per reason.

    Under Kubernetes (``KUBERNETES_SERVICE_HOST`` is set in every pod) a pod's files are its
    own: another replica sees other state, and a rescheduled pod starts empty unless the volume
    follows it. With ``--processes auto`` the embedded metadata store holds the server to one
    process, whatever the CPUs (a count above 1 is refused when the server starts).
    """
    embedded = [
        flag
        for flag, uri in (("--metadata", metadata_uri), ("--blobs", blobs_uri))
        if uri.startswith("file:")
    ]
    out: list[str] = []
    if embedded and environ.get("KUBERNETES_SERVICE_HOST"):
        out.append(
            f"running under Kubernetes on the embedded store ({' and '.join(embedded)} file://...): its "
            "state is local to this pod, unseen by other replicas and lost with the pod's volume; "
            "set --metadata zk://... and --blobs s3://... (SNAPCOORD_METADATA, SNAPCOORD_BLOBS)"
        )
    if processes == "auto" and metadata_uri.startswith("file:"):
        out.append(
            "--processes auto runs 1 process: the embedded metadata store serves one process; "
            "set --metadata zk://... to run one per CPU"
        )
    return tuple(out)
