"""The test jars of a set in ``scripts/maven`` (Spark's connectors, test servers), as local paths.

``scripts/install-test-deps`` fetches every set into the jar cache and checks it against its lock; this
module only finds them. A set missing from the cache fails the test with the command that fetches it:
CI never runs a test without the jars it needs, and never skips one for want of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@cache
def jar_set(name: str) -> tuple[Path, ...]:
    """Every jar of set ``name``, verified against ``scripts/maven/NAME.lock`` (sorted by file name)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch-maven"), name],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"jar set {name!r} is not available: {result.stderr.strip()} "
            f"(scripts/install-test-deps fetches it; scripts/fetch-maven {name} alone does too)"
        )
    directory = Path(result.stdout.strip())
    jars = tuple(sorted(directory.glob("*.jar")))
    if not jars:
        raise RuntimeError(f"jar set {name!r}: {directory} holds no jars")
    return jars


def class_path(name: str) -> str:
    """The jars of set ``name`` joined for a JVM class path (``java -cp``, ``spark.jars`` takes commas)."""
    return os.pathsep.join(str(p) for p in jar_set(name))
