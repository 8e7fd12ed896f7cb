"""Every private name of DBOS that Tether reaches (`durable/dbos_private.py`, the one place it
does) still exists in the DBOS installed: a DBOS upgrade that moves one fails here, naming it,
instead of somewhere inside a durable run."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

pytest.importorskip("dbos", reason="needs the durable extra")


def test_the_private_modules_names_are_there() -> None:
    from dbos import _dbos, _error, _serialization, _sys_db

    assert isinstance(_sys_db._dbos_notifications_channel, str)
    assert callable(_dbos._get_dbos_instance)
    assert "self._listening_queues" in inspect.getsource(_dbos.DBOS)
    # `result_of` awaits a started workflow's task, as `get_result` does first
    from dbos._core import WorkflowHandleAsyncTask

    assert "asyncio.shield(self.task)" in inspect.getsource(WorkflowHandleAsyncTask)
    assert hasattr(_serialization, "DBOSDefaultSerializer")
    for name in (
        "DBOSWorkflowIDInUseError",
        "DBOSNonExistentWorkflowError",
        "DBOSAwaitedWorkflowCancelledError",
        "DBOSWorkflowCancelledError",
    ):
        assert issubclass(getattr(_error, name), BaseException), name


def test_a_clients_system_database_has_what_tether_reads(tmp_path: Path) -> None:
    """Through a real client of a SQLite store: its system database, the engine, the
    workflow table's columns the pages read, and the methods called."""
    from tether.durable.view import client

    reader = client(f"sqlite:///{tmp_path}/runs.sqlite", create=True)
    try:
        sys_db = reader.client._sys_db
        assert sys_db.engine.dialect.name == "sqlite"
        columns = set(sys_db.tables.workflow_status.c.keys())
        assert {"created_at", "workflow_uuid", "name", "status"} <= columns
        for method in ("get_all_events", "_waiter", "run_migrations"):
            assert callable(getattr(sys_db, method)), method
        assert sys_db.get_all_events("no-such-run") == {}
    finally:
        reader.close()
