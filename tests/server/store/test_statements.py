"""``pyformat``: a statement written once with ``?`` placeholders, as psycopg takes it.

The statements themselves run in the contract suite, on both backends; here is only
the translation, down to what a string literal holds.
"""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from llmgw.server.store.statements import pyformat
from tests.support.postgres import PostgresServer


@pytest.mark.parametrize(
    ("qmark", "format_"),
    [
        ("SELECT 1", "SELECT 1"),
        ("UPDATE t SET a = ?, b = ? WHERE id = ?", "UPDATE t SET a = %s, b = %s WHERE id = %s"),
        # A ? inside a literal is text, not a placeholder.
        ("SELECT '?' WHERE a = ?", "SELECT '?' WHERE a = %s"),
        # A quote doubled inside a literal neither ends it nor starts another.
        ("SELECT 'it''s ?', ?", "SELECT 'it''s ?', %s"),
        ("SELECT '', ?, ''", "SELECT '', %s, ''"),
        # psycopg reads every % of a statement with parameters, in literals too.
        ("SELECT a % 2, '5%' WHERE b = ?", "SELECT a %% 2, '5%%' WHERE b = %s"),
        ("SELECT '%s'", "SELECT '%%s'"),
    ],
)
def test_placeholders_become_psycopgs_and_literals_stay(qmark: str, format_: str) -> None:
    assert pyformat(qmark) == format_


def test_one_statement_gives_the_same_row_on_both_databases(postgres: PostgresServer) -> None:
    statement = "SELECT ?, '?', 'it''s 5% ?', ? || '%'"
    params = ("a", "b")
    want = ("a", "?", "it's 5% ?", "b%")
    db = sqlite3.connect(":memory:")
    try:
        assert db.execute(statement, params).fetchone() == want
    finally:
        db.close()
    with psycopg.connect(postgres.dsn()) as conn:
        assert conn.execute(pyformat(statement), params).fetchone() == want
