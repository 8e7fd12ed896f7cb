"""Chat Completions quirks, each pinned by its own test (shared behaviour: test_providers)."""

from __future__ import annotations

import pytest

from tether import (
    HTTPSettings,
    Message,
    ModelRequest,
    OpenAIChatModel,
    ProviderProtocolError,
    ReasoningPart,
    ServerError,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from wire_server import WireServer

FAST = HTTPSettings(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=2)
ADD = ToolSpec("add", "Add two numbers.", {"type": "object", "properties": {}})


def client(server: WireServer, stream: bool, settings: HTTPSettings = FAST) -> OpenAIChatModel:
    return OpenAIChatModel(
        "gpt-test", api_key="sk-test-secret", base_url=server.url, stream=stream, settings=settings
    )


def request(*messages: Message) -> ModelRequest:
    return ModelRequest(messages or (Message.user("hi"),), (ADD,), "be brief")


both = pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])


@both
async def test_text_reply_and_usage(wire: WireServer, stream: bool) -> None:
    wire.add(
        text="Hello there, friend.",
        usage={"prompt": 120, "completion": 7, "cached": 100, "reasoning": 3},
    )
    deltas: list[str] = []
    model = client(wire, stream)
    r = await model.respond(request(), on_text=deltas.append)
    await model.aclose()
    assert r.message.text == "Hello there, friend."
    assert r.stop_reason == "end_turn"
    assert (r.usage.input_tokens, r.usage.cached_input_tokens) == (120, 100)
    assert (r.usage.output_tokens, r.usage.reasoning_tokens) == (7, 3)
    if stream:
        assert deltas and "".join(deltas) == "Hello there, friend."  # a piece a read
        assert wire.requests[0]["stream_options"] == {"include_usage": True}
    assert wire.headers[0]["Authorization"] == "Bearer sk-test-secret"


@pytest.mark.parametrize("style", ["repeat_id_name", "null_args", "id_then_args", "no_index"])
async def test_streamed_tool_call_quirks_of_compatible_servers(
    wire: WireServer, style: str
) -> None:
    wire.add(calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 5, "b": 6})], style=style)
    model = client(wire, True)
    r = await model.respond(request())
    await model.aclose()
    assert [(c.name, c.arguments) for c in r.message.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("add", {"a": 5, "b": 6}),
    ]


@both
async def test_first_choice_is_used(wire: WireServer, stream: bool) -> None:
    wire.add(text="first", choices=2)
    model = client(wire, stream)
    r = await model.respond(request())
    await model.aclose()
    assert r.message.text == "first"


async def test_request_shape_content_empty_beside_tool_calls(wire: WireServer) -> None:
    wire.add(text="ok")
    call = ToolCall("call_9", "add", {"a": 1}, '{"a": 1}')
    history = (
        Message.user("add 1"),
        Message("assistant", (call,)),
        Message("tool", (ToolResult("call_9", "add", "1"),)),
    )
    model = client(wire, False)
    await model.respond(request(*history))
    await model.aclose()
    sent = wire.requests[0]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assistant = sent["messages"][2]
    assert assistant["content"] == ""  # never null: llama.cpp's server rejects null
    assert assistant["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "call_9", "content": "1"}
    assert sent["tools"][0]["function"]["name"] == "add"
    assert "stream" not in sent


async def test_error_in_stream_body(wire: WireServer) -> None:
    wire.add(status=200, body={"error": {"message": "quota exhausted for this key"}})
    model = client(wire, False, HTTPSettings(max_retries=0))
    with pytest.raises(ProviderProtocolError) as info:  # a 200 with an error body, no reply
        await model.respond(request())
    await model.aclose()
    assert "quota exhausted for this key" in info.value.message


async def test_server_error_type(wire: WireServer) -> None:
    wire.add(status=502, body={"not": "openai"})
    model = client(wire, False, HTTPSettings(max_retries=0))
    with pytest.raises(ServerError) as info:
        await model.respond(request())
    await model.aclose()
    assert info.value.status == 502 and info.value.retryable


@both
async def test_reasoning_content_is_kept_and_not_sent_back(wire: WireServer, stream: bool) -> None:
    wire.add(text="42.", reasoning="Six times seven.").add(text="ok")
    model = client(wire, stream)
    r = await model.respond(request())
    assert r.message.text == "42."
    assert [p.text for p in r.message.parts if isinstance(p, ReasoningPart)] == ["Six times seven."]
    await model.respond(request(Message.user("q"), r.message, Message.user("again")))
    await model.aclose()
    assert wire.requests[1]["messages"][2] == {"role": "assistant", "content": "42."}
