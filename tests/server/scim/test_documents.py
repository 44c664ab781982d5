"""What a provider sends, read into what llmgw keeps: filters, PATCH paths, documents
and PATCH operations, as Microsoft Entra ID, Okta and RFC 7644's examples write them."""

from __future__ import annotations

import pytest

from llmgw.server.refusal import Refusal
from llmgw.server.scim.documents import (
    PATCH_OP,
    GroupFields,
    UserFields,
    patch_group,
    patch_user,
    read_group,
    read_patch,
    read_user,
)
from llmgw.server.scim.paths import Path, Term, parse_filter, parse_path


def ops(*operations: dict[str, object]) -> dict[str, object]:
    return {"schemas": [PATCH_OP], "Operations": list(operations)}


def test_a_filter_is_eq_terms_joined_by_and_names_case_insensitive() -> None:
    assert parse_filter('userName eq "Bob@Example.com" AND externalId eq "x1"') == (
        Term("username", "Bob@Example.com"),
        Term("externalid", "x1"),
    )
    assert parse_filter("active eq false") == (Term("active", False),)
    assert parse_filter('members[value eq "p1"]') == (Term("members.value", "p1"),)
    qualified = 'urn:ietf:params:scim:schemas:core:2.0:User:userName eq "a"'
    assert parse_filter(qualified) == (Term("username", "a"),)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('userName co "a"', "only eq"),
        ('userName eq "a" or userName eq "b"', "is not ATTR eq VALUE"),
        ("userName eq 3", "is not ATTR eq VALUE"),
        ("userName", "is not ATTR eq VALUE"),
    ],
)
def test_a_filter_llmgw_does_not_take_is_refused_saying_what_it_takes(text: str, said: str) -> None:
    with pytest.raises(Refusal) as refused:
        parse_filter(text)
    assert refused.value.status == 400 and refused.value.code == "invalidFilter"
    assert said in refused.value.message and "ATTR eq" in refused.value.message


def test_a_patch_path_is_an_attribute_a_sub_attribute_or_values_picked_by_a_filter() -> None:
    assert parse_path("displayName") == Path("displayname")
    assert parse_path("name.givenName") == Path("name", (), "givenname")
    assert parse_path('members[value eq "p1"]') == Path("members", (Term("value", "p1"),))
    assert parse_path('emails[type eq "work"].value') == Path(
        "emails", (Term("type", "work"),), "value"
    )
    assert parse_path("urn:ietf:params:scim:schemas:core:2.0:User:active") == Path("active")


def test_a_user_is_read_lower_cased_with_its_primary_email_and_what_is_not_kept_left_aside() -> (
    None
):
    user = read_user(
        {
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
            "userName": "Alice@Example.com",
            "name": {"givenName": "Alice", "familyName": "Liddell"},
            "emails": [{"value": "a@home.org"}, {"value": "a@work.org", "primary": True}],
            "title": "Engineer",
            "externalId": "00u1",
            "active": "True",
        }
    )
    assert user == UserFields("alice@example.com", "Alice Liddell", "a@work.org", True, "00u1")
    with pytest.raises(Refusal, match="userName is required"):
        read_user({"displayName": "nobody"})
    with pytest.raises(Refusal, match="active: true or false"):
        read_user({"userName": "a", "active": "maybe"})


def test_entra_ids_patches_of_a_user_apply_in_order() -> None:
    user = UserFields("alice", "Alice", "a@x.org", True, "e1")
    changed = patch_user(
        user,
        read_patch(
            ops(
                {"op": "Replace", "path": "displayName", "value": "Alice L."},
                {"op": "Add", "path": 'emails[type eq "work"].value', "value": "al@x.org"},
                {"op": "Replace", "value": {"active": "False", "name.familyName": "L."}},
                {
                    "op": "Replace",
                    "path": "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User:department",
                    "value": "R&D",
                },
            )
        ),
    )
    assert changed == UserFields("alice", "Alice L.", "al@x.org", False, "e1")
    removed = patch_user(changed, read_patch(ops({"op": "remove", "path": "externalId"})))
    assert removed.external_id is None
    # A person is active or not: removing active makes them active again.
    assert patch_user(changed, read_patch(ops({"op": "remove", "path": "active"}))).active


@pytest.mark.parametrize(
    ("operation", "kind"),
    [
        ({"op": "remove", "path": "userName"}, "mutability"),
        ({"op": "add", "path": "groups", "value": [{"value": "g"}]}, "mutability"),
        ({"op": "replace", "path": "active", "value": 3}, "invalidValue"),
        ({"op": "move", "path": "active", "value": True}, "invalidSyntax"),
        ({"op": "remove"}, "noTarget"),
    ],
)
def test_a_patch_that_cannot_apply_is_refused_with_scims_type(
    operation: dict[str, object], kind: str
) -> None:
    with pytest.raises(Refusal) as refused:
        patch_user(UserFields("alice"), read_patch(ops(operation)))
    assert refused.value.status == 400 and refused.value.code == kind


def test_a_patch_names_its_schema() -> None:
    with pytest.raises(Refusal, match="PatchOp"):
        read_patch({"Operations": [{"op": "add", "path": "active", "value": True}]})


def test_members_are_added_once_removed_by_filter_or_by_entras_value_and_replaced() -> None:
    group = read_group({"displayName": "eng", "members": [{"value": "p1"}, {"value": "p1"}]})
    assert group == GroupFields("eng", None, ("p1",))

    def apply(*operations: dict[str, object]) -> tuple[str, ...]:
        return patch_group(group, read_patch(ops(*operations))).members

    assert apply({"op": "add", "path": "members", "value": [{"value": "p2"}, {"value": "p1"}]}) == (
        "p1",
        "p2",
    )
    grown = GroupFields("eng", None, ("p1", "p2", "p3"))
    assert patch_group(
        grown, read_patch(ops({"op": "remove", "path": 'members[value eq "p2"]'}))
    ).members == ("p1", "p3")
    assert patch_group(
        grown,
        read_patch(ops({"op": "Remove", "path": "members", "value": [{"value": "p3"}]})),
    ).members == ("p1", "p2")
    assert patch_group(grown, read_patch(ops({"op": "remove", "path": "members"}))).members == ()
    assert apply({"op": "replace", "path": "members", "value": [{"value": "p9"}]}) == ("p9",)
    renamed = patch_group(
        group, read_patch(ops({"op": "replace", "value": {"displayName": "ml", "externalId": "x"}}))
    )
    assert (renamed.name, renamed.external_id) == ("ml", "x")
    with pytest.raises(Refusal, match="displayName is required"):
        patch_group(group, read_patch(ops({"op": "remove", "path": "displayName"})))
