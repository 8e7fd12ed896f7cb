"""Durable runs: kill -9 at random points, resume, and check the invariants on every run
(a short version of tests/crash_suite.py, which runs 200 kills by hand)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("dbos", reason="needs the durable extra")

from crash_suite import run_suite


def test_sqlite_runs_survive_random_kills(tmp_path: Path) -> None:
    report = run_suite(f"sqlite:///{tmp_path}/runs.sqlite", kills=8, work=tmp_path, seed=7)
    assert report.problems == []
    assert report.kills == 8 and report.finished == report.runs >= 2


POSTGRES = os.environ.get(
    "TETHER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/tether_test"
)


def postgres_ready() -> bool:
    """Create the test database if the server is up; False if there is no server."""
    try:
        import psycopg

        admin = POSTGRES.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as c:
            name = POSTGRES.rsplit("/", 1)[1]
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                c.execute(f'CREATE DATABASE "{name}"')
        return True
    except Exception:
        return False


def test_postgres_runs_survive_random_kills(tmp_path: Path) -> None:
    if not postgres_ready():
        if os.environ.get("TETHER_REQUIRE_POSTGRES"):
            raise RuntimeError(f"no Postgres at {POSTGRES}")
        pytest.skip(f"no Postgres at {POSTGRES}")
    report = run_suite(POSTGRES, kills=6, work=tmp_path, seed=11)
    assert report.problems == []
    assert report.kills == 6 and report.finished == report.runs >= 2
