"""The suite's own limits: a test that hangs fails, with its name, within the per-test time limit
(pytest-timeout, set in pyproject.toml), instead of holding the suite and CI for an hour."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

HUNG = """
import asyncio, subprocess, sys, threading, time

def test_sleeps():
    time.sleep(600)

async def test_awaits():
    await asyncio.sleep(600)

def test_reads_a_silent_pipe():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         stdout=subprocess.PIPE)
    try:
        p.stdout.read()
    finally:
        p.kill()
        p.wait()

def test_waits_for_an_event_nobody_sets():
    threading.Event().wait()

def test_passes():
    pass
"""


def test_every_test_has_a_time_limit_under_two_minutes_but_the_heavy_few(
    request: pytest.FixtureRequest,
) -> None:
    """Each named heavy test exists (a renamed one would lose its limit silently): checked
    among the tests of this session, for the files it collected."""
    from conftest import HEAVY, HEAVY_LIMIT

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < config["timeout"] < 120 and HEAVY_LIMIT <= 300
    collected = {item.nodeid for item in request.session.items}
    files = {nodeid.split("::")[0] for nodeid in collected}
    missing = {h for h in HEAVY if h.split("::")[0] in files and h not in collected}
    assert not missing, missing


def test_a_hung_test_fails_with_its_name(tmp_path: Path) -> None:
    """Run with the project's own settings (workers, asyncio), the limit lowered to 3 s: each
    way of hanging fails by name, the rest pass, and the run ends."""
    (tmp_path / "test_hung.py").write_text(HUNG)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=3",
            "-n",
            "2",
            str(tmp_path / "test_hung.py"),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )  # fmt: skip  (a run that hangs on is a TimeoutExpired here, and fails)
    assert p.returncode == 1, p.stdout + p.stderr
    for name in ("sleeps", "awaits", "reads_a_silent_pipe", "waits_for_an_event_nobody_sets"):
        assert f"FAILED test_hung.py::test_{name}" in p.stdout, p.stdout
    assert "4 failed, 1 passed" in p.stdout and "Timeout" in p.stdout
