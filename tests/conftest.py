"""Fixtures every test file may use. Each test gets its own data directory (XDG_DATA_HOME, so
the default store and the journals of CLI runs are its own) and, when it asks for one, its own
Postgres database: tests run in parallel (pytest-xdist) and share nothing but the machine."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import Hostile
from wire_server import WireServer

POSTGRES_SERVER = os.environ.get("TETHER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")

HEAVY = {
    "tests/test_entry.py::test_cold_runs_survive_random_kills",
    "tests/test_harbor.py::test_the_tasks_fail_when_nothing_is_done_and_pass_with_their_solutions",
    "tests/test_harbor.py::test_tether_solves_every_task_through_harbor_run",
    "tests/test_package.py::test_the_wheel_installs_into_a_fresh_venv_and_runs",
    "tests/test_docs.py::test_examples_run[docs/getting-started.md]",
    "tests/test_durable.py::test_postgres_runs_survive_random_kills",
    "tests/test_durable.py::test_sqlite_runs_survive_random_kills",
    "tests/test_durable.py::test_a_batch_queued_before_any_worker_survives_a_dead_worker",
}
"""The tests that take 15 to 30 s alone: whole Harbor trials, a wheel built and installed, the
offline model answering, hundreds of processes killed at random. Their work is CPU, so with a
second suite beside them on two cores they took over 100 s (pyproject's limit for any test,
under which a hang fails by name); their own limit is `HEAVY_LIMIT`."""
HEAVY_LIMIT = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid in HEAVY:
            item.add_marker(pytest.mark.timeout(HEAVY_LIMIT))


@pytest.fixture(autouse=True)
def data_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own data directory, for its in-process runs and the `tether` it starts."""
    path = tmp_path_factory.mktemp("data")
    monkeypatch.setenv("XDG_DATA_HOME", str(path))
    return path


@pytest.fixture(autouse=True)
def one_thread_per_local_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled model's servers run one thread each here: the suite runs three workers on
    the machine's cores, and with a thread a core llama.cpp's threads spin waiting for each
    other (tests/test_local.py took 119 s of CPU instead of 42-46 s)."""
    monkeypatch.setenv("TETHER_LOCAL_THREADS", "1")


@pytest.fixture
def wire() -> Iterator[WireServer]:
    server = WireServer().start()
    yield server
    server.stop()


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    """A server whose every answer the test writes (see `helpers.Hostile`)."""
    h = Hostile()
    yield h
    h.stop()


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def postgres() -> Iterator[str]:
    """A new database for one test: runs left pending by another test (or another process
    with other tool settings) must not be recovered into this one."""
    try:
        import psycopg

        admin = psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True, connect_timeout=3)
    except Exception:
        if os.environ.get("TETHER_REQUIRE_POSTGRES"):
            raise
        pytest.skip(f"no Postgres at {POSTGRES_SERVER}")
    name = f"tether_test_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{POSTGRES_SERVER}/{name}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()
