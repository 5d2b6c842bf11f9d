"""The config file of ``snapcoord serve --config FILE``: YAML, one key per flag.

The keys are the flags without ``--`` (``max-workers: 64``), the values what the flag would be
given (``shutdown-grace: 30s``), so that a setting reads the same in every place. Values are read
as the text written (YAML's plain loader: ``port: 0050`` is ``0050``, not octal 40, ``on`` is not
a boolean), and each goes through its option's parser like a flag's. Refused, naming the key: an
unknown key (with the closest known one), a key given twice, a value that is a list or a mapping,
an empty value. A relative path in a value is relative to the working directory, as for a flag.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from snapcoord.coordinator.config.options import OPTIONS, RENAMED


class ConfigFileError(ValueError):
    """The config file cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class ConfigFile:
    """The settings of one config file: option name -> the value as written."""

    path: str
    values: Mapping[str, str]


def _keys() -> dict[str, str]:
    """File key (the flag without ``--``) -> option name."""
    return {opt.flag.removeprefix("--"): opt.name for opt in OPTIONS}


def read(path: str) -> ConfigFile:
    """Read and check the file at ``path``; raises ``ConfigFileError``."""
    where = str(Path(path).expanduser().resolve())
    try:
        text = Path(where).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigFileError(f"config file {path}: cannot read it: {e}") from None
    return parse(text, source=where)


def parse(text: str, *, source: str) -> ConfigFile:
    """The settings in ``text``, a YAML mapping; ``source`` names it in messages."""
    try:
        node = yaml.compose(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as e:
        raise ConfigFileError(f"config file {source}: not valid YAML: {e}") from None
    if node is None or (isinstance(node, yaml.ScalarNode) and node.value == ""):
        raise ConfigFileError(f"config file {source} holds no settings (remove --config to run without one)")
    if not isinstance(node, yaml.MappingNode):
        raise ConfigFileError(
            f"config file {source}: expected a mapping of settings (port: 50051), not a {_kind(node)}"
        )
    keys = _keys()
    values: dict[str, str] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigFileError(f"config file {source}, line {_line(key_node)}: a key must be a name")
        key = key_node.value
        at = f"config file {source}, line {_line(key_node)}"
        renamed = RENAMED.get(key.replace("-", "_"))
        if key not in keys and renamed is not None:
            raise ConfigFileError(
                f"{at}: " + renamed.message(f"key {key!r}", repr(renamed.new.replace("_", "-")))
            )
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigFileError(
                f"{at}: unknown key {key!r}{hint} (the keys are the flags of snapcoord serve without --)"
            )
        name = keys[key]
        if name in values:
            raise ConfigFileError(f"{at}: {key} is given twice")
        if not isinstance(value_node, yaml.ScalarNode):
            raise ConfigFileError(
                f"{at}: {key} must be a single value (as for --{key}), not a {_kind(value_node)}"
            )
        if value_node.value == "":
            raise ConfigFileError(f"{at}: {key} has no value (remove the key to use the default)")
        values[name] = value_node.value
    return ConfigFile(path=source, values=values)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    return "list" if isinstance(node, yaml.SequenceNode) else "single value"
