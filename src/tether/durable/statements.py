"""One statement of the ledger on either store's DB-API connection: SQLite's, or psycopg's own
(`Ledger.connection`), with the same `:name` parameters; and which errors mean that the
connection, not the statement, failed (the ledger waits those out: `Ledger.call`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

Params = dict[str, Any] | list[dict[str, Any]]
Run = Callable[[str, Params], list[tuple[Any, ...]]]
"""Executes one statement (`:name` parameters) in the open transaction; the rows it returned.
With a list of parameters, the statement once for each (no rows)."""


def running(cursor: Any, postgres: bool = False) -> Run:
    """`Run` on a DB-API cursor (SQLite's connection is one too): `:name` parameters, which
    psycopg spells `%(name)s` (`pyformat`)."""

    def run(sql: str, params: Params) -> list[tuple[Any, ...]]:
        if postgres:
            sql = pyformat(sql)
        if isinstance(params, list):
            cursor.executemany(sql, params)
            return []
        found = cursor.execute(sql, params)
        if postgres and cursor.description is None:
            return []
        rows: list[tuple[Any, ...]] = found.fetchall()
        return rows

    return run


@functools.cache
def pyformat(sql: str) -> str:
    """A statement's `:name` parameters as psycopg's `%(name)s`; a `::` cast is left alone,
    and a `%` of its own (`LIKE 'a%'`) doubled, as psycopg reads it."""
    return NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


NAMED = re.compile(r"(?<![:\w]):(\w+)")


def connection_lost(e: Exception) -> bool:
    """Whether a Postgres call failed for want of its connection (the server went away, the
    network dropped it, no connection came free in time), not for what it asked."""
    import psycopg
    from sqlalchemy import exc

    if isinstance(e, (exc.OperationalError, exc.TimeoutError, psycopg.OperationalError)):
        return True
    return isinstance(e, exc.DBAPIError) and e.connection_invalidated
