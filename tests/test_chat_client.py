"""The Chat Completions client against a server speaking the exact wire format, over real HTTP."""

from __future__ import annotations

import asyncio
import time

import pytest

from chat_server import ChatServer
from tether import (
    HTTPSettings,
    Message,
    ModelRequest,
    OpenAIChatModel,
    ProviderConnectionError,
    ProviderProtocolError,
    ProviderTimeout,
    RateLimited,
    ReasoningPart,
    ServerError,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from tether.errors import ClientRequestError

FAST = HTTPSettings(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=2)
ADD = ToolSpec("add", "Add two numbers.", {"type": "object", "properties": {}})


def client(server: ChatServer, stream: bool, settings: HTTPSettings = FAST) -> OpenAIChatModel:
    return OpenAIChatModel(
        "gpt-test", api_key="sk-test-secret", base_url=server.url, stream=stream, settings=settings
    )


def request(*messages: Message) -> ModelRequest:
    return ModelRequest(messages or (Message.user("hi"),), (ADD,), "be brief")


both = pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])


@both
async def test_text_reply_and_usage(chat_server: ChatServer, stream: bool) -> None:
    chat_server.add(
        text="Hello there, friend.",
        usage={"prompt": 120, "completion": 7, "cached": 100, "reasoning": 3},
    )
    deltas: list[str] = []
    model = client(chat_server, stream)
    r = await model.respond(request(), on_text=deltas.append)
    await model.aclose()
    assert r.message.text == "Hello there, friend."
    assert r.stop_reason == "end_turn"
    assert (r.usage.input_tokens, r.usage.cached_input_tokens) == (120, 100)
    assert (r.usage.output_tokens, r.usage.reasoning_tokens) == (7, 3)
    if stream:
        assert len(deltas) >= 3 and "".join(deltas) == "Hello there, friend."
        assert chat_server.requests[0]["stream_options"] == {"include_usage": True}
    assert chat_server.headers[0]["Authorization"] == "Bearer sk-test-secret"


@both
async def test_several_tool_calls_with_text_in_one_reply(
    chat_server: ChatServer, stream: bool
) -> None:
    chat_server.add(
        text="Adding.",
        calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 30, "b": 4}), ("noargs", "")],
    )
    model = client(chat_server, stream)
    r = await model.respond(request())
    await model.aclose()
    assert r.message.text == "Adding."
    assert r.stop_reason == "tool_use"
    assert [(c.name, c.arguments) for c in r.message.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("add", {"a": 30, "b": 4}),
        ("noargs", {}),
    ]
    assert len({c.id for c in r.message.tool_calls}) == 3


@pytest.mark.parametrize("style", ["repeat_id_name", "null_args", "id_then_args", "no_index"])
async def test_streamed_tool_call_quirks_of_compatible_servers(
    chat_server: ChatServer, style: str
) -> None:
    chat_server.add(calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 5, "b": 6})], style=style)
    model = client(chat_server, True)
    r = await model.respond(request())
    await model.aclose()
    assert [(c.name, c.arguments) for c in r.message.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("add", {"a": 5, "b": 6}),
    ]


@both
async def test_first_choice_is_used(chat_server: ChatServer, stream: bool) -> None:
    chat_server.add(text="first", choices=2)
    model = client(chat_server, stream)
    r = await model.respond(request())
    await model.aclose()
    assert r.message.text == "first"


@both
async def test_finish_reason_length_maps_to_max_tokens(
    chat_server: ChatServer, stream: bool
) -> None:
    chat_server.add(text="cut sho", finish_reason="length")
    model = client(chat_server, stream)
    r = await model.respond(request())
    await model.aclose()
    assert r.stop_reason == "max_tokens"


async def test_request_shape_content_empty_beside_tool_calls(chat_server: ChatServer) -> None:
    chat_server.add(text="ok")
    call = ToolCall("call_9", "add", {"a": 1}, '{"a": 1}')
    history = (
        Message.user("add 1"),
        Message("assistant", (call,)),
        Message("tool", (ToolResult("call_9", "add", "1"),)),
    )
    model = client(chat_server, False)
    await model.respond(request(*history))
    await model.aclose()
    sent = chat_server.requests[0]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assistant = sent["messages"][2]
    assert assistant["content"] == ""  # never null: llama.cpp's server rejects null
    assert assistant["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "call_9", "content": "1"}
    assert sent["tools"][0]["function"]["name"] == "add"
    assert "stream" not in sent


@both
async def test_429_with_retry_after_is_retried(chat_server: ChatServer, stream: bool) -> None:
    chat_server.add(status=429, type="rate_limit_exceeded", headers={"Retry-After": "0.2"})
    chat_server.add(text="after the wait")
    retries: list[tuple[int, float]] = []
    model = client(chat_server, stream)
    t0 = time.monotonic()
    r = await model.respond(request(), on_retry=lambda a, d, e: retries.append((a, d)))
    await model.aclose()
    assert r.message.text == "after the wait"
    assert retries == [(1, 0.2)]
    assert time.monotonic() - t0 >= 0.2


@both
async def test_500_then_success(chat_server: ChatServer, stream: bool) -> None:
    chat_server.add(status=500).add(status=503).add(text="third time")
    model = client(chat_server, stream)
    r = await model.respond(request())
    await model.aclose()
    assert r.message.text == "third time"
    assert len(chat_server.requests) == 3


async def test_retries_exhausted_raise_with_status_and_type(chat_server: ChatServer) -> None:
    for _ in range(3):
        chat_server.add(
            status=429,
            type="rate_limit_exceeded",
            message="slow down",
            headers={"Retry-After": "0"},
        )
    model = client(chat_server, True)
    with pytest.raises(RateLimited) as info:
        await model.respond(request())
    await model.aclose()
    e = info.value
    assert (e.status, e.error_type, e.retryable, e.retry_after) == (
        429,
        "rate_limit_exceeded",
        True,
        0,
    )
    assert "slow down" in e.message
    assert len(chat_server.requests) == 3  # the first try and --max-retries 2


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_client_errors_are_not_retried(chat_server: ChatServer, status: int) -> None:
    chat_server.add(status=status, type="invalid_request_error", message="bad thing")
    model = client(chat_server, True)
    with pytest.raises(ClientRequestError) as info:
        await model.respond(request())
    await model.aclose()
    assert info.value.status == status and not info.value.retryable
    assert len(chat_server.requests) == 1
    assert "sk-test-secret" not in str(info.value)


async def test_connection_refused_is_retried_then_fails() -> None:
    model = OpenAIChatModel("m", api_key="k", base_url="http://127.0.0.1:9/v1", settings=FAST)
    retries: list[int] = []
    with pytest.raises(ProviderConnectionError) as info:
        await model.respond(request(), on_retry=lambda a, d, e: retries.append(a))
    await model.aclose()
    assert info.value.retryable and retries == [1, 2]


async def test_reset_before_first_byte_is_retried(chat_server: ChatServer) -> None:
    chat_server.add(fault="reset").add(text="recovered")
    model = client(chat_server, True)
    r = await model.respond(request())
    await model.aclose()
    assert r.message.text == "recovered"


async def test_reset_mid_stream_after_text_is_not_retried(chat_server: ChatServer) -> None:
    chat_server.add(text="partial answer here", deltas=3, cut_after=3)
    chat_server.add(text="must not be used")
    deltas: list[str] = []
    model = client(chat_server, True)
    with pytest.raises(ProviderConnectionError):
        await model.respond(request(), on_text=deltas.append)
    await model.aclose()
    assert deltas  # text had been shown, so a retry would have repeated it
    assert len(chat_server.requests) == 1


async def test_stream_without_terminal_event_is_an_error(chat_server: ChatServer) -> None:
    for _ in range(3):
        chat_server.add(calls=[("add", {"a": 1})], fault="no_done")
    model = client(chat_server, True)
    with pytest.raises(ProviderProtocolError, match="ended before"):
        await model.respond(request())
    await model.aclose()


async def test_garbage_sse_line_is_a_protocol_error(chat_server: ChatServer) -> None:
    for _ in range(3):
        chat_server.add(text="x", fault="garbage")
    model = client(chat_server, True)
    with pytest.raises(ProviderProtocolError, match="unreadable"):
        await model.respond(request())
    await model.aclose()


async def test_stalled_stream_times_out(chat_server: ChatServer) -> None:
    chat_server.add(text="never", fault="stall", stall=5)
    settings = HTTPSettings(max_retries=0, read_timeout=0.3)
    model = client(chat_server, True, settings)
    t0 = time.monotonic()
    with pytest.raises(ProviderTimeout):
        await model.respond(request())
    await model.aclose()
    assert time.monotonic() - t0 < 3


async def test_cancel_closes_the_stream(chat_server: ChatServer) -> None:
    chat_server.add(text="slow stream of words", deltas=5, chunk_delay=1)
    model = client(chat_server, True)
    task = asyncio.create_task(model.respond(request()))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await model.aclose()
    for _ in range(50):
        if chat_server.closed_streams:
            break
        await asyncio.sleep(0.05)
    assert chat_server.closed_streams == 1


async def test_error_in_stream_body(chat_server: ChatServer) -> None:
    chat_server.add(status=200, body={"error": {"message": "x"}})  # a 200 with an error body
    model = client(chat_server, False, HTTPSettings(max_retries=0))
    with pytest.raises(ProviderProtocolError):
        await model.respond(request())
    await model.aclose()


async def test_server_error_type(chat_server: ChatServer) -> None:
    chat_server.add(status=502, body={"not": "openai"})
    model = client(chat_server, False, HTTPSettings(max_retries=0))
    with pytest.raises(ServerError) as info:
        await model.respond(request())
    await model.aclose()
    assert info.value.status == 502 and info.value.retryable


@both
async def test_reasoning_content_is_kept_and_not_sent_back(
    chat_server: ChatServer, stream: bool
) -> None:
    chat_server.add(text="42.", reasoning="Six times seven.").add(text="ok")
    model = client(chat_server, stream)
    r = await model.respond(request())
    assert r.message.text == "42."
    assert [p.text for p in r.message.parts if isinstance(p, ReasoningPart)] == ["Six times seven."]
    await model.respond(request(Message.user("q"), r.message, Message.user("again")))
    await model.aclose()
    assert chat_server.requests[1]["messages"][2] == {"role": "assistant", "content": "42."}
