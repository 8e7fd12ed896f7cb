"""Faults injected through the wire mock, seen from `tether run`: a retry where it is safe, else a
clear failed outcome; never a hang, never a partial answer reported as complete."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from conftest import TETHER, cli_env
from wire_server import WireServer

PROVIDERS = {"chat": "openai-chat", "responses": "openai-responses", "anthropic": "anthropic"}
every = pytest.mark.parametrize("protocol", list(PROVIDERS))


def run(url: str, protocol: str, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    p = subprocess.run(
        [
            *TETHER,
            "run",
            "x",
            "--provider",
            PROVIDERS[protocol],
            "--base-url",
            url,
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(OPENAI_API_KEY="k", ANTHROPIC_API_KEY="k"),
    )
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()]


@every
def test_reset_mid_stream_fails_without_reporting_the_partial_answer(
    wire: WireServer, protocol: str
) -> None:
    wire.add(text="The answer is forty", deltas=4, cut_after=6)
    status, events = run(wire.url, protocol)
    assert status == 1
    assert any(e["type"] == "text_delta" for e in events)  # the user saw it stream...
    final = events[-1]
    assert final["outcome"] == "failed" and final["answer"] == ""  # ...but it is not the answer
    assert final["error"]["kind"] == "connection"
    assert len(wire.requests) == 1


@every
def test_truncated_stream_is_retried_then_succeeds(wire: WireServer, protocol: str) -> None:
    wire.add(calls=[("x", {})], fault="no_done").add(text="complete answer")
    status, events = run(wire.url, protocol)
    assert status == 0 and events[-1]["answer"] == "complete answer"
    assert [e["type"] for e in events].count("retry") == 1


@every
def test_garbage_then_success(wire: WireServer, protocol: str) -> None:
    wire.add(calls=[("x", {})], fault="garbage").add(text="clean")
    status, events = run(wire.url, protocol)
    assert status == 0 and events[-1]["answer"] == "clean"


@every
def test_stalled_stream_fails_within_the_read_timeout(wire: WireServer, protocol: str) -> None:
    wire.add(text="never", fault="stall", stall=30)
    t0 = time.monotonic()
    status, events = run(wire.url, protocol, "--read-timeout", "0.5", "--max-retries", "0")
    assert status == 1 and time.monotonic() - t0 < 10
    assert events[-1]["error"]["kind"] == "timeout"


@every
def test_connection_refused_fails_after_retries(protocol: str) -> None:
    status, events = run("http://127.0.0.1:9/v1", protocol, "--max-retries", "1")
    assert status == 1
    assert [e["type"] for e in events].count("retry") == 1
    assert events[-1]["error"]["kind"] == "connection"


@every
def test_429_then_500_then_success(wire: WireServer, protocol: str) -> None:
    wire.add(status=429, headers={"Retry-After": "0.1"}).add(status=500).add(text="made it")
    status, events = run(wire.url, protocol)
    assert status == 0 and events[-1]["answer"] == "made it"
    assert next(e["delay"] for e in events if e["type"] == "retry") == 0.1
