"""Faults injected through the wire mock, seen from `tether run`: a retry where it is safe, else a
clear failed outcome; never a hang, never a partial answer reported as complete."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import TETHER, cli_env
from wire_server import WireServer

PROVIDERS = {"chat": "openai-chat", "responses": "openai-responses", "anthropic": "anthropic"}
every = pytest.mark.parametrize("protocol", list(PROVIDERS))


def run(url: str, protocol: str, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    """`tether run` against the mock; in memory unless the test names a store (the faults are
    the HTTP layer's, the same in a durable run, which the tests that name SQLite show)."""
    if "--store" not in extra:
        extra = (*extra, "--store", "memory")
    p = warm.run(
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
    types = [e["type"] for e in events]
    # the reply with the unreadable line was asked for again, not read past
    assert types.count("retry") == 1 and "tool_call" not in types and len(wire.requests) == 2


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


@every
@pytest.mark.parametrize("counted", [False, True], ids=["no-usage", "counted"])
def test_token_budgets_hold_when_the_server_sends_no_usage(
    wire: WireServer, protocol: str, counted: bool
) -> None:
    """llama.cpp's server (and some gateways) stream no usage: the counts are estimated and
    marked so, and the budget halts the run as it does when the server counts."""
    text = "A long preamble before the call. " * 20
    if counted:
        wire.add(text=text, calls=[("look", {})], usage={"completion": 167})
    else:
        wire.add(text=text, calls=[("look", {})], no_usage=True)
    wire.add(text="never asked for")
    status, events = run(wire.url, protocol, "--tools", "none", "--max-output-tokens", "50")
    finished = events[-1]
    assert status == 3 and finished["outcome"] == "halted", finished
    assert finished["reason"].startswith("max_output_tokens")
    [response] = [e for e in events if e["type"] == "model_response"]
    usage = response["usage"]
    assert usage["output_tokens"] > 50 and usage["input_tokens"] > 0
    assert usage.get("estimated", False) is not counted
    assert len(wire.requests) == 1


def test_a_paused_anthropic_turn_is_sent_back_and_goes_on(wire: WireServer) -> None:
    """`pause_turn` (a server tool paused a long turn) is not an answer: the model gets the
    turn back and finishes it, and the answer is the whole turn."""
    wire.add(text="Searching the web took a while. ", finish_reason="pause_turn")
    wire.add(text="The answer is 42.")
    status, events = run(wire.url, "anthropic")
    assert status == 0
    assert events[-1]["outcome"] == "done"
    assert events[-1]["answer"] == "Searching the web took a while. The answer is 42."
    assert len(wire.requests) == 2
    sent_back = wire.requests[1]["messages"][-1]
    assert sent_back["role"] == "assistant"
    assert sent_back["content"][0]["text"] == "Searching the web took a while. "


IN_STREAM_ERRORS = [
    # a gateway's error at HTTP 200: `type` names it (not the `code` detail), and its own
    # status classes it (a 400 is the request's fault, never retried)
    (
        "chat",
        {
            "message": "Failed to call a function.",
            "type": "invalid_request_error",
            "code": "tool_use_failed",
            "status": 400,
        },
        ("client_error", 400, "invalid_request_error"),
    ),
    # Responses names the kind in `code`
    (
        "responses",
        {"code": "invalid_prompt", "message": "Your prompt was flagged."},
        ("client_error", None, "invalid_prompt"),
    ),
    # a gateway's status wins over a type that would be retried
    (
        "responses",
        {"code": "server_error", "message": "Bad tool schema.", "status": 400},
        ("client_error", 400, "server_error"),
    ),
    (
        "anthropic",
        {"type": "invalid_request_error", "message": "messages: roles must alternate"},
        ("client_error", None, "invalid_request_error"),
    ),
    (
        "anthropic",
        {"type": "api_error", "message": "Upstream said no.", "status": 403},
        ("client_error", 403, "api_error"),
    ),
]


@pytest.mark.parametrize(
    ("protocol", "error", "expected"),
    IN_STREAM_ERRORS,
    ids=[
        "chat-gateway-400",
        "responses-invalid-prompt",
        "responses-gateway-400",
        "anthropic-invalid-request",
        "anthropic-gateway-403",
    ],
)
def test_an_error_inside_a_stream_is_classed_by_its_type_and_status(
    wire: WireServer, protocol: str, error: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    """An error event at HTTP 200 that blames the request ends the run at once, with what the
    server said of it, on every protocol; it is not retried (the same request fails again)."""
    wire.add(text="partial", fault="stream_error", error=error)
    status, events = run(wire.url, protocol)
    assert status == 1
    err = events[-1]["error"]
    assert (err["kind"], err["status"], err["error_type"]) == expected
    assert not err["retryable"] and len(wire.requests) == 1
    assert error["message"] in err["message"]


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_gateways_fragmented_calls_under_one_id_are_two_calls(
    wire: WireServer, store: str, tmp_path: Path
) -> None:
    """A gateway's Anthropic stream sends each argument fragment as a block of its own, and
    two calls under one id: fragments merge into their call, the calls get distinct ids, and
    each has its result, in memory and in a durable run."""
    calls = [("look", {"q": "apples"}, "toolu_1"), ("look", {"q": "pears"}, "toolu_1")]
    wire.add(calls=calls, block_per_fragment=True).add(text="Looked twice.")
    where = "memory" if store == "memory" else f"sqlite:///{tmp_path / 'runs.db'}"
    status, events = run(wire.url, "anthropic", "--tools", "none", "--store", where)
    assert status == 0, events[-1]
    made = [e for e in events if e["type"] == "tool_call"]
    assert [c["arguments"] for c in made] == [{"q": "apples"}, {"q": "pears"}]
    ids = [c["id"] for c in made]
    assert len(set(ids)) == 2
    results = [e["id"] for e in events if e["type"] == "tool_result"]
    assert sorted(results) == sorted(ids)
    sent = wire.requests[1]["messages"]
    uses = [b["id"] for b in sent[-2]["content"] if b["type"] == "tool_use"]
    answered = [b["tool_use_id"] for b in sent[-1]["content"] if b["type"] == "tool_result"]
    assert uses == ids and sorted(answered) == sorted(ids)


def sent_ids(protocol: str, body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The ids of the calls a request sends back, and of the results, in `protocol`'s shapes."""
    if protocol == "responses":
        items = body["input"]
        calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
        return calls, [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    if protocol == "chat":
        messages = body["messages"]
        calls = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
        return calls, [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
    return calls, [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]


@every
@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_two_calls_under_one_id_get_distinct_ids_and_each_its_result(
    wire: WireServer, protocol: str, store: str, tmp_path: Path
) -> None:
    """A reply with two calls under one id (the real APIs reject the next request if the
    duplicate goes back): each call gets an id of its own, a `tool_call` event and a result,
    and the next request is one the API takes, on every protocol, in memory and durable."""
    # `look` is no tool here: each call still gets its result (an error), under its own id
    calls = [("look", {"q": "apples"}, "call_1"), ("look", {"q": "pears"}, "call_1")]
    wire.add(calls=calls).add(text="Looked twice.")
    where = "memory" if store == "memory" else f"sqlite:///{tmp_path / 'runs.db'}"
    status, events = run(wire.url, protocol, "--tools", "none", "--store", where)
    assert status == 0, events[-1]
    made = [e for e in events if e["type"] == "tool_call"]
    assert [c["arguments"] for c in made] == [{"q": "apples"}, {"q": "pears"}]
    ids = [c["id"] for c in made]
    assert len(set(ids)) == 2
    assert sorted(e["id"] for e in events if e["type"] == "tool_result") == sorted(ids)
    calls_sent, results_sent = sent_ids(protocol, wire.requests[1])
    assert calls_sent == ids and sorted(results_sent) == sorted(ids)
