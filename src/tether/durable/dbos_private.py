"""The one place Tether reaches into DBOS's private API.

DBOS's public API runs workflows and reads their status, but some of what a store needs has no
public call: a client's events of a run, its schema made before any worker starts, a queue
listened to after launch, its pickle reader replaced (`refuse_pickles`), the errors it
raises, a workflow's result awaited without DBOS's record of the read (`result_of`). Each is
reached here, by one function, so a DBOS upgrade that moves one breaks one function, found by
the tests that use it. DBOS is imported inside each (it takes a second).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .records import PicklesRefused


def all_events(client: Any, run_id: str) -> dict[str, Any]:
    """The events a run set (its approval requests), read through a `DBOSClient`."""
    events: dict[str, Any] = client._sys_db.get_all_events(run_id)
    return events


def wake(client: Any, run_id: str, topic: str) -> None:
    """Tell a run waiting for a message on `topic` that one came (a client's `send` notifies
    no one: on Postgres the run saw it at its next poll of the store, up to a minute later;
    SQLite's runs poll every 50 ms). DBOS's own listener takes the notification as its own
    sends make it."""
    import sqlalchemy as sa
    from dbos._sys_db import _dbos_notifications_channel

    sys_db = client._sys_db
    if sys_db.engine.dialect.name != "postgresql":
        return
    payload, _ = sys_db._waiter(run_id, topic)
    with sys_db.engine.begin() as c:
        c.execute(
            sa.text("SELECT pg_notify(:c, :p)"), {"c": _dbos_notifications_channel, "p": payload}
        )


async def result_of(handle: Any) -> Any:
    """A workflow's result, from the handle `start_workflow_async` gave. A workflow that runs
    in this process is its handle's task, awaited here; DBOS's `get_result` awaits the same
    task, then serializes the whole result and hops to a thread to record that it was read,
    which it records only for a caller inside a workflow (this one never is): 50 us of CPU a
    run on SQLite for the smallest result, against 1 (`bench/dbos_floor.py`), more for a long
    transcript. A handle without a task (a run executing elsewhere), or one whose task was
    cancelled, asks DBOS as before."""
    from dbos._error import DBOSAwaitedWorkflowCancelledError, DBOSWorkflowCancelledError

    task = getattr(handle, "task", None)
    if not isinstance(task, asyncio.Future):
        return await handle.get_result()
    try:
        return await asyncio.shield(task)  # a cancelled follower leaves the workflow alone
    except (DBOSWorkflowCancelledError, DBOSAwaitedWorkflowCancelledError):
        return await handle.get_result()  # its record in the store says how it ended


def make_schema(client: Any) -> None:
    """Create the store's schema through a client (DBOS's client never does): runs can be
    queued before any worker starts. One query when it is there already."""
    client._sys_db.run_migrations()


def engine(client: Any) -> Any:
    """The client's SQLAlchemy engine, for queuing many runs in one transaction."""
    return client._sys_db.engine


def listen_to(queue: str) -> None:
    """Make this launched process take runs from `queue` too (DBOS reads the queues a process
    listens to every second, and has no public call to add one after launch)."""
    from dbos._dbos import _get_dbos_instance

    listening = _get_dbos_instance()._listening_queues
    if listening is not None and queue not in listening:
        listening.append(queue)


def refuse_pickles() -> None:
    """Replace DBOS's pickle reader in this process by one that refuses (`records`): DBOS
    reads a row by the serializer its `serialization` column names, so configuring ours is
    not enough, and a row rewritten to say `py_pickle` must not make it unpickle. The one
    change Tether makes to DBOS, made where Tether opens a store."""
    from dbos import _serialization

    _serialization.DBOSDefaultSerializer = PicklesRefused()  # type: ignore[assignment]


def id_in_use_error() -> type[Exception]:
    """What DBOS raises when a workflow id is taken (the `reject` policy)."""
    from dbos._error import DBOSWorkflowIDInUseError

    return DBOSWorkflowIDInUseError


def no_such_workflow_error() -> type[Exception]:
    from dbos._error import DBOSNonExistentWorkflowError

    return DBOSNonExistentWorkflowError


def cancelled_errors() -> tuple[type[BaseException], ...]:
    """What DBOS raises to whoever awaits a workflow cancelled in the store."""
    from dbos._error import DBOSAwaitedWorkflowCancelledError, DBOSWorkflowCancelledError

    return (DBOSAwaitedWorkflowCancelledError, DBOSWorkflowCancelledError)


def run_keys(
    client: Any,
    name: str,
    statuses: list[str] | None,
    past: tuple[int, str] | None,
    limit: int,
    oldest_first: bool = False,
) -> list[tuple[int, str]]:
    """The (created_at, id) of up to `limit` workflows named `name` (of these DBOS
    `statuses`), newest first (or oldest), those strictly past `past` only: a keyset read of
    DBOS's own index on created_at (a range on it first, so the index bounds the read), which
    its `list_workflows` (an offset, and no order among workflows created in one millisecond)
    cannot page by."""
    import sqlalchemy as sa

    sys_db = client._sys_db
    ws = sys_db.tables.workflow_status
    query = sa.select(ws.c.created_at, ws.c.workflow_uuid).where(ws.c.name == name)
    if statuses is not None:
        query = query.where(ws.c.status.in_(statuses))
    at, run_id = ws.c.created_at, ws.c.workflow_uuid
    if past is not None and oldest_first:
        query = query.where(at >= past[0], sa.or_(at > past[0], run_id > past[1]))
    elif past is not None:
        query = query.where(at <= past[0], sa.or_(at < past[0], run_id < past[1]))
    order = (at.asc(), run_id.asc()) if oldest_first else (at.desc(), run_id.desc())
    query = query.order_by(*order).limit(limit)
    with sys_db.engine.connect() as c:
        return [(int(created), str(workflow)) for created, workflow in c.execute(query)]


def status_counts(client: Any, name: str) -> dict[str, int]:
    """How many workflows named `name` the store holds in each DBOS status (one grouped
    count: a store of 100,000 runs is not read row by row for the page's counts)."""
    import sqlalchemy as sa

    sys_db = client._sys_db
    ws = sys_db.tables.workflow_status
    query = sa.select(ws.c.status, sa.func.count()).where(ws.c.name == name).group_by(ws.c.status)
    with sys_db.engine.connect() as c:
        return {str(status): int(n) for status, n in c.execute(query)}
