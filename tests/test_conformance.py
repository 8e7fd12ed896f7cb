"""Recorded provider responses, written from each provider's API reference, replayed byte for byte
to `tether run --json --max-steps 1 --max-retries 1 --store memory`, through the real clients over
HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import TETHER, cli_env
from wire_server import WireServer

RECORDINGS = Path(__file__).parent / "recordings"
PROVIDER = {"chat": "openai-chat", "responses": "openai-responses", "anthropic": "anthropic"}


def usage(i: int, c: int, o: int, r: int = 0) -> dict[str, int]:
    return {"input_tokens": i, "cached_input_tokens": c, "output_tokens": o, "reasoning_tokens": r}


# (protocol, file, text, tool calls [(id, name, arguments)], usage, stop_reason)
REPLIES: list[tuple[str, str, str, list[tuple[str, str, dict[str, Any]]], dict[str, int], str]] = [
    ("chat", "text.json", "The capital of France is Paris.", [], usage(1117, 1024, 46), "end_turn"),
    (
        "chat",
        "tool_calls.json",
        "",
        [
            ("call_abc123", "get_current_weather", {"location": "Boston, MA"}),
            ("call_def456", "get_current_weather", {"location": "Paris", "unit": "celsius"}),
        ],
        usage(82, 0, 17),
        "tool_use",
    ),
    (
        "chat",
        "length.json",
        "Once upon a time, in a land far",
        [],
        usage(20, 0, 64, 48),
        "max_tokens",
    ),
    ("chat", "text.sse", "Hello! How can I help you today?", [], usage(9, 0, 9), "end_turn"),
    (
        "chat",
        "tool_calls.sse",
        "",
        [
            ("call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather", {"location": "Paris"}),
            ("call_8hdbAOIpXn5Kz6f0p2wbDPQm", "get_weather", {"location": "Bogotá, Colombia"}),
        ],
        usage(215, 128, 49),
        "tool_use",
    ),
    (
        "responses",
        "text.json",
        "In a peaceful grove beneath a silver moon, a unicorn named Lumina "
        "discovered a hidden pool.",
        [],
        usage(36, 0, 87),
        "end_turn",
    ),
    (
        "responses",
        "tool_calls.json",
        "",
        [
            ("call_12345xyz", "get_weather", {"location": "Paris, France"}),
            ("call_67890abc", "get_weather", {"location": "Bogotá, Colombia"}),
        ],
        usage(291, 256, 152, 128),
        "tool_use",
    ),
    (
        "responses",
        "incomplete.json",
        "The three laws are: first, an object at rest",
        [],
        usage(14, 0, 16),
        "max_tokens",
    ),
    (
        "responses",
        "text.sse",
        "Hi there! How can I assist you today?",
        [],
        usage(37, 0, 11),
        "end_turn",
    ),
    (
        "responses",
        "tool_calls.sse",
        "",
        [
            ("call_1234xyz", "get_weather", {"location": "Paris, France"}),
            ("call_5678abc", "get_time", {}),
        ],
        usage(120, 0, 40),
        "tool_use",
    ),
    ("anthropic", "text.json", "Hi! My name is Claude.", [], usage(3995, 1800, 503), "end_turn"),
    (
        "anthropic",
        "tool_use.json",
        "I'll check the current weather in San Francisco for you.",
        [
            (
                "toolu_01A09q90qw90lq917835lq9",
                "get_weather",
                {"location": "San Francisco, CA", "unit": "celsius"},
            ),
            ("toolu_01B7z3", "get_time", {}),
        ],
        usage(472, 0, 91),
        "tool_use",
    ),
    (
        "anthropic",
        "server_tool.json",
        "I'll search for that.Claude Shannon was born on April 30, 1916.",
        [],
        usage(6039, 0, 931),
        "end_turn",
    ),
    (
        "anthropic",
        "max_tokens.json",
        "Here is a long essay about the history of",
        [],
        usage(12, 0, 10),
        "max_tokens",
    ),
    ("anthropic", "text.sse", "Hello!", [], usage(35, 10, 15), "end_turn"),
    (
        "anthropic",
        "tool_use.sse",
        "Okay, let's check the weather for San Francisco, CA:",
        [
            ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", {"location": "San Francisco, CA"}),
            ("toolu_01NoArgs", "get_time", {}),
        ],
        usage(472, 0, 89),
        "tool_use",
    ),
]


def run(wire: WireServer, protocol: str, stream: bool) -> tuple[int, list[dict[str, Any]], str]:
    args = [
        *TETHER,
        "run",
        "recorded",
        "--provider",
        PROVIDER[protocol],
        "--base-url",
        wire.url,
        "--json",
        "--max-steps",
        "1",
        "--max-retries",
        "1",
        "--store",  # what is tested is the wire format; durable runs are tested on their own
        "memory",
    ]
    if not stream:
        args.append("--no-stream")
    p = warm.run(
        args,
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(OPENAI_API_KEY="sk-rec", ANTHROPIC_API_KEY="sk-ant-rec"),
    )
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()], p.stderr


def recorded(protocol: str, name: str, **extra: Any) -> dict[str, Any]:
    sse = name.endswith(".sse")
    return {
        "raw": (RECORDINGS / protocol / name).read_bytes(),
        "content_type": "text/event-stream" if sse else "application/json",
        **extra,
    }


@pytest.mark.parametrize(
    ("protocol", "name", "text", "calls", "usage", "stop"),
    REPLIES,
    ids=[f"{r[0]}-{r[1]}" for r in REPLIES],
)
def test_recorded_reply(
    wire: WireServer,
    protocol: str,
    name: str,
    text: str,
    calls: list[tuple[str, str, dict[str, Any]]],
    usage: dict[str, int],
    stop: str,
) -> None:
    wire.add(**recorded(protocol, name))
    status, events, stderr = run(wire, protocol, stream=name.endswith(".sse"))
    response = next(e for e in events if e["type"] == "model_response")
    assert response["text"] == text
    assert [(c["id"], c["name"], c["arguments"]) for c in response["tool_calls"]] == calls
    assert response["usage"] == usage
    assert response["stop_reason"] == stop
    final = events[-1]
    # one step only: a reply with tool calls runs them (unknown here: error results), then halts
    assert (status, final["outcome"]) == ((3, "halted") if calls else (0, "done")), stderr
    if name.endswith(".sse"):
        assert "".join(e["text"] for e in events if e["type"] == "text_delta") == text


ERRORS = [(p, s) for p in PROVIDER for s in (400, 401, 404, 429, 500, 529)]


@pytest.mark.parametrize(("protocol", "status"), ERRORS, ids=[f"{p}-{s}" for p, s in ERRORS])
def test_recorded_error_body(wire: WireServer, protocol: str, status: int) -> None:
    body = json.loads((RECORDINGS / protocol / "errors.json").read_text())[str(status)]
    provider_message = body["error"]["message"]
    retryable = status in (429, 500, 529)
    headers = {"retry-after": "1"} if status == 429 else {}
    for _ in range(2 if retryable else 1):
        wire.add(raw=json.dumps(body).encode(), status=status, headers=headers)
    exit_status, events, stderr = run(wire, protocol, stream=True)
    assert exit_status == 1, stderr
    final = events[-1]
    assert final["type"] == "run_finished" and final["outcome"] == "failed"
    error = final["error"]
    assert error["status"] == status
    assert provider_message in error["message"]
    assert error["retryable"] is retryable
    retries = [e for e in events if e["type"] == "retry"]
    assert len(retries) == (1 if retryable else 0)
    assert len(wire.requests) == (2 if retryable else 1)
    if status == 429:
        assert retries[0]["delay"] == 1.0  # Retry-After was obeyed
    assert "sk-rec" not in json.dumps(events) + stderr and "sk-ant-rec" not in stderr


@pytest.mark.parametrize(
    ("protocol", "name"), [("anthropic", "overloaded.sse"), ("responses", "failed.sse")]
)
def test_recorded_failure_inside_the_stream_is_retried_once(
    wire: WireServer, protocol: str, name: str
) -> None:
    wire.add(**recorded(protocol, name)).add(**recorded(protocol, name))
    exit_status, events, _ = run(wire, protocol, stream=True)
    assert exit_status == 1
    final = events[-1]
    assert final["outcome"] == "failed" and final["error"]["retryable"] is True
    assert [e["type"] for e in events].count("retry") == 1 and len(wire.requests) == 2
