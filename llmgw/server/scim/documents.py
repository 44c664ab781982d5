"""What an identity provider sends, read into what llmgw keeps: a User's or Group's
document (POST, PUT) into ``UserFields`` or ``GroupFields``, and a PATCH's operations
applied to them. Pure: the service looks people up and writes.

A user is a person: ``userName`` their login (lower-cased: SCIM compares it without
case), ``displayName`` their name, one e-mail address (the primary one, else the first),
``active``, and the provider's ``externalId``. A group has its ``displayName``, its
``externalId`` and its members' ids. Attributes llmgw keeps nothing of (``name``,
``title``, an enterprise extension's) are taken and left aside, as RFC 7644 3.3 lets a
service provider, so a provider that sends them is not refused. Removing ``active``
makes the person active again: a person is active or not. What cannot be read is a
``Refusal`` whose code is SCIM's ``scimType`` (``invalidValue``, ``invalidSyntax``,
``mutability``, ``invalidPath``), naming the attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from llmgw.server.refusal import Refusal
from llmgw.server.scim.paths import Path, bare, parse_path

PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
Op = Literal["add", "replace", "remove"]
# The most operations one PATCH may carry.
MAX_OPERATIONS = 1000


@dataclass(frozen=True)
class UserFields:
    user_name: str
    display_name: str = ""
    email: str = ""
    active: bool = True
    external_id: str | None = None


@dataclass(frozen=True)
class GroupFields:
    name: str
    external_id: str | None = None
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Operation:
    op: Op
    path: Path | None
    value: object


def invalid(message: str) -> Refusal:
    return Refusal(400, "invalidValue", message)


def _object(doc: object, what: str) -> Mapping[str, object]:
    if not isinstance(doc, Mapping):
        raise Refusal(400, "invalidSyntax", f"{what} is not a JSON object")
    return {bare(str(k)): v for k, v in doc.items()}


def _text(value: object, name: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise invalid(f"{name}: a {'' if empty else 'non-empty '}string is needed")
    return value.strip()


def _optional_text(value: object, name: str) -> str | None:
    return None if value is None else _text(value, name)


def _bool(value: object, name: str) -> bool:
    # Microsoft Entra ID sends "True" and "False" as strings.
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise invalid(f"{name}: true or false is needed")
    return value


def _email(value: object) -> str:
    """The address of a list of emails (the primary, else the first), or of one."""
    items = value if isinstance(value, list) else [value]
    found = [_object(i, "an email") for i in items if i is not None]
    if not found:
        return ""
    chosen = next((i for i in found if i.get("primary") is True), found[0])
    return _text(chosen.get("value", ""), "emails.value")


def _display(doc: Mapping[str, object]) -> str:
    if "displayname" in doc and doc["displayname"] is not None:
        return _text(doc["displayname"], "displayName")
    name = doc.get("name")
    if isinstance(name, Mapping):
        parts = {bare(str(k)): v for k, v in name.items()}
        if isinstance(parts.get("formatted"), str):
            return str(parts["formatted"]).strip()
        given = [parts.get(k) for k in ("givenname", "familyname")]
        return " ".join(str(p).strip() for p in given if isinstance(p, str) and p.strip())
    return ""


def read_user(doc: object) -> UserFields:
    """A User's document (POST, PUT): what it says, all of it."""
    found = _object(doc, "the User")
    if "username" not in found:
        raise invalid("userName is required: the login the person signs in as")
    return UserFields(
        user_name=_text(found["username"], "userName", empty=False).lower(),
        display_name=_display(found),
        email=_email(found.get("emails")),
        active=True if found.get("active") is None else _bool(found["active"], "active"),
        external_id=_optional_text(found.get("externalid"), "externalId"),
    )


def _member_ids(value: object) -> list[str]:
    items = value if isinstance(value, list) else [value]
    ids: list[str] = []
    for item in items:
        if item is None:
            continue
        member = _object(item, "a member")
        ids.append(_text(member.get("value"), "members.value", empty=False))
    return ids


def read_group(doc: object) -> GroupFields:
    """A Group's document (POST, PUT)."""
    found = _object(doc, "the Group")
    if "displayname" not in found:
        raise invalid("displayName is required: the group's name, which `ctl auth scim map` maps")
    return GroupFields(
        name=_text(found["displayname"], "displayName", empty=False),
        external_id=_optional_text(found.get("externalid"), "externalId"),
        members=tuple(dict.fromkeys(_member_ids(found.get("members")))),
    )


def read_patch(doc: object) -> list[Operation]:
    """A PatchOp's operations, in order."""
    found = _object(doc, "the PATCH")
    schemas = found.get("schemas")
    if not isinstance(schemas, list) or PATCH_OP not in schemas:
        raise Refusal(400, "invalidSyntax", f"a PATCH names the schema {PATCH_OP}")
    ops = found.get("operations")
    if not isinstance(ops, list) or not ops:
        raise Refusal(400, "invalidSyntax", "Operations: a list of at least one is needed")
    if len(ops) > MAX_OPERATIONS:
        raise Refusal(400, "tooMany", f"Operations: at most {MAX_OPERATIONS} in one PATCH")
    out: list[Operation] = []
    for raw in ops:
        op = _object(raw, "an operation")
        name = str(op.get("op", "")).lower()
        if name not in ("add", "replace", "remove"):
            raise Refusal(
                400, "invalidSyntax", f"op: {op.get('op')!r} is not add, replace or remove"
            )
        path = op.get("path")
        if path is not None and not isinstance(path, str):
            raise Refusal(400, "invalidPath", "path: a string is needed")
        parsed = parse_path(path) if path else None
        if parsed is None and name == "remove":
            raise Refusal(400, "noTarget", "a remove names its path")
        value = op.get("value")
        if parsed is None and not isinstance(value, Mapping):
            raise invalid("an operation without a path takes an object of attributes")
        out.append(Operation(name, parsed, value))  # type: ignore[arg-type]
    return out


def _spread(operation: Operation) -> list[Operation]:
    """An operation without a path as one per attribute of its value."""
    if operation.path is not None:
        return [operation]
    assert isinstance(operation.value, Mapping)
    return [Operation(operation.op, parse_path(str(k)), v) for k, v in operation.value.items()]


def patch_user(user: UserFields, operations: list[Operation]) -> UserFields:
    for operation in (o for each in operations for o in _spread(each)):
        user = _patch_user(user, operation)
    return user


def _patch_user(user: UserFields, o: Operation) -> UserFields:
    assert o.path is not None
    attr, removing = o.path.attr, o.op == "remove"
    if attr == "username":
        if removing:
            raise Refusal(400, "mutability", "userName is required; it cannot be removed")
        return replace(user, user_name=_text(o.value, "userName", empty=False).lower())
    if attr == "displayname":
        return replace(user, display_name="" if removing else _text(o.value, "displayName"))
    if attr == "externalid":
        return replace(
            user, external_id=None if removing else _optional_text(o.value, "externalId")
        )
    if attr == "active":
        return replace(user, active=True if removing else _bool(o.value, "active"))
    if attr == "emails":
        if removing:
            return replace(user, email="")
        if o.path.sub == "value":
            return replace(user, email=_text(o.value, "emails.value"))
        return replace(user, email=_email(o.value))
    if attr == "name" and o.path.sub == "formatted" and not removing:
        return replace(user, display_name=_text(o.value, "name.formatted"))
    if attr in ("groups", "id", "meta"):
        raise Refusal(
            400,
            "mutability",
            f"{attr} is read-only"
            + ("; a person's groups change through /Groups" if attr == "groups" else ""),
        )
    return user


def patch_group(group: GroupFields, operations: list[Operation]) -> GroupFields:
    for operation in (o for each in operations for o in _spread(each)):
        group = _patch_group(group, operation)
    return group


def _patch_group(group: GroupFields, o: Operation) -> GroupFields:
    assert o.path is not None
    attr = o.path.attr
    if attr == "displayname":
        if o.op == "remove":
            raise Refusal(400, "mutability", "displayName is required; it cannot be removed")
        return replace(group, name=_text(o.value, "displayName", empty=False))
    if attr == "externalid":
        gone = o.op == "remove"
        return replace(group, external_id=None if gone else _optional_text(o.value, "externalId"))
    if attr == "members":
        return replace(group, members=_members(group.members, o))
    if attr in ("id", "meta"):
        raise Refusal(400, "mutability", f"{attr} is read-only")
    return group


def _members(members: tuple[str, ...], o: Operation) -> tuple[str, ...]:
    assert o.path is not None
    picked = {str(t.value) for t in o.path.where if t.attr == "value"}
    if o.path.where and not picked:
        raise Refusal(400, "invalidFilter", 'members[...]: llmgw picks members by value eq "ID"')
    if o.op == "remove":
        if picked:
            gone = picked
        elif o.value is not None:
            # Microsoft Entra ID names the members to remove in the value.
            gone = set(_member_ids(o.value))
        else:
            return ()
        return tuple(m for m in members if m not in gone)
    given = _member_ids(o.value)
    if o.op == "replace":
        kept = [m for m in members if m not in picked] if picked else []
        return tuple(dict.fromkeys([*kept, *given]))
    return tuple(dict.fromkeys([*members, *given]))
