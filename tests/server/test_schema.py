"""Typed requests: what ``schema.read`` takes and refuses, and that the JSON Schema it
writes says the same (checked both ways with Hypothesis)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.server import requests as typed
from llmgw.server.people import asks
from llmgw.server.schema import MAX_INT, Invalid, Spec, json_schema, read, read_query
from tests.support import hostile

REQUESTS = [
    obj
    for module in (typed, asks)
    for obj in vars(module).values()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
]

# Any JSON value, including the ones a careless client sends: wrong types, huge and
# negative numbers, deep nesting, lone surrogates, NUL.
json_values = hostile.json_values(max_leaves=20)


def test_every_request_type_is_found() -> None:
    names = {cls.__name__ for cls in REQUESTS}
    assert {"ServeRequest", "CreateKey", "ContextRequest", "Enroll", "LabelsRequest"} <= names
    assert {"NewPerson", "ChangePerson", "Member", "SetLimits"} <= names


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_anything_is_read_or_refused_by_name(cls: type, data: st.DataObject) -> None:
    """Whatever a client sends, ``read`` gives the type or an Invalid naming the field."""
    fields = [f.name for f in dataclasses.fields(cls)]
    body = data.draw(
        st.dictionaries(st.sampled_from(fields) | st.text(max_size=8), json_values, max_size=6)
        | json_values
    )
    try:
        value = read(cls, body)
    except Invalid as exc:
        assert isinstance(exc.field, str) and exc.message
        if exc.field:  # an unknown key as sent, or a path into a known field
            root = exc.field.split(".")[0].split("[")[0].split(" ")[0]
            assert exc.field in (body if isinstance(body, dict) else ()) or root in fields
        return
    assert isinstance(value, cls)
    _storable(dataclasses.asdict(value))


def _storable(value: Any) -> None:
    """What was read can be kept and read back: JSON and UTF-8 round trips, numbers in
    range and finite."""
    text = json.dumps(value, allow_nan=False)
    text.encode("utf-8")
    assert json.loads(text) == json.loads(json.dumps(value))
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            assert abs(v) <= MAX_INT


def _valid(tp: Any, rules: Spec) -> st.SearchStrategy[Any]:
    """Values of a field's type within its rules (the other side of the property)."""
    import typing

    args = typing.get_args(tp)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
        return st.none() | _valid(inner, rules)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, __import__("types").UnionType):
        return st.one_of(*(_valid(a, rules) for a in args))
    if dataclasses.is_dataclass(tp):
        return _bodies(tp)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if tp is bool:
        return st.booleans()
    if tp is int:
        low = int(rules.minimum) if rules.minimum is not None else -MAX_INT
        high = int(rules.maximum) if rules.maximum is not None else MAX_INT
        return st.integers(low, high)
    if tp is float:
        return st.floats(rules.minimum, rules.maximum, allow_nan=False, allow_infinity=False)
    if tp is str:
        size = rules.max_length or 64
        if rules.pattern is not None:
            text = st.from_regex(rules.pattern, fullmatch=True)
            return text.filter(lambda t: len(t) <= size and not t.endswith("\n"))
        return st.text(min_size=rules.min_length, max_size=min(size, 40)).filter(
            lambda t: "\x00" not in t
        )
    if origin in (tuple, list):
        most = min(rules.max_items or 4, 4)
        return st.lists(
            _valid(args[0], rules.items or Spec()), min_size=rules.min_items, max_size=most
        )
    if origin is dict:
        keys = _valid(str, rules.keys or Spec())
        most = min(rules.max_items or 3, 3)
        return st.dictionaries(keys, _valid(args[1], rules.items or Spec()), max_size=most)
    raise TypeError(tp)


def _bodies(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    import typing

    hints = typing.get_type_hints(cls)
    required, optional = {}, {}
    for f in dataclasses.fields(cls):
        rules = f.metadata.get("spec") or Spec()
        strategy = _valid(hints[f.name], rules)
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        (required if no_default else optional)[f.name] = strategy
    return st.fixed_dictionaries(required, optional=optional)


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_published_schema_and_the_checks_agree(cls: type, data: st.DataObject) -> None:
    """A body within the rules is read, and the JSON Schema published for the type takes
    it; any other body is refused by both or read by both."""
    validator = jsonschema.Draft202012Validator(json_schema(cls))
    good = data.draw(_bodies(cls))
    assert isinstance(read(cls, good), cls)
    assert validator.is_valid(good), list(validator.iter_errors(good))
    fields = [f.name for f in dataclasses.fields(cls)]
    other = data.draw(st.dictionaries(st.sampled_from(fields), json_values, max_size=4))
    if any(isinstance(v, str) and v.endswith("\n") for v in other.values()):
        return  # Python's "$" takes a final newline that ECMA's (the schema's) does not
    try:
        read(cls, other)
        taken = True
    except Invalid:
        taken = False
    assert validator.is_valid(other) == taken, other


def test_refusals_name_the_field_and_what_it_takes() -> None:
    with pytest.raises(Invalid) as info:
        read(typed.CreateKey, {"name": "ops", "rpm": 10**20})
    assert info.value.field == "rpm" and "from 1 to 1,000,000,000" in info.value.message
    with pytest.raises(Invalid) as info:
        read(typed.CreateKey, {"name": "ops", "expires": float("inf")})
    assert info.value.field == "expires"
    with pytest.raises(Invalid) as info:
        read(typed.CreateKey, {"name": "ops", "rmp": 5})
    assert info.value.field == "rmp" and "unknown field" in info.value.message
    with pytest.raises(Invalid) as info:
        read(typed.ServeRequest, {"source": "x", "profile": 7})
    assert info.value.field == "profile" and "string" in info.value.message
    with pytest.raises(Invalid) as info:
        read(typed.LabelsRequest, {"set": ["a", "b"]})
    assert info.value.field == "set" and "object" in info.value.message
    with pytest.raises(Invalid) as info:
        read(typed.ServeRequest, {"source": "x", "memory": -5})
    assert info.value.field == "memory"
    with pytest.raises(Invalid) as info:
        read(typed.ServeRequest, {"source": "x", "name": "tiny\n"})
    assert info.value.field == "name" and "letters, digits" in info.value.message
    with pytest.raises(Invalid) as info:
        read(typed.CreateKey, {"name": "a\ud800"})
    assert info.value.field == "name"
    with pytest.raises(Invalid) as info:
        read(typed.ExternalRequest, {"name": "x", "base_url": "https://a/v1", "keys": [{}]})
    assert info.value.field == "keys[0].key" and "required" in info.value.message
    with pytest.raises(Invalid) as info:
        read(typed.ServeRequest, [])
    assert info.value.field == "" and "JSON object" in info.value.message


def test_query_values_are_read_as_their_types() -> None:
    query = read_query(typed.PlanQuery, {"source": "hf:a/b", "context": "512", "allow_pickle": "1"})
    assert query.context == 512 and query.allow_pickle is True
    with pytest.raises(Invalid, match="whole number"):
        read_query(typed.PlanQuery, {"source": "hf:a/b", "context": "lots"})
    with pytest.raises(Invalid, match="unknown parameter"):
        read_query(typed.UsageQuery, {"dayz": "3"})
    with pytest.raises(Invalid, match="from 1 to 3,660"):
        read_query(typed.UsageQuery, {"days": "0"})


def test_the_schema_of_a_request_says_its_rules() -> None:
    schema = json_schema(typed.CreateKey)
    assert schema["required"] == ["name"] and schema["additionalProperties"] is False
    rpm = schema["properties"]["rpm"]
    assert rpm["anyOf"][0] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 10**9,
        "description": "requests a minute",
    }
    assert schema["properties"]["name"]["pattern"].startswith("^(?:")


def test_spec_takes_every_rule_spec_holds() -> None:
    import typing

    from llmgw.server.schema import Rules

    assert typing.get_type_hints(Rules) == typing.get_type_hints(Spec)
