"""Principals, roles, id scopes and the decision for one call: pure, no I/O.

A principal has a role and, optionally, id scopes. Roles nest: ``reader`` may call the read RPCs,
``writer`` (a driver) also the mutating ones except the admin RPCs, ``admin`` everything on every
id. Scopes are id prefixes per kind (``producer_id``, ``app_id``, ``lease_id``, ``job_id``); a
principal without scopes covers every id, one with scopes covers only the ids that start with one
of the prefixes of that kind (a kind it does not list: no id of that kind).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    READER = "reader"
    WRITER = "writer"
    ADMIN = "admin"


class Kind(StrEnum):
    """The id kinds a scope can restrict."""

    PRODUCER_ID = "producer_id"
    APP_ID = "app_id"
    LEASE_ID = "lease_id"
    JOB_ID = "job_id"
    TABLE_ID = "table_id"


#: One id a request names: its kind and value.
IdRef = tuple[Kind, str]


@dataclass(frozen=True)
class Principal:
    """Who a call runs as. ``scopes`` None: every id; otherwise prefixes per kind."""

    name: str
    role: Role
    scopes: Mapping[Kind, tuple[str, ...]] | None = None

    def covers(self, kind: Kind, value: str) -> bool:
        """True when ``value`` (an id of ``kind``) is inside this principal's scopes."""
        if self.role is Role.ADMIN or self.scopes is None:
            return True
        return any(value.startswith(prefix) for prefix in self.scopes.get(kind, ()))


#: The principal of every call when access control is off (audit lines name it).
ANONYMOUS = Principal("anonymous", Role.ADMIN)


@dataclass(frozen=True)
class Access:
    """What an RPC needs: whether it changes state, and whether only an admin may call it."""

    mutates: bool
    admin_only: bool = False
    #: For a List RPC over every id of one kind: the kind its results are filtered on.
    filters: Kind | None = None


@dataclass(frozen=True)
class Decision:
    """Allowed, or refused with a message that names what was missing (never a secret)."""

    allowed: bool
    message: str = ""
    #: For the error's ErrorInfo metadata: the refused id's kind and value, when one was refused.
    refused: IdRef | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


ALLOW = Decision(True)


def decide(principal: Principal, method: str, access: Access, ids: Iterable[IdRef]) -> Decision:
    """May ``principal`` call ``method`` (with ``access``) on ``ids``?"""
    if access.admin_only and principal.role is not Role.ADMIN:
        return Decision(
            False, f"{method} needs role admin; principal {principal.name!r} has role {principal.role.value}"
        )
    if access.mutates and principal.role is Role.READER:
        return Decision(
            False,
            f"{method} changes state and needs role writer or admin; principal {principal.name!r} "
            "has role reader",
        )
    for kind, value in ids:
        if not principal.covers(kind, value):
            return Decision(
                False,
                f"{method}: {kind.value} {value!r} is outside the scopes of principal {principal.name!r}"
                f" ({_describe_scopes(principal, kind)})",
                refused=(kind, value),
            )
    return ALLOW


def _describe_scopes(principal: Principal, kind: Kind) -> str:
    prefixes = (principal.scopes or {}).get(kind, ())
    if not prefixes:
        return f"it has no {kind.value} scope"
    return f"its {kind.value} prefixes: {', '.join(repr(p) for p in prefixes)}"
