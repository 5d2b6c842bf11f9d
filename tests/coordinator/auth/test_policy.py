"""The pure part of access control: the per-RPC table, decisions, and the auth file's format."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from google.protobuf.descriptor_pb2 import MethodOptions

from harness.coordinator import embedded_deps, serve_in_process
from snapcoord.coordinator import api
from snapcoord.coordinator.auth.authfile import AuthFile, AuthFileError, parse, token_sha256
from snapcoord.coordinator.auth.policy import Access, Kind, Principal, Role, decide
from snapcoord.coordinator.auth.rules import RULES
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2

_MODULES = (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2)


def _api_methods() -> set[str]:
    """Every RPC of the snapcoord.v1 services, from the proto descriptors."""
    return {
        f"/{service.full_name}/{method.name}"
        for module in _MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        if service.full_name in api.SERVICE_NAMES
        for method in service.methods
    }


def test_every_rpc_in_the_proto_has_an_access_rule_and_no_rule_is_stale() -> None:
    assert set(RULES) == _api_methods()


def test_every_rule_names_fields_its_request_has() -> None:
    """Each rule's id extractor runs on an empty request of its RPC (a renamed field would raise)."""
    for module in _MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                rule = RULES[f"/{service.full_name}/{method.name}"]
                request_class = getattr(module, method.input_type.name)
                ids = list(rule.ids(request_class()))
                if not rule.access.filters:
                    assert ids, f"{method.name} names no id: scopes could not restrict it"


def test_read_rpcs_do_not_mutate_and_admin_rpcs_are_the_documented_two() -> None:
    """The proto's NO_SIDE_EFFECTS RPCs are exactly the ones the access rules treat as reads."""
    reads = {
        f"/{service.full_name}/{method.name}"
        for module in _MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
        if method.GetOptions().idempotency_level == MethodOptions.NO_SIDE_EFFECTS
    }
    assert "/snapcoord.v1.SnapshotService/ReadCheckpoint" in reads
    for path, rule in RULES.items():
        assert rule.access.mutates == (path not in reads), path
    assert {p.rsplit("/", 1)[1] for p, r in RULES.items() if r.access.admin_only} == {
        "SetRetentionPolicy",
        "ClearBacklog",
    }


WRITE = Access(mutates=True)
READ = Access(mutates=False)
TEAM_A = Principal("a", Role.WRITER, {Kind.APP_ID: ("team-a-",)})


def test_a_writer_inside_its_scope_is_allowed() -> None:
    assert decide(TEAM_A, "M", WRITE, [(Kind.APP_ID, "team-a-x")]).allowed


def test_a_writer_outside_its_scope_is_refused_naming_the_id() -> None:
    d = decide(TEAM_A, "M", WRITE, [(Kind.APP_ID, "team-a-x"), (Kind.APP_ID, "team-b-x")])
    assert not d.allowed and d.refused == (Kind.APP_ID, "team-b-x")
    assert "'team-b-x'" in d.message and "'team-a-'" in d.message


def test_a_kind_the_scopes_do_not_list_covers_no_id() -> None:
    d = decide(TEAM_A, "M", WRITE, [(Kind.JOB_ID, "team-a-job")])
    assert not d.allowed and "no job_id scope" in d.message


def test_an_unscoped_writer_covers_every_id_but_not_admin_rpcs() -> None:
    writer = Principal("w", Role.WRITER)
    assert decide(writer, "M", WRITE, [(Kind.JOB_ID, "anything")]).allowed
    assert not decide(writer, "M", Access(mutates=True, admin_only=True), [(Kind.JOB_ID, "x")]).allowed


def test_a_reader_reads_but_never_mutates() -> None:
    reader = Principal("r", Role.READER, {Kind.APP_ID: ("",)})
    assert decide(reader, "M", READ, [(Kind.APP_ID, "x")]).allowed
    assert not decide(reader, "M", WRITE, [(Kind.APP_ID, "x")]).allowed


def test_an_admin_ignores_scopes() -> None:
    admin = Principal("o", Role.ADMIN, {Kind.APP_ID: ("nothing-",)})
    assert decide(admin, "M", Access(mutates=True, admin_only=True), [(Kind.APP_ID, "x")]).allowed


# --- the auth file --------------------------------------------------------------------------------

HASH = hashlib.sha256(b"s3cret").hexdigest()


def test_yaml_and_json_give_the_same_table() -> None:
    yaml_text = f"""
principals:
  - name: a
    role: writer
    token_sha256: {HASH}
    cert: [a-driver, spiffe://x/a]
    scopes:
      app_id: [team-a-]
"""
    entry = {
        "name": "a",
        "role": "writer",
        "token_sha256": HASH,
        "cert": ["a-driver", "spiffe://x/a"],
        "scopes": {"app_id": ["team-a-"]},
    }
    json_text = json.dumps({"principals": [entry]})
    for text in (yaml_text, json_text):
        table = parse(text)
        principal = table.for_token("s3cret")
        assert principal == Principal("a", Role.WRITER, {Kind.APP_ID: ("team-a-",)})
        assert table.for_cert(["spiffe://x/a"]) == principal
        assert table.for_token("S3CRET") is None
    assert token_sha256("s3cret") == HASH


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ({"name": "a", "role": "writer", "token": "s3cret"}, "never the token"),
        ({"name": "a", "role": "writer", "token_sha256": "abc"}, "64 hex digits"),
        ({"name": "a", "role": "root", "token_sha256": HASH}, "reader, writer, admin"),
        ({"name": "a", "role": "writer"}, "needs a credential"),
        (
            {"name": "a", "role": "writer", "cert": "x", "scopes": {"team": ["a"]}},
            "unknown scope kind 'team'",
        ),
        ({"name": "a", "role": "writer", "cert": "x", "expires": 1}, "unknown key(s) expires"),
        # Present but empty (its lines commented out) is no scope at all, not "every id".
        ({"name": "a", "role": "writer", "cert": "x", "scopes": None}, "'scopes' is empty"),
        ({"role": "writer", "cert": "x"}, "'name'"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(entry: dict[str, object], complaint: str) -> None:
    with pytest.raises(AuthFileError) as e:
        parse(json.dumps({"principals": [entry]}), source="auth.json")
    assert complaint in str(e.value) and "auth.json: principals[0]" in str(e.value)
    assert "s3cret" not in str(e.value)


def test_scopes_whose_lines_are_all_commented_out_are_refused() -> None:
    """YAML reads such a key as null, which once meant unscoped: every id of every team."""
    text = "principals:\n  - name: a\n    role: writer\n    cert: x\n    scopes:\n    #  app_id: [team-a-]\n"
    with pytest.raises(AuthFileError, match="'scopes' is empty"):
        parse(text)


def test_a_token_hash_or_certificate_listed_twice_is_refused() -> None:
    twice = (
        f"principals: [{{name: a, role: admin, token_sha256: {HASH}}}, "
        f"{{name: b, role: reader, token_sha256: {HASH}}}]"
    )
    with pytest.raises(AuthFileError, match="also 'a'"):
        parse(twice)
    with pytest.raises(AuthFileError, match="also 'a'"):
        parse("principals: [{name: a, role: admin, cert: x}, {name: b, role: reader, cert: x}]")


def test_the_file_is_reread_when_it_changes_and_a_bad_change_keeps_the_old_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "auth.yaml"
    path.write_text(f"principals: [{{name: a, role: admin, token_sha256: {HASH}}}]")
    auth = AuthFile(path)
    assert auth.table().for_token("s3cret") is not None
    path.write_text("principals: [{name: a, role: admin}]")  # no credential: refused
    with caplog.at_level(logging.ERROR):
        assert auth.table().for_token("s3cret") is not None
        assert auth.table().for_token("s3cret") is not None
    assert sum("keeping the previous one" in r.getMessage() for r in caplog.records) == 1
    path.write_text(f"principals: [{{name: b, role: reader, token_sha256: {token_sha256('other')}}}]")
    assert auth.table().for_token("s3cret") is None
    assert auth.table().for_token("other") == Principal("b", Role.READER)


def test_an_unreadable_auth_file_fails_the_start(tmp_path: Path) -> None:
    with (
        embedded_deps(tmp_path) as deps,
        pytest.raises(AuthFileError, match="cannot read the auth file"),
        serve_in_process(deps, auth_file=str(tmp_path / "missing.yaml")),
    ):
        pass


def test_a_plaintext_server_starts_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), embedded_deps(tmp_path) as deps, serve_in_process(deps):
        pass
    warnings = [r.getMessage() for r in caplog.records if "access control is off" in r.getMessage()]
    assert len(warnings) == 1, warnings
