"""``llmgw.jsonvalue``: each reader hands back the very value it was given when it has
the shape asked for, and raises TypeError naming what it found when it has not, as
indexing or ``int()`` would."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from llmgw.jsonvalue import JSON, as_int, as_list, as_object, as_str

# One value of each kind json.loads gives, by the name of its Python type.
DECODED: dict[str, JSON] = {
    "NoneType": json.loads("null"),
    "bool": json.loads("true"),
    "int": json.loads("7"),
    "float": json.loads("2.5"),
    "str": json.loads('"seven"'),
    "list": json.loads("[1, [2]]"),
    "dict": json.loads('{"a": {"b": 1}}'),
}


@pytest.mark.parametrize(
    ("reader", "kind", "words"),
    [
        (as_object, "dict", "a JSON object"),
        (as_list, "list", "a JSON array"),
        (as_str, "str", "a JSON string"),
    ],
    ids=["as_object", "as_list", "as_str"],
)
def test_a_reader_gives_back_its_kind_and_refuses_every_other(
    reader: Callable[[JSON], JSON], kind: str, words: str
) -> None:
    value = DECODED[kind]
    assert reader(value) is value  # the same object, not a copy: a reader narrows only
    for other, wrong in DECODED.items():
        if other == kind:
            continue
        with pytest.raises(TypeError) as caught:
            reader(wrong)
        assert str(caught.value) == f"expected {words}, got {other}"


def test_an_empty_object_array_and_string_are_still_their_kind() -> None:
    empty_object: JSON = {}
    empty_list: JSON = []
    assert as_object(empty_object) is empty_object
    assert as_list(empty_list) is empty_list
    assert as_str("") == ""


def test_as_object_lets_the_reader_index_what_it_narrowed() -> None:
    doc = json.loads('{"counts": {"k1": [3, 120]}, "term": "4"}')
    pair = as_list(as_object(as_object(doc)["counts"])["k1"])
    assert [as_int(v) for v in pair] == [3, 120]
    with pytest.raises(TypeError, match="expected a JSON array, got dict"):
        as_list(as_object(doc)["counts"])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (7, 7),
        (-3, -3),
        (2.9, 2),
        (-2.9, -2),
        ("41", 41),
        (" 8 ", 8),
        ("-5", -5),
        (True, 1),
        (False, 0),
    ],
)
def test_as_int_takes_a_number_numeric_text_or_a_bool_as_int_does(
    value: JSON, expected: int
) -> None:
    assert as_int(value) == expected == int(value)  # type: ignore[arg-type]
    assert type(as_int(value)) is int


@pytest.mark.parametrize("kind", ["NoneType", "list", "dict"])
def test_as_int_refuses_null_an_array_or_an_object_with_a_type_error(kind: str) -> None:
    with pytest.raises(TypeError) as caught:
        as_int(DECODED[kind])
    assert str(caught.value) == f"expected a number, got {kind}"


def test_as_int_raises_what_int_raises_for_text_that_is_no_whole_number() -> None:
    # Not a TypeError: the text is of the right kind, its content is wrong, as int() says.
    for text in ("seven", "2.5", ""):
        with pytest.raises(ValueError, match="invalid literal for int"):
            as_int(text)


def test_as_int_of_the_non_finite_numbers_json_loads_accepts() -> None:
    # json.loads reads NaN and Infinity by default; int() of them is no TypeError either.
    nan, inf = json.loads("NaN"), json.loads("-Infinity")
    assert math.isnan(nan) and math.isinf(inf)
    with pytest.raises(ValueError):
        as_int(nan)
    with pytest.raises(OverflowError):
        as_int(inf)
