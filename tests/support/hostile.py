"""What a careless or hostile client sends, as Hypothesis strategies: any JSON value,
with numbers past every range a field takes and text no reader expects."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Text that has broken parsers before: a lone surrogate, NUL, a long run, a trailing
# newline (which Python's "$" lets through), a date among strings.
AWKWARD_TEXT = ["\ud800", "a\x00b", "x" * 5000, "abc\n", "2027-01-31"]


def json_values(max_leaves: int = 20, awkward: bool = True) -> st.SearchStrategy[Any]:
    """Any JSON value: scalars of every kind (whole numbers to ±10^20), lists and
    objects of them, nested."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(10**20), max_value=10**20)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=40)
    )
    if awkward:
        scalars = scalars | st.sampled_from(AWKWARD_TEXT)
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )
