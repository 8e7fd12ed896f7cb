"""One driver: a run in memory and the same run recorded in a store tell the same story, event
for event, and the time limit and a cancel work the same in both."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env
from wire_server import WireServer

TOOLS = str(FIXTURES / "parallel_tools.py")
STORES = ["memory", "sqlite"]


def store_for(kind: str, tmp_path: Path) -> str:
    return "memory" if kind == "memory" else f"sqlite:///{tmp_path}/runs.sqlite"


def options(wire: WireServer, store: str) -> list[str]:
    return ["--base-url", wire.url, "--tools-from", TOOLS, "--store", store, "--json"]


def run(wire: WireServer, store: str, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    p = warm.run(
        [*TETHER, "run", "echo twice", *options(wire, store), *extra],
        capture_output=True,
        text=True,
        env=cli_env(OPENAI_API_KEY="sk-test"),
        timeout=60,
    )
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()]


def story(events: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """What a watcher learns from a run's events, without timings and ids. Streamed text is
    its text: how it fell into pieces is how the stream fell into network reads."""
    out: list[tuple[str, ...]] = []
    for e in events:
        if e["type"] == "text_delta":
            if out and out[-1][0] == "text_delta":
                out[-1] = ("text_delta", out[-1][1] + e["text"])
            else:
                out.append(("text_delta", e["text"]))
        elif e["type"] == "tool_call":
            out.append(("tool_call", e["name"], json.dumps(e["arguments"], sort_keys=True)))
        elif e["type"] == "tool_result":
            out.append(("tool_result", e["name"], e["output"], str(e["is_error"])))
        elif e["type"] == "run_finished":
            out.append(("run_finished", *sorted(e)))
        else:
            out.append((e["type"],))
    return out


def script(wire: WireServer) -> None:
    wire.add(calls=[("slow_echo", {"text": "a", "ms": 10}), ("slow_echo", {"text": "b"})])
    wire.add(calls=[("slow_echo", '{"text": ')])  # arguments that are not JSON
    wire.add(text="Echoed a and b.")


def test_memory_and_durable_runs_emit_the_same_events(wire: WireServer, tmp_path: Path) -> None:
    script(wire)
    status_m, memory = run(wire, "memory")
    script(wire)
    status_d, durable = run(wire, store_for("sqlite", tmp_path))
    assert status_m == status_d == 0
    assert story(memory) == story(durable)
    assert memory[-1]["answer"] == durable[-1]["answer"] == "Echoed a and b."
    for key in ("usage", "cost_usd", "steps"):
        assert memory[-1][key] == durable[-1][key], key


@pytest.mark.parametrize("kind", STORES)
def test_the_time_limit_cuts_a_running_tool_call(
    wire: WireServer, tmp_path: Path, kind: str
) -> None:
    wire.add(calls=[("slow_echo", {"text": "long", "ms": 60_000})]).add(text="never")
    status, events = run(wire, store_for(kind, tmp_path), "--timeout", "1")
    assert status == 3
    end = events[-1]
    assert end["outcome"] == "halted" and end["reason"].startswith("timeout")
    assert end["steps"] == 1 and end["usage"]["output_tokens"] > 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] and "time limit" in result["output"]
    assert len(wire.requests) == 1


@pytest.mark.parametrize("kind", STORES)
def test_a_cancel_reports_what_the_run_used(wire: WireServer, tmp_path: Path, kind: str) -> None:
    wire.add(calls=[("slow_echo", {"text": "long", "ms": 60_000})]).add(text="never")
    proc = warm.Popen(
        [*TETHER, "run", "wait", *options(wire, store_for(kind, tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=cli_env(OPENAI_API_KEY="sk-test"),
    )
    assert proc.stdout is not None
    events = []
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["type"] == "tool_call":
            proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    end = events[-1]
    assert end["type"] == "run_finished" and end["outcome"] == "cancelled"
    assert end["steps"] == 1 and end["usage"]["input_tokens"] > 0
    assert [e["type"] for e in events].count("run_finished") == 1


@pytest.mark.parametrize("kind", STORES)
def test_a_reused_call_id_never_returns_an_earlier_calls_result(
    wire: WireServer, tmp_path: Path, kind: str
) -> None:
    """A server that gives a later call the id of an earlier one (or no ids at all) gets the
    new call run: its id is made unique, and the journal never takes it for the old one."""
    wire.add(calls=[("slow_echo", {"text": "one", "ms": 10}, "c0")])
    wire.add(calls=[("slow_echo", {"text": "two", "ms": 10}, "c0")])
    wire.add(text="Both echoed.")
    status, events = run(wire, store_for(kind, tmp_path))
    assert status == 0
    results = [e for e in events if e["type"] == "tool_result"]
    assert [r["output"] for r in results] == ["echo: one", "echo: two"]
    calls = [e for e in events if e["type"] == "tool_call"]
    assert len({c["id"] for c in calls}) == 2
    sent = wire.requests[-1]["messages"]
    ids = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    asked = [c["id"] for m in sent if m["role"] == "assistant" for c in m["tool_calls"]]
    assert ids == asked and len(set(ids)) == 2
