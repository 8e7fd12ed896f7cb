"""Runs on a store are supervised as in memory: restart policies (a permanent run idles between
answers and survives a crash while it waits), admission control, one writer per id."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import warm
from helpers import FIXTURES, TETHER, cli_env
from wire_server import WireServer

PROGRAM = [sys.executable, str(FIXTURES / "conversation.py")]


def program(wire: WireServer, *args: str) -> subprocess.Popen[str]:
    return warm.Popen(
        [*PROGRAM, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=cli_env(OPENAI_BASE_URL=wire.url),
    )


def until(out: IO[str] | None, event_type: str) -> Iterator[dict[str, Any]]:
    """The events a program prints, up to and including the first of `event_type`."""
    assert out is not None
    for line in out:
        event: dict[str, Any] = json.loads(line)
        yield event
        if event["type"] == event_type:
            return
    raise AssertionError(f"the program ended before a {event_type} event")


def send(store: str, run_id: str, text: str) -> None:
    p = warm.run(
        [*TETHER, "send", run_id, text, "--store", store],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )
    assert p.returncode == 0, p.stderr


def test_a_permanent_run_idles_and_survives_a_crash_while_it_waits(
    wire: WireServer, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    wire.add(text="Hello.").add(text="Second.").add(text="Third.")
    first = program(wire, store, "start", "talk-1", "permanent")
    answered = [e for e in until(first.stdout, "idle") if e["type"] == "model_response"]
    assert [e["text"] for e in answered] == ["Hello."]
    send(store, "talk-1", "again")
    events = list(until(first.stdout, "idle"))
    assert ("user_message", "again") in [(e["type"], e.get("text")) for e in events]
    assert [e["text"] for e in events if e["type"] == "model_response"] == ["Second."]
    first.send_signal(signal.SIGKILL)  # while it idles
    first.wait()

    again = program(wire, store, "resume", "talk-1")
    try:
        replayed = []
        while "Second." not in replayed:  # the replay tells the story again, then it idles
            replayed = [e.get("answer") for e in until(again.stdout, "idle")]
        assert len(wire.requests) == 2  # nothing was asked twice
        send(store, "talk-1", "and once more")
        events = list(until(again.stdout, "idle"))
        assert [e["text"] for e in events if e["type"] == "model_response"] == ["Third."]
    finally:
        again.kill()
        again.wait()
    sent = wire.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent if m["role"] != "system"] == [
        ("user", "Hello?"),
        ("assistant", "Hello."),
        ("user", "again"),
        ("assistant", "Second."),
        ("user", "and once more"),
    ]


def to_the_end(wire: WireServer, tmp_path: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """Run the program on a new store to its end: its exit status and events."""
    p = program(wire, f"sqlite:///{tmp_path}/runs.sqlite", *args)
    out, _ = p.communicate(timeout=60)
    return p.returncode, [json.loads(line) for line in out.splitlines()]


def test_a_transient_run_is_restarted_after_a_failure(wire: WireServer, tmp_path: Path) -> None:
    wire.add(status=500).add(text="Recovered.")
    status, events = to_the_end(wire, tmp_path, "start", "flaky-1", "transient")
    assert status == 0
    assert "restarting" in [e["type"] for e in events]
    ends = [e for e in events if e["type"] == "run_finished"]
    assert [e["outcome"] for e in ends] == ["failed", "done"]
    assert ends[-1]["answer"] == "Recovered."


def test_a_temporary_run_is_not_restarted(wire: WireServer, tmp_path: Path) -> None:
    wire.add(status=500).add(text="never asked")
    status, events = to_the_end(wire, tmp_path, "start", "once-1", "temporary")
    assert status == 1
    assert [e["outcome"] for e in events if e["type"] == "run_finished"] == ["failed"]
    assert len(wire.requests) == 1


def test_runs_over_max_runs_wait_in_a_visible_queue(wire: WireServer, tmp_path: Path) -> None:
    wire.add(text="One.", delay=0.3).add(text="Two.")
    status, events = to_the_end(wire, tmp_path, "two", "q")
    assert status == 0
    second = [e["type"] for e in events if e["run_id"] == "q-2"]
    assert "queued" in second
    assert second.index("queued") < second.index("admitted") < second.index("model_request")
    first_end = next(i for i, e in enumerate(events) if e["type"] == "run_finished")
    second_call = next(
        i for i, e in enumerate(events) if e["run_id"] == "q-2" and e["type"] == "model_request"
    )
    assert first_end < second_call  # one at a time
