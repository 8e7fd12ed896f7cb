"""`tether migrate`: a store written before 0.1.0, whose records are pickles, is refused with the
command that rewrites it; rewritten, its runs show, take approvals and resume; a pickle that
would run code is left as it was, named, and never run."""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import socket
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env, json_lines, tether

pytest.importorskip("dbos", reason="needs the durable extra")

OLD = FIXTURES / "store-0.0"
"""A store Tether wrote at 4b6c143, the last version that pickled (`sqlite3`'s dump of its two
files): run done-1 done, run waits-1 waiting for approval of `bash echo migrated` when its
process was killed, with a message sent to it since."""

SAY_IT = [
    {"text": "I will say it.",
     "tool_calls": [{"name": "bash", "arguments": {"command": "echo migrated"}}]},
    {"text": "Said it."},
]  # fmt: skip
"""The script waits-1 was started with: its first reply is recorded, the second is asked for
after the approval, from the file its options name (`SCRIPT`)."""
SCRIPT = Path("/tmp/tether-migrate-fixture/say_it.json")


class Planted:
    """A pickle that, unpickled, creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def old_store(folder: Path) -> str:
    """The old store in `folder`, its dead process one of this machine's (so `resume` takes
    the run over, as it would on the machine that wrote it)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    for name in ("runs.sqlite", "runs.sqlite-effects"):
        sql = (OLD / f"{name}.sql").read_text()
        sql = sql.replace("@HOST@", socket.gethostname()).replace("@DEAD@", str(gone.pid))
        db = sqlite3.connect(folder / name)
        db.executescript(sql)
        db.close()
    return f"sqlite:///{folder}/runs.sqlite"


def approve_and_resume(store: str, run_id: str, approval_id: str) -> list[Any]:
    approved = tether("approve", run_id, approval_id, "--store", store)
    assert approved.returncode == 0, approved.stderr
    resumed = tether("resume", run_id, "--store", store, "--json")
    assert resumed.returncode == 0, resumed.stderr
    return json_lines(resumed.stdout)


def test_a_store_written_before_0_1_0_is_refused_then_migrated_and_resumed(tmp_path: Path) -> None:
    store = old_store(tmp_path)
    listed = tether("runs", "--store", store)
    assert listed.returncode == 1
    assert "tether migrate --store" in listed.stderr.splitlines()[-1], listed.stderr
    migrated = tether("migrate", "--store", store)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("rewrote 10 records as data (")
    again = tether("migrate", "--store", store)
    assert again.returncode == 0 and again.stdout.startswith("nothing to rewrite")
    runs = {r["id"]: r for r in json_lines(tether("runs", "--store", store, "--json").stdout)}
    assert runs["done-1"]["state"] == "done" and runs["waits-1"]["approvals"] == ["ap_call_1"]
    shown = tether("show", "done-1", "--store", store)
    assert shown.returncode == 0 and "Pack a coat for Oslo." in shown.stdout
    SCRIPT.parent.mkdir(exist_ok=True)
    written = SCRIPT.with_suffix(f".{os.getpid()}")  # whole, however many suites run at once
    written.write_text(json.dumps(SAY_IT))
    written.replace(SCRIPT)
    events = approve_and_resume(store, "waits-1", "ap_call_1")
    results = [e["output"] for e in events if e["type"] == "tool_result"]
    assert results == ["exit status 0\nmigrated\n"]
    said = [e["text"] for e in events if e["type"] == "user_message"]
    assert said == ["Sign it, please."]  # the message sent before the migration
    assert events[-1]["type"] == "run_finished" and events[-1]["answer"] == "Said it."


def test_a_planted_pickle_is_left_named_and_never_run(tmp_path: Path) -> None:
    store = old_store(tmp_path)
    marker = tmp_path / "ran"
    effects = sqlite3.connect(tmp_path / "runs.sqlite-effects")
    with effects:
        effects.execute(
            "UPDATE tether_steps SET output = ? WHERE run_id = 'done-1' AND n = 1",
            (pickle.dumps(Planted(marker)),),
        )
    effects.close()
    migrated = tether("migrate", "--store", store)
    assert migrated.returncode == 1
    (line,) = migrated.stderr.splitlines()
    assert "step 1 of run done-1" in line and "names _io.open" in line
    assert not marker.exists()
    assert migrated.stdout.startswith("rewrote 9 records as data")  # the rest were
    shown = tether("show", "done-1", "--store", store)
    assert shown.returncode == 1 and "step 1" in shown.stderr and not marker.exists()


def test_pickled_records_in_a_postgres_store_are_migrated(postgres: str, tmp_path: Path) -> None:
    """A run waiting for approval, its records then rewritten as pickles as a version before
    0.1.0 wrote them (DBOS's py_pickle serializer for its values, pickled steps)."""
    from tether.durable.records import RecordSerializer, loads

    script = tmp_path / "say_it.json"
    script.write_text(json.dumps(SAY_IT))
    proc = warm.Popen(
        [*TETHER, "run", "Say it.", "--provider", "scripted", "--script", str(script),
         "--tools", "bash", "--workspace", str(tmp_path), "--store", postgres, "--run-id",
         "pg-1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=cli_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if json.loads(line)["type"] == "approval_requested":
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    serializer = RecordSerializer()

    def pickled(value: str) -> str:
        return base64.b64encode(pickle.dumps(serializer.deserialize(value))).decode()

    import psycopg

    with psycopg.connect(postgres) as db:
        for table, column in (("workflow_events", "value"), ("workflow_events_history", "value")):
            for key, value in db.execute(f"SELECT key, {column} FROM dbos.{table}").fetchall():
                db.execute(
                    f"UPDATE dbos.{table} SET {column} = %s, serialization = 'py_pickle' "
                    "WHERE key = %s",
                    (pickled(value), key),
                )
        (inputs,) = db.execute("SELECT inputs FROM dbos.workflow_input").fetchone() or ("",)
        db.execute("UPDATE dbos.workflow_input SET inputs = %s", (pickled(inputs),))
        db.execute("UPDATE dbos.workflow_status SET serialization = 'py_pickle'")
        for n, output in db.execute("SELECT n, output FROM tether_steps").fetchall():
            old = pickle.dumps(loads(output))
            db.execute("UPDATE tether_steps SET output = %s WHERE n = %s", (old, n))
    refused = tether("runs", "--store", postgres)
    assert refused.returncode == 1 and "tether migrate" in refused.stderr
    migrated = tether("migrate", "--store", postgres)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("rewrote 4 records as data"), migrated.stdout
    events = approve_and_resume(postgres, "pg-1", "ap_call_1")
    assert events[-1]["type"] == "run_finished" and events[-1]["answer"] == "Said it."
