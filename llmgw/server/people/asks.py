"""The typed requests of people, organisations, teams, projects, memberships and limits,
with the rules of every field (read by ``schema.read``, written into the OpenAPI
document).

A login is what a person signs in as: lower-case letters, digits and ``. _ @ + -``
(an e-mail address fits), 128 at most. An organisation's, team's or project's name is
letters, digits, spaces, ``. _ -``, 64 at most, starting with a letter or digit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw.server.principal import OrgRole, Role
from llmgw.server.requests import MAX_BUDGET, MAX_RATE, MODEL_PATTERN
from llmgw.server.schema import Spec, spec

LOGIN = re.compile(r"[a-z0-9][a-z0-9._@+-]{0,127}")
LOGIN_WORDS = "lower-case letters, digits, '.', '_', '@', '+' or '-', up to 128"
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}")
GROUP_WORDS = "letters, digits, spaces, '.', '_' or '-', up to 64, starting with a letter or digit"
# An MCP server's name (``SERVER`` of ``SERVER.TOOL``), the built-in one too.
SERVER_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}|llmgw:admin")
# An id or a name of a person, organisation, team or project.
REF = Spec(min_length=1, max_length=128)


def _name(doc: str) -> str:
    return spec(doc=doc, pattern=GROUP_NAME, pattern_doc=GROUP_WORDS, max_length=64)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class NewPerson:
    """An account for a person, who then signs in through the cluster's identity
    provider or with a personal token."""

    login: str = spec(doc="what they sign in as", pattern=LOGIN, pattern_doc=LOGIN_WORDS)
    name: str = spec("", doc="their full name", max_length=200)
    email: str = spec("", doc="their e-mail address", max_length=254)
    role: Role | None = spec(None, doc="their cluster role: viewer, operator or admin")


@dataclass(frozen=True)
class ChangePerson:
    """What changes of a person; fields left out stay as they are."""

    name: str | None = spec(None, max_length=200)
    email: str | None = spec(None, max_length=254)
    role: Role | None = spec(None, doc="their cluster role: viewer, operator or admin")
    # No cluster role at all: only their memberships give them anything.
    no_role: bool = spec(False, doc="take their cluster role away")
    active: bool | None = spec(
        None, doc="false: deactivated, their sessions and tokens end at once"
    )


@dataclass(frozen=True)
class NewToken:
    """A personal token for ctl and the API, shown once."""

    name: str = spec(doc="what it is for", min_length=1, max_length=64)
    days: int | None = spec(90, doc="days it lasts (none: until revoked)", minimum=1, maximum=3650)


@dataclass(frozen=True)
class NewOrg:
    name: str = _name("the organisation's name")


@dataclass(frozen=True)
class NewTeam:
    name: str = _name("the team's name")


@dataclass(frozen=True)
class NewProject:
    name: str = _name("the project's name")
    team: str = spec(doc="the team it belongs to (id or name)", min_length=1, max_length=128)


@dataclass(frozen=True)
class Rename:
    name: str = _name("the new name")


@dataclass(frozen=True)
class Member:
    """A person's membership of an organisation, or of one of its teams."""

    person: str = spec(doc="the person (id or login)", min_length=1, max_length=128)
    role: OrgRole = spec("member", doc="member, manager or admin")
    team: str | None = spec(None, doc="a team of the organisation (id or name)", max_length=128)


@dataclass(frozen=True)
class SetLimits:
    """Limits of an organisation, team or project; the tightest of every level wins.
    Fields left out stay as they are; ``clear`` names those to lift."""

    rpm: int | None = spec(None, doc="requests a minute", minimum=1, maximum=MAX_RATE)
    tpm: int | None = spec(None, doc="tokens a minute", minimum=1, maximum=MAX_RATE)
    budget: int | None = spec(None, doc="tokens a month", minimum=1, maximum=MAX_BUDGET)
    models: tuple[str, ...] | None = spec(
        None,
        doc="model name patterns it may use (all when empty)",
        max_items=256,
        items=Spec(pattern=MODEL_PATTERN, pattern_doc="a model name, * ? [...] allowed"),
    )
    tools: tuple[str, ...] | None = spec(
        None,
        doc="MCP tools granted, as SERVER.TOOL patterns (jira.*); an empty list closes it "
        "to every tool until `clear: [tools]` opens it",
        max_items=256,
        items=Spec(min_length=3, max_length=194),
    )
    guard: tuple[str, ...] | None = spec(
        None,
        doc="the guard policies that read what its keys send and get (each must exist)",
        max_items=32,
        items=Spec(min_length=1, max_length=64),
    )
    revoke_tools: str | None = spec(
        None,
        doc="an MCP server whose tools are taken from this level's grant and from every "
        "level and key beneath it",
        pattern=SERVER_NAME,
        pattern_doc="an MCP server's name (lower-case letters, digits, '_' or '-'; llmgw:admin)",
    )
    clear: tuple[str, ...] = spec(
        (),
        doc="limits to lift: rpm, tpm, budget, models, tools (says nothing of tools again), guard",
        max_items=6,
        items=Spec(max_length=8),
    )


@dataclass(frozen=True)
class SetKeyLimits(SetLimits):
    """A gateway key's own limits, tools and guard policies; a level's limits above it
    still bind it (the tightest wins). Fields left out stay as they are; ``clear`` names
    those to lift."""
