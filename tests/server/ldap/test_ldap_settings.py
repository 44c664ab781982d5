"""LDAP sign-in's pure parts: the settings as ctl gives them (every bad value refused
naming its field), as the store keeps them (the password sealed), the maps from
groups to roles, the nested-group walk and the escaping of what a person types."""

from __future__ import annotations

import json
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw import pki
from llmgw.server.ldap.settings import (
    GROUP_FILTER,
    USER_FILTER,
    GroupMap,
    LdapSettings,
    checked_dn,
    checked_filter,
    checked_url,
    grants_for,
    group_name,
    map_json,
    parse_map,
)
from llmgw.server.ldap.steps import fill, walk_groups
from llmgw.server.people.directory import Directory, Snapshot
from llmgw.server.people.records import Org, Team
from llmgw.server.people.service import Grant
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store

SECRET = b"s" * 32
ML = "cn=ml-engineers,ou=groups,dc=example,dc=org"
OPS = "cn=ops,ou=groups,dc=example,dc=org"


@pytest.fixture
def directory() -> Directory:
    d = Directory(cast(Store, None))
    d.apply(
        Snapshot(
            orgs={"o1": Org("o1", "Acme"), "o2": Org("o2", "Globex")},
            teams={"t1": Team("t1", "o1", "ML"), "t2": Team("t2", "o2", "ML")},
        )
    )
    return d


def test_a_map_names_a_cluster_role_an_org_or_a_team_by_name_and_keeps_ids(
    directory: Directory,
) -> None:
    assert parse_map("ops=cluster:operator", directory) == GroupMap(
        "ops", "cluster", "", "operator"
    )
    assert parse_map("staff = acme : member", directory) == GroupMap("staff", "org", "o1", "member")
    assert parse_map("ml-engineers=Globex/ml:manager", directory) == GroupMap(
        "ml-engineers", "team", "t2", "manager"
    )
    # A whole DN as the group: its own '=' signs stay in it.
    assert parse_map(f"{ML}=o1/t1:admin", directory) == GroupMap(ML, "team", "t1", "admin")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("ops", "is not GROUP=ORG[/TEAM]:ROLE"),
        ("ops=cluster", "is not GROUP=ORG[/TEAM]:ROLE"),
        ("=cluster:admin", "is not GROUP=ORG[/TEAM]:ROLE"),
        ("ops=cluster:manager", "a cluster role is one of viewer, operator, admin"),
        ("ops=Acme:operator", "a role in an org or team is one of member, manager, admin"),
        ("ops=Initech:member", "no organisation 'Initech'"),
        ("ops=Acme/Sales:member", "Acme has no team 'Sales'"),
    ],
)
def test_a_bad_map_is_refused_saying_why(directory: Directory, text: str, said: str) -> None:
    with pytest.raises(Refusal) as refused:
        parse_map(text, directory)
    assert refused.value.status == 400 and refused.value.field == "maps"
    assert said in refused.value.message and repr(text.strip()) in refused.value.message


def test_groups_meet_maps_by_cn_or_dn_in_any_case_and_a_removed_team_gives_nothing(
    directory: Directory,
) -> None:
    maps = (
        GroupMap("ML-Engineers", "team", "t1", "manager"),
        GroupMap(OPS.upper(), "cluster", "", "operator"),
        GroupMap("ml-engineers", "team", "gone", "admin"),
        GroupMap("nobody-is-here", "org", "o2", "member"),
    )
    grants = grants_for([ML, "cn=ops, ou=groups, dc=example, dc=org"], maps, directory)
    assert grants == [Grant("manager", "team", "t1"), Grant("operator", "cluster", "")]
    assert map_json(maps[2], directory)["target"] == "(removed team gone)"
    assert map_json(maps[0], directory) == {
        "group": "ML-Engineers",
        "target": "Acme/ML",
        "role": "manager",
    }


def test_a_group_s_name_is_its_first_rdn_value_unescaped() -> None:
    assert group_name(ML) == "ml-engineers"
    assert group_name(r"cn=R\2cD,ou=groups,dc=x") == "R,D"
    assert group_name(r"cn=Smith\, J,ou=x") == "Smith, J"


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("ldap://dir.example.org", "ldap://dir.example.org"),
        ("ldaps://dir.example.org:1636/", "ldaps://dir.example.org:1636"),
        ("ldap://[::1]:389", "ldap://[::1]:389"),
    ],
)
def test_a_url_is_ldap_or_ldaps_with_a_host(url: str, kept: str) -> None:
    assert checked_url(url) == kept


@pytest.mark.parametrize(
    "url",
    ["http://dir", "ldap://", "dir.example.org", "ldap://dir/dc=x", "ldap://u@dir", "ldap://d:x"],
)
def test_another_url_is_refused(url: str) -> None:
    with pytest.raises(Refusal) as refused:
        checked_url(url)
    assert refused.value.field == "url"


def test_dns_and_filters_are_checked() -> None:
    assert checked_dn("base_dn", " dc=example,dc=org ") == "dc=example,dc=org"
    for bad in ("", "example.org", "dc=example,,"):
        with pytest.raises(Refusal) as refused:
            checked_dn("base_dn", bad)
        assert refused.value.field == "base_dn"
    assert checked_filter("user_filter", USER_FILTER, ["{login}"]) == USER_FILTER
    for bad in ("uid={login}", "(uid={login}", "(uid=x))(", "(uid=alice)"):
        with pytest.raises(Refusal) as refused:
            checked_filter("user_filter", bad, ["{login}"])
        assert refused.value.field == "user_filter"


def test_the_store_keeps_the_password_sealed_and_it_comes_back() -> None:
    settings = LdapSettings(
        "ldap://d",
        "cn=r,dc=x",
        "hunter2-secret",
        "dc=x",
        USER_FILTER,
        "dc=x",
        GROUP_FILTER,
        maps=(GroupMap("ops", "cluster", "", "admin"),),
    )
    raw = settings.to_store(SECRET)
    assert "hunter2-secret" not in raw and "hunter2-secret" not in repr(settings)
    assert json.loads(raw)["bind_password"].startswith("sealed1:")
    assert LdapSettings.from_store(raw, SECRET) == settings
    # Another cluster's key does not open it; an empty document is LDAP off.
    with pytest.raises(pki.PKIError):
        LdapSettings.from_store(raw, b"t" * 32)
    assert LdapSettings.from_store("", SECRET) is None


def test_what_a_person_types_reaches_a_filter_escaped() -> None:
    assert fill(USER_FILTER, login="*") == r"(uid=\2a)"
    assert fill(USER_FILTER, login="a)(uid=*") == r"(uid=a\29\28uid=\2a)"
    assert (
        fill(GROUP_FILTER, dn="cn=x (y),dc=z")
        == r"(|(member=cn=x \28y\29,dc=z)(uniqueMember=cn=x \28y\29,dc=z))"
    )


def test_nested_groups_are_walked_up_each_once_through_a_loop() -> None:
    held_by = {"a": ["b"], "b": ["c", "a"], "c": ["A"], "d": []}
    asked: list[list[str]] = []

    def holders(dns: list[str]) -> list[str]:
        asked.append(dns)
        return [h for dn in dns for h in held_by.get(dn, [])]

    assert walk_groups(["a", "d"], holders) == ["a", "d", "b", "c"]
    # Each level asked once, a group never twice ("A" is "a" in another case).
    assert asked == [["a", "d"], ["b"], ["c"]]


def test_the_walk_stops_at_its_depth_and_at_its_most_groups() -> None:
    def chain(dns: list[str]) -> list[str]:
        return [str(int(dn) + 1) for dn in dns]

    assert walk_groups(["0"], chain, depth=3) == ["0", "1", "2", "3"]
    assert (
        len(walk_groups(["0"], lambda dns: [f"{d}.{i}" for d in dns for i in range(10)], most=25))
        == 25
    )


@given(st.text(max_size=40))
def test_no_typed_login_leaves_a_filter_unbalanced_or_adds_a_wildcard(login: str) -> None:
    query = fill(USER_FILTER, login=login)
    assert query.count("(") == query.count(")") == 1
    assert "*" not in query
