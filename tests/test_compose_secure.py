"""docker-compose.secure.yml: the TLS + token override names real settings and files."""

from __future__ import annotations

from pathlib import Path

import yaml

from snapcoord.client import _env as client_env
from snapcoord.coordinator.config import options, settings

ROOT = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SECURE = yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text())
CLIENT_VARS = {client_env.CLIENT_CA, client_env.CLIENT_CERT, client_env.CLIENT_KEY, client_env.TOKEN_FILE}


def test_the_override_secures_every_coordinator_of_the_base_file() -> None:
    coordinators = {
        name for name, s in BASE["services"].items() if s.get("image", "").startswith("snapcoord")
    }
    assert set(SECURE["services"]) == coordinators


def test_the_override_sets_real_options_to_mounted_files() -> None:
    known = {opt.env for opt in options.OPTIONS} | CLIENT_VARS
    for name, service in SECURE["services"].items():
        env = service["environment"]
        assert set(env) <= known, (name, set(env) - known)
        cfg = settings.load({}, env)  # raises on a value or a missing partner option
        assert cfg.security.tls and cfg.security.auth_file
        mounts = {target: source for source, target, _ in (v.split(":") for v in service["volumes"])}
        for value in env.values():
            source = next(
                src for target, src in mounts.items() if value == target or value.startswith(target + "/")
            )
            if source == "./pki":
                continue  # made by the README's "Securing it" steps
            assert (ROOT / source).is_file(), source
