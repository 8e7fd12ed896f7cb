"""`tether migrate`: a store's records written before 0.1.0 (pickles) rewritten as records.

Versions before 0.1.0 kept a run's steps, and DBOS kept its inputs, result, messages and
events, as pickles; 0.1.0 reads records only (`records.py`) and refuses a pickle, because a
pickle is a program. A store written before then is rewritten here once, by its owner's
command, in one transaction a table:

- each pickle is read by `SafeUnpickler`, which builds Tether's message types, plain values
  and exceptions and nothing else: a pickle that names any other class or function (the way a
  planted one runs code) is not read, and its row is left as it was and named;
- the value is written back as a record (`records.dumps`, or DBOS's `RecordSerializer` with the
  row's `serialization` set to it).

What could not be read stays refused as before; the command says which rows and exits 1.
Running it again changes nothing more.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import io
import pickle
import sys
from typing import Any

import sqlalchemy as sa

from ..errors import ConfigError
from .formats import RECORD_FORMAT
from .ledger import ledger_url
from .records import TYPES, RecordSerializer, dumps

PICKLE = "py_pickle"
OURS = RecordSerializer().name()


class SafeUnpickler(pickle.Unpickler):
    """Builds `records.TYPES` (from `tether.messages`), plain values, and exceptions of the
    standard library's, Tether's and DBOS's: anything else a pickle names is refused before
    it is looked up, so no function of it is ever called."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "tether.messages" and name in TYPES:
            return TYPES[name]
        found = None
        if module == "builtins":
            found = getattr(builtins, name, None)
        elif module.split(".")[0] in ("tether", "dbos") and module in sys.modules:
            found = getattr(sys.modules[module], name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
        raise pickle.UnpicklingError(f"names {module}.{name}, which a record may not hold")


def unpickle(data: bytes) -> Any:
    return completed(SafeUnpickler(io.BytesIO(data)).load())


def completed(value: Any) -> Any:
    """`value` with the fields our types gained since it was pickled set to their defaults (a
    pickle holds the fields its version had: `ToolResult.usage` came later)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            completed(item)
    elif isinstance(value, dict):
        for item in value.values():
            completed(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if not hasattr(value, f.name):
                if f.default is not dataclasses.MISSING:
                    default = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    default = f.default_factory()
                else:
                    raise ValueError(f"{type(value).__name__} has no {f.name}")
                object.__setattr__(value, f.name, default)
            completed(getattr(value, f.name))
    return value


@dataclasses.dataclass
class Report:
    """What a migration did: rows rewritten a table, and the rows it could not read."""

    rewritten: dict[str, int] = dataclasses.field(default_factory=dict)
    refused: list[str] = dataclasses.field(default_factory=list)

    def count(self, table: str) -> None:
        self.rewritten[table] = self.rewritten.get(table, 0) + 1


def migrate(url: str) -> Report:
    """Rewrite the pickled records of the store at `url` (a SQLite or Postgres URL, as
    `journal.store_url` gives it)."""
    report = Report()
    dbos = sa.create_engine(ledger_url(url) if url.startswith("postgres") else url)
    schema = "dbos." if url.startswith("postgres") else ""
    try:
        with dbos.begin() as conn:
            if not sa.inspect(conn).has_table("workflow_status", schema=schema[:-1] or None):
                raise ConfigError("this store has no runs (no DBOS tables): nothing to migrate")
            dbos_rows(conn, schema, report)
    finally:
        dbos.dispose()
    ledger = sa.create_engine(url + "-effects" if url.startswith("sqlite") else ledger_url(url))
    try:
        with ledger.begin() as conn:
            if sa.inspect(conn).has_table("tether_steps"):
                step_rows(conn, report)
    finally:
        ledger.dispose()
    return report


VALUES = (  # DBOS's tables: the columns that hold a serialized value, by serialization column
    ("notifications", "message_uuid", ("message",)),
    ("workflow_events", "workflow_uuid, key", ("value",)),
    ("workflow_events_history", "workflow_uuid, function_id, key", ("value",)),
    ("streams", 'workflow_uuid, key, "offset"', ("value",)),
    ("operation_outputs", "workflow_uuid, function_id", ("output", "error")),
)
BY_WORKFLOW = (  # tables whose values follow their workflow's `serialization`
    ("workflow_input", ("inputs",)),
    ("workflow_output", ("output", "error")),
)


def dbos_rows(conn: sa.Connection, schema: str, report: Report) -> None:
    """DBOS's values: those whose row says py_pickle (or nothing, as older DBOS wrote)."""
    tables = set(sa.inspect(conn).get_table_names(schema=schema[:-1] or None))
    for table, key, columns in VALUES:
        if table not in tables:
            continue
        keys = [k.strip().strip('"') for k in key.split(",")]
        rows = conn.execute(
            sa.text(
                f"SELECT {key}, {', '.join(columns)} FROM {schema}{table} "
                f"WHERE serialization IS NULL OR serialization = '{PICKLE}'"
            )
        ).all()
        for row in rows:
            ident = dict(zip(keys, row[: len(keys)], strict=True))
            values = dict(zip(columns, row[len(keys) :], strict=True))
            new = rewritten(values, f"{table} {ident}", report)
            if new is not None:
                where = " AND ".join(f'"{k}" = :k_{k}' for k in keys)
                sets = ", ".join(f"{c} = :v_{c}" for c in new)
                conn.execute(
                    sa.text(
                        f"UPDATE {schema}{table} SET {sets}, serialization = '{OURS}' WHERE {where}"
                    ),
                    {**{f"k_{k}": v for k, v in ident.items()}, **{f"v_{c}": new[c] for c in new}},
                )
                report.count(table)
    workflows(conn, schema, tables, report)


def workflows(conn: sa.Connection, schema: str, tables: set[str], report: Report) -> None:
    """A workflow's inputs, result and error, kept with (or beside) its status row."""
    pickled = conn.execute(
        sa.text(
            f"SELECT workflow_uuid FROM {schema}workflow_status "
            f"WHERE serialization IS NULL OR serialization = '{PICKLE}'"
        )
    ).all()
    for (workflow,) in pickled:
        done = True
        places: list[tuple[str, tuple[str, ...]]] = [
            ("workflow_status", ("inputs", "output", "error"))
        ]
        places += [(t, c) for t, c in BY_WORKFLOW if t in tables]
        for table, columns in places:
            row = conn.execute(
                sa.text(
                    f"SELECT {', '.join(columns)} FROM {schema}{table} WHERE workflow_uuid = :w"
                ),
                {"w": workflow},
            ).first()
            if row is None:
                continue
            values = dict(zip(columns, row, strict=True))
            new = rewritten(values, f"{table} of run {workflow}", report)
            if new is None:
                done = done and all(v is None for v in values.values())
                continue
            sets = ", ".join(f"{c} = :v_{c}" for c in new)
            conn.execute(
                sa.text(f"UPDATE {schema}{table} SET {sets} WHERE workflow_uuid = :w"),
                {"w": workflow, **{f"v_{c}": v for c, v in new.items()}},
            )
            report.count(table)
        if done:  # every value of it is a record now: DBOS reads them with ours
            conn.execute(
                sa.text(
                    f"UPDATE {schema}workflow_status SET serialization = '{OURS}' "
                    "WHERE workflow_uuid = :w"
                ),
                {"w": workflow},
            )


def rewritten(values: dict[str, Any], where: str, report: Report) -> dict[str, str] | None:
    """The values (base64 pickles, as DBOS's serializer wrote them) as DBOS records; None
    when there is nothing to rewrite, or one of them could not be read (then named)."""
    out: dict[str, str] = {}
    serializer = RecordSerializer()
    for column, value in values.items():
        if value is None:
            continue
        try:
            data = base64.b64decode(value, validate=True)
            out[column] = serializer.serialize(unpickle(data))
        except (pickle.UnpicklingError, TypeError, ValueError, EOFError) as e:
            report.refused.append(f"{where}: {column}: {e}")
            return None
    return out or None


def step_rows(conn: sa.Connection, report: Report) -> None:
    """Tether's own steps: a pickle becomes `records.dumps` of what it holds."""
    rows = conn.execute(sa.text("SELECT run_id, n, output FROM tether_steps")).all()
    for run_id, n, output in rows:
        if bytes(output).startswith(RECORD_FORMAT):
            continue
        try:
            record = dumps(unpickle(bytes(output)))
        except (pickle.UnpicklingError, TypeError, ValueError, EOFError) as e:
            report.refused.append(f"step {n} of run {run_id}: {e}")
            continue
        conn.execute(
            sa.text("UPDATE tether_steps SET output = :o WHERE run_id = :r AND n = :n"),
            {"o": record, "r": run_id, "n": n},
        )
        report.count("tether_steps")
