"""Durable runs: kill -9 at random points, resume, and check the invariants on every run
(a short version of tests/crash_suite.py, which runs 200 kills by hand)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("dbos", reason="needs the durable extra")

from conftest import TETHER, cli_env
from crash_suite import run_suite
from wire_server import WireServer


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


def test_an_approval_survives_a_crash(wire: WireServer, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    wire.add(calls=[("bash", {"command": "echo approved > proof.txt"})]).add(text="It is done.")
    env = cli_env(OPENAI_API_KEY="sk-durable")
    proc = subprocess.Popen(
        [
            *TETHER,
            "run",
            "make proof",
            "--base-url",
            wire.url,
            "--tools",
            "bash",
            "--store",
            store,
            "--run-id",
            "appr-1",
            "--json",
            "--workspace",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    request = None
    for line in proc.stdout:
        event = json.loads(line)
        if event["type"] == "approval_requested":
            request = event
            break
    assert request is not None and request["name"] == "bash"
    proc.send_signal(signal.SIGKILL)  # the process dies while the run waits for a person
    proc.wait()
    approve = subprocess.run(
        [*TETHER, "approve", "appr-1", request["approval_id"], "--store", store],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert approve.returncode == 0, approve.stderr
    resumed = subprocess.run(
        [*TETHER, "resume", "appr-1", "--store", store, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["answer"] == "It is done."
    assert (tmp_path / "proof.txt").read_text() == "approved\n"
    assert len(wire.requests) == 2  # the first reply was not asked for again
