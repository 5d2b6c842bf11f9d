"""The config file (``serve --config``): keys are the flags, values read as typed, precedence
flag > environment > file > default, and every mistake refused naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapcoord.coordinator.config import file as config_file
from snapcoord.coordinator.config.file import ConfigFileError, parse, read
from snapcoord.coordinator.config.options import OPTIONS
from snapcoord.coordinator.config.settings import ConfigError, load, resolve


def _file(text: str) -> config_file.ConfigFile:
    return parse(text, source="/etc/snapcoord.yaml")


def test_every_flag_is_a_key() -> None:
    text = "".join(f"{opt.flag.removeprefix('--')}: x\n" for opt in OPTIONS)
    assert set(_file(text).values) == {opt.name for opt in OPTIONS}


def test_values_fill_the_config() -> None:
    cfg = load(
        {}, {}, _file("port: 6000\nshutdown-grace: 30s\nmetadata: zk://zk1:2181/sc\nprocesses: auto\n")
    )
    assert (cfg.grpc.port, cfg.grpc.shutdown_grace_ms, cfg.grpc.processes) == (6000, 30_000, "auto")
    assert cfg.storage.metadata_uri == "zk://zk1:2181/sc"


def test_flag_beats_environment_beats_file_beats_default() -> None:
    file = _file("port: 6000\nmax-workers: 7\nhealth-port: 8081\n")
    environ = {"SNAPCOORD_PORT": "7000", "SNAPCOORD_MAX_WORKERS": "9"}
    cfg = load({"port": "8000"}, environ, file)
    assert cfg.grpc.port == 8000  # flag over environment and file
    assert cfg.grpc.max_workers == 9  # environment over file
    assert cfg.grpc.health_port == 8081  # file over default
    assert cfg.grpc.max_concurrent_rpcs == 256  # default
    assert load({}, {"SNAPCOORD_MAX_WORKERS": ""}, file).grpc.max_workers == 7  # empty: unset


def test_resolve_says_where_each_value_came_from() -> None:
    file = _file("max-workers: 7\nmetadata: zk://alice:s3cr3t@zk1:2181/sc\n")
    resolved = resolve({"port": "8000"}, {"SNAPCOORD_SHUTDOWN_GRACE": "1m"}, file)
    by_name = {s.name: s for s in resolved.settings}
    assert [s.name for s in resolved.settings] == [opt.name for opt in OPTIONS]
    assert (by_name["port"].origin, by_name["port"].shown) == ("flag", "8000")
    assert (by_name["shutdown_grace"].origin, by_name["shutdown_grace"].shown) == ("environment", "1m")
    assert (by_name["max_workers"].origin, by_name["max_workers"].shown) == ("file", "7")
    assert (by_name["host"].origin, by_name["host"].shown) == ("default", "0.0.0.0")
    assert (by_name["metrics_host"].origin, by_name["metrics_host"].shown) == ("derived", "0.0.0.0")
    assert by_name["metadata"].shown == "zk://alice:***@zk1:2181/sc"
    assert all("s3cr3t" not in s.shown for s in resolved.settings)


def test_values_are_the_text_as_written() -> None:
    """YAML 1.1 would read 0050 as octal 40 and ``on`` as true; the plain loader reads text."""
    assert load({}, {}, _file("port: 0050\n")).grpc.port == 50
    assert load({}, {}, _file("host: '127.0.0.1'\n")).grpc.host == "127.0.0.1"
    with pytest.raises(ConfigError) as e:
        load({}, {}, _file("s3-sse: on\n"))
    assert str(e.value).startswith(
        "invalid s3-sse: 'on' in /etc/snapcoord.yaml (--s3-sse and SNAPCOORD_S3_SSE"
    )


def test_a_bad_value_names_the_key_the_file_and_what_overrides_it() -> None:
    with pytest.raises(ConfigError) as e:
        load({}, {}, _file("shutdown-grace: 30\n"))
    assert str(e.value) == (
        "invalid shutdown-grace: '30' in /etc/snapcoord.yaml (--shutdown-grace and "
        "SNAPCOORD_SHUTDOWN_GRACE override it): expected a whole number with a unit: ms, s, m, h or d "
        "(e.g. 500ms, 10s, 5m, 24h, 7d)"
    )
    assert load({"shutdown_grace": "5s"}, {}, _file("shutdown-grace: 30\n")).grpc.shutdown_grace_ms == 5000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("metadta: zk://zk:2181/sc\n", "line 1: unknown key 'metadta'; did you mean metadata?"),
        ("port: 1\nmax_workers: 4\n", "line 2: unknown key 'max_workers'; did you mean max-workers?"),
        ("zzzzzzzz: 1\n", "line 1: unknown key 'zzzzzzzz' (the keys are the flags of snapcoord serve"),
        ("port: 1\nport: 2\n", "line 2: port is given twice"),
        ("port: [1, 2]\n", "line 1: port must be a single value (as for --port), not a list"),
        (
            "metadata:\n  uri: zk://zk/sc\n",
            "line 1: metadata must be a single value (as for --metadata), not a mapping",
        ),
        ("tls-cert:\n", "line 1: tls-cert has no value (remove the key to use the default)"),
        ("- port: 1\n", "expected a mapping of settings (port: 50051), not a list"),
        ("just text\n", "expected a mapping of settings (port: 50051), not a single value"),
        ("port: [1\n", "not valid YAML"),
        ("? [a, b]\n: 1\n", "line 1: a key must be a name"),
    ],
)
def test_mistakes_are_refused_naming_the_line_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigFileError) as e:
        _file(text)
    assert str(e.value).startswith("config file /etc/snapcoord.yaml")
    assert message in str(e.value)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_a_file_without_settings_is_refused(text: str) -> None:
    with pytest.raises(ConfigFileError, match="holds no settings"):
        _file(text)


def test_read_names_the_absolute_path_and_refuses_a_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "c.yaml").write_text("port: 6000\n")
    monkeypatch.chdir(tmp_path)
    assert read("c.yaml").path == str(tmp_path / "c.yaml")
    with pytest.raises(ConfigFileError, match=r"config file missing\.yaml: cannot read it"):
        read("missing.yaml")
