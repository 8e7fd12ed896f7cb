"""Tether's SQLite, on Tether's connections only.

DBOS needs SQLite 3.42 or newer; some interpreters have an older one (3.40 here, Python
3.12.1 from pyenv), and then the newer one of `pysqlite3-binary` is used. Tether's store
connections are also set up for many small commits (`tuned`). Both are done to the
connections Tether makes and to no other: a library must leave its host alone, and Tether
used to replace `sys.modules["sqlite3"]` for the whole process and to tune every SQLAlchemy
engine's SQLite connections, the host application's own databases included.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError


def sqlite_dbapi() -> Any:
    """The SQLite that Tether's own connections use: the interpreter's when it is 3.42 or newer
    (DBOS needs it), else the newer one of `pysqlite3-binary`. Only Tether's connections use it
    (`sqlite_engine_kwargs`, `scoped_sqlite`): the process's `sqlite3` module is left as the
    host application has it. (Tether replaced `sys.modules["sqlite3"]` for the whole process.)"""
    import sqlite3

    if sqlite3.sqlite_version_info >= (3, 42):
        return sqlite3
    try:
        import pysqlite3.dbapi2  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError(
            f"a SQLite store needs SQLite 3.42+ (this Python has {sqlite3.sqlite_version}): "
            "pip install pysqlite3-binary, or use a postgresql:// store"
        ) from None
    return pysqlite3.dbapi2


def sqlite_engine_kwargs(url: str) -> dict[str, Any]:
    """What DBOS's engine on a SQLite store is made with: that SQLite (`sqlite_dbapi`), and
    connections set up for many small commits (`tuned`). On that engine alone: the host's
    own SQLite engines keep their settings (Tether's listener was on every engine)."""
    dbapi = sqlite_dbapi()
    path = url.removeprefix("sqlite:///")

    def connect() -> Any:
        return tuned(dbapi.connect(path, check_same_thread=False))

    return {"module": dbapi, "creator": connect}


def tuned(conn: Any) -> Any:
    """Write-ahead logging, synced at checkpoints rather than at every commit: a commit is
    then one append to the log, and it survives the process being killed at any point (the
    crash suite checks this); only the power failing can lose the last commits."""
    mode = conn.isolation_level
    conn.isolation_level = None  # PRAGMA journal_mode cannot run inside a transaction
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")  # wait out other writers, as DBOS does
    conn.isolation_level = mode
    return conn


@contextlib.contextmanager
def scoped_sqlite() -> Iterator[None]:
    """`sqlite3` as `sqlite_dbapi` while a DBOS client makes its engine (it takes no engine
    settings of ours; SQLAlchemy picks its driver module as the engine is made), and as the
    host had it again right after."""
    import sqlite3

    dbapi = sqlite_dbapi()
    if dbapi is sqlite3:
        yield
        return
    held = sys.modules["sqlite3"], sys.modules.get("sqlite3.dbapi2")
    sys.modules["sqlite3"] = sys.modules[dbapi.__name__.rpartition(".")[0]]  # the package
    sys.modules["sqlite3.dbapi2"] = dbapi
    try:
        yield
    finally:
        sys.modules["sqlite3"] = held[0]
        if held[1] is None:
            del sys.modules["sqlite3.dbapi2"]
        else:
            sys.modules["sqlite3.dbapi2"] = held[1]
