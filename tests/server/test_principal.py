"""``Principal``: roles in rising order (viewer < operator < admin), each reaching what
the ones below it may; an anonymous caller reaches none; the control plane's own work
every one."""

from __future__ import annotations

import pytest

from llmgw.server.principal import ROLES, Principal, Role, is_role


def test_the_roles_rise_viewer_operator_admin() -> None:
    assert ROLES == ("viewer", "operator", "admin")


@pytest.mark.parametrize(
    ("role", "reaches"),
    [
        ("viewer", {"viewer"}),
        ("operator", {"viewer", "operator"}),
        ("admin", {"viewer", "operator", "admin"}),
    ],
)
def test_each_role_reaches_its_own_and_those_below(role: Role, reaches: set[str]) -> None:
    caller = Principal(f"{role}@10.0.0.5", role, "session")
    assert {r for r in ROLES if caller.may(r)} == reaches


def test_an_anonymous_caller_may_nothing_and_is_named_by_its_address() -> None:
    caller = Principal.anonymous("10.0.0.5")
    assert (caller.name, caller.role, caller.via) == ("anonymous@10.0.0.5", None, "anonymous")
    assert not any(caller.may(r) for r in ROLES)


def test_the_control_planes_own_work_may_everything_under_its_name() -> None:
    reconciler = Principal.system("reconciler")
    assert (reconciler.name, reconciler.via) == ("reconciler", "system")
    assert all(reconciler.may(r) for r in ROLES)


def test_is_role_knows_only_the_three() -> None:
    assert [is_role(r) for r in ("viewer", "operator", "admin")] == [True, True, True]
    assert not any(is_role(r) for r in ("Admin", "root", "", "owner"))


def test_a_principal_is_a_frozen_value() -> None:
    a = Principal("admin@x", "admin", "token")
    b = Principal("admin@x", "admin", "token")
    assert a == b and hash(a) == hash(b) and a != Principal("admin@x", "admin", "session")
    with pytest.raises(AttributeError):
        a.role = "viewer"  # type: ignore[misc]
