"""One real slapd for the LDAP tests of a worker (tests/support/slapd.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import slapd


@pytest.fixture(scope="session")
def directory_server() -> Iterator[slapd.Slapd]:
    """Debian's slapd serving the small directory; its absence fails the tests, loudly."""
    problem = slapd.missing()
    if problem:
        pytest.fail(problem)
    with slapd.running() as server:
        yield server
