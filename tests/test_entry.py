"""The `tether` command started cold, as a user's shell starts it, and the warm processes the
other tests start in its place (see warm.py) shown to be the same process to a test.

A warm process is forked after the imports, so these cold ones show what only a new
interpreter can: that the command imports what it needs, in the order it needs it (SQLite
swapped in before DBOS imports it, for one), from the console script pip installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import warm
from crash_suite import run_suite
from helpers import TETHER, Output, cli_env

EXAMPLES = Path(__file__).parent.parent / "examples"
CONSOLE_SCRIPT = Path(sys.executable).parent / "tether"
WEATHER = [
    *("run", "weather in Oslo?", "--provider", "scripted"),
    *("--script", str(EXAMPLES / "weather_script.json")),
    *("--tools-from", str(EXAMPLES / "tools.py")),
]


def cold(*args: str) -> subprocess.CompletedProcess[str]:
    """`tether ARGS` from the console script, a new interpreter."""
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, timeout=120, env=cli_env()
    )


def test_a_cold_durable_run_is_recorded_and_shown() -> None:
    """The README's scripted weather run, on the default store (SQLite in the data directory)."""
    done = cold(*WEATHER, "--run-id", "w-1")
    assert done.returncode == 0, done.stderr
    assert "Oslo is 3 °C with light snow" in done.stdout
    listed = cold("runs")
    assert listed.stdout.startswith("w-1\t") and "\tdone\t" in listed.stdout
    shown = [json.loads(line) for line in cold("show", "w-1", "--json").stdout.splitlines()]
    assert shown[-1]["type"] == "run_finished" and shown[-1]["outcome"] == "done"


def test_a_cold_run_in_memory_answers() -> None:
    done = cold(*WEATHER, "--store", "memory")
    assert done.returncode == 0, done.stderr
    assert "Oslo is 3 °C with light snow" in done.stdout


def test_cold_runs_survive_random_kills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash suite's kills and resumes, every process a new interpreter (as
    TETHER_TEST_FRESH=1 makes the whole suite)."""
    monkeypatch.setenv("TETHER_TEST_FRESH", "1")
    report = run_suite(f"sqlite:///{tmp_path}/runs.sqlite", kills=3, work=tmp_path, seed=5)
    assert report.problems == []
    assert report.kills == 3 and report.finished == report.runs >= 1


LOOK = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "main": __name__,
    "marker": os.environ.get("MARKER"), "keys": "OPENAI_API_KEY" in os.environ,
    "stdin": sys.stdin.read(), "ppid_is_test": os.getppid() == int(sys.argv[1]),
}))
sys.stderr.write("to stderr")
sys.exit(int(sys.argv[2]))
"""


def look(spawn: Callable[..., subprocess.Popen[str]], tmp_path: Path) -> list[Any]:
    """What a `python -c` program sees of itself, started by `spawn`, and how it ended."""
    env = cli_env(MARKER="m-1")
    p = spawn(
        [sys.executable, "-c", LOOK, str(os.getpid()), "7"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    out, err = p.communicate("typed in", timeout=60)
    return [type(p), p.returncode, err, json.loads(out)]


warm_only = pytest.mark.skipif(
    bool(os.environ.get("TETHER_TEST_FRESH")), reason="TETHER_TEST_FRESH: no process is warm"
)


@warm_only
def test_a_warm_process_is_the_process_a_new_interpreter_would_be(tmp_path: Path) -> None:
    """Same arguments, directory, import path, environment, standard streams and exit status;
    only its parent differs (the warm process)."""
    kind, *warm_seen = look(warm.Popen, tmp_path)
    cold_kind, *cold_seen = look(subprocess.Popen, tmp_path)
    assert kind is warm.Warm and cold_kind is subprocess.Popen  # not a fallback to a new one
    assert warm_seen[2].pop("ppid_is_test") is False and cold_seen[2].pop("ppid_is_test") is True
    assert warm_seen == cold_seen
    assert warm_seen[:2] == [7, "to stderr"]
    assert warm_seen[2]["marker"] == "m-1" and warm_seen[2]["stdin"] == "typed in"


@warm_only
def test_a_warm_tether_is_killed_alone_and_its_end_is_reported() -> None:
    serve = [*TETHER, "serve", "--port", "0", "--store", "memory", *WEATHER[2:]]
    proc = warm.Popen(
        serve, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env()
    )
    try:
        assert proc.stderr is not None
        Output(proc.stderr).wait_for("tether serve: open http://127.0.0.1:")
        other = warm.Popen([*TETHER, "--version"], stdout=subprocess.PIPE, env=cli_env())
        assert isinstance(proc, warm.Warm) and proc.pid != other.pid
        assert other.wait(60) == 0 and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    again = warm.run([*TETHER, "--version"], capture_output=True, text=True, env=cli_env())
    assert again.returncode == 0 and again.stdout.startswith("tether ")
