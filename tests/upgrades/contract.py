"""The two contracts an upgrade crosses, as data read from a tree's source files (never imported,
so any release's tree or installed packages can be read by today's code):

- **wire**: every service method, message field and enum value of ``snapcoord.v1``, from the
  serialized descriptors in the generated ``*_pb2.py`` files, one line each with its number, type
  and (for a method) its streaming and idempotency;
- **storage**: every stored format version constant (``NAME_VERSION = <int>`` at the top of a
  module of the coordinator or the connector), as ``module.NAME -> value``.

A release records its contract in ``tests/upgrades/contracts/<version>.json`` (``scripts/release``
writes it); ``tests/upgrades/test_contracts.py`` compares the tree's with the last release's.
``python tests/upgrades/contract.py [ROOT]`` prints a tree's contract as JSON.
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = Path(__file__).resolve().parent / "contracts"
#: Where the generated API modules and the stored formats' source live, relative to a tree.
WIRE_DIR = "client/src/snapcoord/v1/"
STORAGE_DIRS = ("coordinator/src/snapcoord/coordinator/", "spark_connector/src/snapcoord/spark_connector/")

_TYPES = {
    number: name.removeprefix("TYPE_").lower()
    for name, number in descriptor_pb2.FieldDescriptorProto.Type.items()
}
_LABELS = {
    number: name.removeprefix("LABEL_").lower()
    for name, number in descriptor_pb2.FieldDescriptorProto.Label.items()
}


@dataclass(frozen=True)
class Contract:
    #: Sorted lines, one per method, field and enum value.
    wire: tuple[str, ...]
    #: ``module.NAME`` -> format version.
    storage: Mapping[str, int]

    def to_json(self) -> str:
        return (
            json.dumps({"wire": list(self.wire), "storage": dict(sorted(self.storage.items()))}, indent=1)
            + "\n"
        )

    @staticmethod
    def from_json(text: str) -> Contract:
        doc = json.loads(text)
        return Contract(tuple(doc["wire"]), {str(k): int(v) for k, v in doc["storage"].items()})


def _serialized_descriptors(source: bytes) -> Iterator[bytes]:
    """The serialized FileDescriptorProtos a generated ``_pb2.py`` registers (``AddSerializedFile``)."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, bytes)
        ):
            yield node.args[0].value


def _messages(prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]) -> Iterator[str]:
    for message in messages:
        name = f"{prefix}.{message.name}"
        for field in message.field:
            kind = field.type_name.lstrip(".") or _TYPES[field.type]
            optional = " proto3_optional" if field.proto3_optional else ""
            yield f"field {name}.{field.name} = {field.number} {_LABELS[field.label]} {kind}{optional}"
        yield from _enums(name, message.enum_type)
        yield from _messages(name, message.nested_type)


def _enums(prefix: str, enums: Iterable[descriptor_pb2.EnumDescriptorProto]) -> Iterator[str]:
    for enum in enums:
        for value in enum.value:
            yield f"enum {prefix}.{enum.name}.{value.name} = {value.number}"


def wire_lines(descriptor: bytes) -> Iterator[str]:
    """The wire contract lines of one serialized FileDescriptorProto."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(descriptor)
    package = proto.package
    for service in proto.service:
        for method in service.method:
            level = descriptor_pb2.MethodOptions.IdempotencyLevel.Name(method.options.idempotency_level)
            yield (
                f"rpc {package}.{service.name}.{method.name}"
                f"({'stream ' if method.client_streaming else ''}{method.input_type.lstrip('.')}) returns "
                f"({'stream ' if method.server_streaming else ''}{method.output_type.lstrip('.')}) {level}"
            )
    yield from _messages(package, proto.message_type)
    yield from _enums(package, proto.enum_type)


def storage_versions(path: str, source: bytes) -> Iterator[tuple[str, int]]:
    """The ``NAME_VERSION = <int>`` constants at the top of the module at ``path``."""
    stem = Path(path).stem
    for node in ast.parse(source).body:
        targets: list[ast.expr]
        if isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = list(node.targets), node.value
        else:
            continue
        for target in targets:
            if (
                isinstance(target, ast.Name)
                and (target.id == "VERSION" or target.id.endswith("_VERSION"))
                and isinstance(value, ast.Constant)
                and type(value.value) is int
            ):
                yield f"{stem}.{target.id}", value.value


def contract_of(files: Mapping[str, bytes]) -> Contract:
    """The contract of a tree given as ``relative path -> content`` (its Python files at least)."""
    wire: list[str] = []
    storage: dict[str, int] = {}
    for path, source in sorted(files.items()):
        if path.startswith(WIRE_DIR) and path.endswith("_pb2.py"):
            for descriptor in _serialized_descriptors(source):
                wire.extend(wire_lines(descriptor))
        elif path.startswith(STORAGE_DIRS) and path.endswith(".py"):
            for name, version in storage_versions(path, source):
                if name in storage:
                    raise ValueError(f"{name} is defined twice (in {path})")
                storage[name] = version
    return Contract(tuple(sorted(wire)), storage)


def tree_files(root: Path = ROOT) -> dict[str, bytes]:
    """The Python files of the working tree at ``root`` that a contract reads."""
    found = {}
    for top in (WIRE_DIR, *STORAGE_DIRS):
        for path in (root / top).rglob("*.py"):
            found[path.relative_to(root).as_posix()] = path.read_bytes()
    return found


def commit_files(commit: str, root: Path = ROOT) -> dict[str, bytes]:
    """The same files as committed at ``commit`` in the repository at ``root`` (git history only:
    no checkout, one ``git archive``)."""
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", commit, "--", WIRE_DIR, *STORAGE_DIRS],
        check=True,
        capture_output=True,
    ).stdout
    found = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() and member.name.endswith(".py") else None
            if extracted is not None:
                found[member.name] = extracted.read()
    return found


def recorded(version: str) -> Contract | None:
    """The contract recorded for release ``version``, if any."""
    path = CONTRACTS / f"{version}.json"
    return Contract.from_json(path.read_text()) if path.exists() else None


def differences(old: Contract, new: Contract) -> list[str]:
    """What ``new`` adds to, removes from or changes in ``old``, one line each."""
    lines = [f"wire: removed {line}" for line in sorted(set(old.wire) - set(new.wire))]
    lines += [f"wire: added {line}" for line in sorted(set(new.wire) - set(old.wire))]
    for name in sorted(old.storage.keys() | new.storage.keys()):
        before, after = old.storage.get(name), new.storage.get(name)
        if before != after:
            lines.append(f"storage: {name} {before} -> {after}")
    return lines


def _named(line: str) -> str:
    """The name a changelog uses for the item of a wire line: a method, field or enum value."""
    return line.split(" ", 2)[1].split("(", 1)[0].rsplit(".", 1)[1]


def _qualified(line: str) -> str:
    """The item of a wire line with its message or service: ``BacklogStatus.added``."""
    return ".".join(line.split(" ", 2)[1].split("(", 1)[0].rsplit(".", 2)[-2:])


def undocumented(old: Contract, new: Contract, section: str) -> list[str]:
    """The changes from ``old`` to ``new`` that the changelog ``section`` does not mention: each
    new or changed format version as "format version N", each added or removed method, field or
    enum value by its name (alone or after its message or service: `added`, `BacklogStatus.added`)."""
    missing = []
    for line in sorted(set(old.wire) ^ set(new.wire)):
        named = (f"`{_named(line)}`", f"`{_qualified(line)}`")
        if not any(n in section for n in named) and _named(line) not in section.split():
            missing.append(f"wire: {'added' if line in new.wire else 'removed'} {line}")
    for name in sorted(new.storage.keys() | old.storage.keys()):
        after = new.storage.get(name)
        if after != old.storage.get(name) and (after is None or f"format version {after}" not in section):
            missing.append(f"storage: {name} {old.storage.get(name)} -> {after}")
    return missing


if __name__ == "__main__":
    sys.stdout.write(contract_of(tree_files(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)).to_json())
