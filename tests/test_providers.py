"""Every provider client against a server speaking its exact wire format, over real HTTP:
the same behaviour on Chat Completions, Responses and Anthropic Messages, streamed and not."""

from __future__ import annotations

import asyncio
import email.utils
import time
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from helpers import png, until
from tether import (
    Agent,
    FallbackModel,
    HTTPSettings,
    ImagePart,
    Message,
    Model,
    ModelRequest,
    ProviderConnectionError,
    ProviderProtocolError,
    ProviderTimeout,
    RateLimited,
    ReasoningPart,
    ServerError,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from tether.errors import ClientRequestError
from tether.messages import WireMemo
from tether.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from wire_server import WireServer

FAST = HTTPSettings(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=2)
ADD = ToolSpec("add", "Add two numbers.", {"type": "object", "properties": {}})
CLIENTS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel, "anthropic": AnthropicModel}
PROTOCOLS = list(CLIENTS)


def client(server: WireServer, protocol: str, stream: bool, settings: HTTPSettings = FAST) -> Model:
    cls = CLIENTS[protocol]
    return cls(
        "model-x",
        api_key="sk-secret-key",
        base_url=server.url,
        stream=stream,  # type: ignore[call-arg]
        settings=settings,
    )


def request(*messages: Message) -> ModelRequest:
    return ModelRequest(messages or (Message.user("hi"),), (ADD,), "be brief")


every = pytest.mark.parametrize("protocol", PROTOCOLS)
both = pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])


async def respond(model: Model, req: ModelRequest | None = None, **hooks: object):  # type: ignore[no-untyped-def]
    try:
        return await model.respond(req or request(), **hooks)  # type: ignore[arg-type]
    finally:
        await model.aclose()


@every
@both
async def test_text_and_normalized_usage(wire: WireServer, protocol: str, stream: bool) -> None:
    wire.add(
        text="Hello there, friend.",
        usage={"prompt": 120, "completion": 7, "cached": 100, "cache_write": 5},
    )
    deltas: list[str] = []
    r = await respond(client(wire, protocol, stream), on_text=deltas.append)
    assert r.message.text == "Hello there, friend."
    assert r.stop_reason == "end_turn"
    assert r.usage.input_tokens == 120  # cached (and for Anthropic cache writes) included
    assert (r.usage.cached_input_tokens, r.usage.output_tokens) == (100, 7)
    if stream:
        assert deltas and "".join(deltas) == "Hello there, friend."  # a piece a read


@every
@both
async def test_several_tool_calls_beside_text(
    wire: WireServer, protocol: str, stream: bool
) -> None:
    wire.add(
        text="Adding.",
        calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 30, "b": 4}), ("noargs", "")],
    )
    r = await respond(client(wire, protocol, stream))
    assert r.message.text == "Adding."
    assert r.stop_reason == "tool_use"
    assert [(c.name, c.arguments) for c in r.message.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("add", {"a": 30, "b": 4}),
        ("noargs", {}),
    ]
    assert len({c.id for c in r.message.tool_calls}) == 3


@every
@both
async def test_length_limit_maps_to_max_tokens(
    wire: WireServer, protocol: str, stream: bool
) -> None:
    wire.add(text="cut sho", finish_reason="length")
    r = await respond(client(wire, protocol, stream))
    assert r.stop_reason == "max_tokens" and r.message.text == "cut sho"


@every
async def test_tool_round_trip_request_shape(wire: WireServer, protocol: str) -> None:
    wire.add(calls=[("add", {"a": 1, "b": 2})]).add(text="3")
    model = client(wire, protocol, False)
    first = await model.respond(request(Message.user("add")))
    assert wire.headers[0]["Content-Type"] == "application/json"  # what every API requires
    call = first.message.tool_calls[0]
    results = Message(
        "tool", (ToolResult(call.id, "add", "3"), ToolResult("x", "add", "bad", True))
    )
    await respond(model, request(Message.user("add"), first.message, results))
    sent = wire.requests[1]
    if protocol == "chat":
        assert sent["messages"][3] == {"role": "tool", "tool_call_id": call.id, "content": "3"}
    elif protocol == "responses":
        assert sent["instructions"] == "be brief" and sent["store"] is False
        assert {
            "type": "function_call",
            "call_id": call.id,
            "name": "add",
            "arguments": '{"a":1,"b":2}',
        } in sent["input"]
        assert {"type": "function_call_output", "call_id": call.id, "output": "3"} in sent["input"]
        assert sent["tools"][0]["name"] == "add"
    else:
        assert sent["system"] == "be brief" and sent["max_tokens"] == 4096
        assert sent["messages"][1] == {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": call.id, "name": "add", "input": {"a": 1, "b": 2}}
            ],
        }
        assert sent["messages"][2]["content"] == [
            {"type": "tool_result", "tool_use_id": call.id, "content": "3"},
            {"type": "tool_result", "tool_use_id": "x", "content": "bad", "is_error": True},
        ]
        assert sent["tools"][0]["input_schema"] == {"type": "object", "properties": {}}
        assert wire.headers[0]["x-api-key"] == "sk-secret-key"
        assert wire.headers[0]["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize("protocol", ["responses", "anthropic"])
@both
async def test_reasoning_is_sent_back_unchanged(
    wire: WireServer, protocol: str, stream: bool
) -> None:
    wire.add(reasoning="I should add.", calls=[("add", {"a": 1, "b": 2})]).add(text="3")
    model = client(wire, protocol, stream)
    first = await model.respond(request(Message.user("add")))
    thought = [p for p in first.message.parts if isinstance(p, ReasoningPart)]
    assert [t.text for t in thought] == ["I should add."]
    call = first.message.tool_calls[0]
    await respond(
        model,
        request(
            Message.user("add"), first.message, Message("tool", (ToolResult(call.id, "add", "3"),))
        ),
    )
    sent = wire.requests[1]
    if protocol == "responses":
        assert wire.requests[0]["include"] == ["reasoning.encrypted_content"]
        reasoning = [i for i in sent["input"] if i.get("type") == "reasoning"]
        assert reasoning == [
            {
                "type": "reasoning",
                "id": "rs_1",
                "encrypted_content": "gAAAA-encrypted-1",
                "summary": [{"type": "summary_text", "text": "I should add."}],
            }
        ]
    else:
        assert sent["messages"][1]["content"][0] == {
            "type": "thinking",
            "thinking": "I should add.",
            "signature": "sig-1",
        }


@every
@both
async def test_429_with_retry_after_is_retried(
    wire: WireServer, protocol: str, stream: bool
) -> None:
    wire.add(status=429, type="rate_limit_error", headers={"Retry-After": "0.2"})
    wire.add(text="after the wait")
    retries: list[tuple[int, float]] = []
    t0 = time.monotonic()
    r = await respond(
        client(wire, protocol, stream), on_retry=lambda a, d, e: retries.append((a, d))
    )
    assert r.message.text == "after the wait"
    assert retries == [(1, 0.2)] and time.monotonic() - t0 >= 0.2


@every
async def test_a_retry_after_beyond_the_longest_wait_fails_at_once(
    wire: WireServer, protocol: str
) -> None:
    """`Retry-After: 3600` is not an hour's sleep, nor a capped sleep and a request sent again
    only to be refused: the call fails now and says when the server takes requests again."""
    wire.add(status=429, type="rate_limit_error", headers={"Retry-After": "3600"})
    wire.add(text="too early")
    with pytest.raises(RateLimited) as info:
        await respond(client(wire, protocol, True))
    assert len(wire.requests) == 1
    assert "3600 s" in info.value.message and "UTC" in info.value.message
    assert not info.value.retryable


@every
async def test_retry_after_in_milliseconds_and_as_an_http_date_are_obeyed(
    wire: WireServer, protocol: str
) -> None:
    """`retry-after-ms` (OpenAI's) is the wait, in milliseconds; a `Retry-After` date an hour
    ahead is beyond the longest wait, so the call fails at once instead of asking again."""
    wire.add(status=429, type="rate_limit_error", headers={"retry-after-ms": "150"})
    wire.add(text="after 150 ms")
    retries: list[tuple[int, float]] = []
    r = await respond(
        client(wire, protocol, False), on_retry=lambda a, d, e: retries.append((a, d))
    )
    assert r.message.text == "after 150 ms" and retries == [(1, 0.15)]
    later = email.utils.format_datetime(datetime.now(UTC) + timedelta(hours=1), usegmt=True)
    wire.add(status=429, type="rate_limit_error", headers={"Retry-After": later})
    wire.add(text="too early")
    with pytest.raises(RateLimited) as info:
        await respond(client(wire, protocol, False))
    assert len(wire.requests) == 3 and not info.value.retryable


async def test_anthropic_redacted_thinking_is_sent_back_unchanged(wire: WireServer) -> None:
    """A `redacted_thinking` block (encrypted by Anthropic's safety systems) goes back as it
    came, in its place before the tool call, or the API refuses the next request."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {
                "type": "redacted_thinking",
                "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw",
            },
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    wire.add(raw=orjson.dumps(message)).add(text="3")
    model = client(wire, "anthropic", False)
    first = await model.respond(request(Message.user("add")))
    call = first.message.tool_calls[0]
    result = Message("tool", (ToolResult(call.id, "add", "3"),))
    await respond(model, request(Message.user("add"), first.message, result))
    assert wire.requests[1]["messages"][1]["content"] == message["content"]


@every
async def test_an_error_body_at_status_200_is_that_error(wire: WireServer, protocol: str) -> None:
    """A gateway that answers 200 with an error object instead of a reply: the error is what
    the server said, classed by its type (the request's fault is not retried; an overload is,
    and the next reply is used)."""

    def refusal(kind: str, message: str) -> dict[str, object]:
        error = {"type": kind, "message": message}
        return {"type": "error", "error": error} if protocol == "anthropic" else {"error": error}

    wire.add(status=200, body=refusal("invalid_request_error", "quota exhausted for this key"))
    with pytest.raises(ClientRequestError) as info:
        await respond(client(wire, protocol, False))
    assert "quota exhausted for this key" in info.value.message and len(wire.requests) == 1
    wire.add(status=200, body=refusal("overloaded_error", "busy")).add(text="now then")
    r = await respond(client(wire, protocol, False))
    assert r.message.text == "now then" and len(wire.requests) == 3


@every
async def test_5xx_then_success(wire: WireServer, protocol: str) -> None:
    wire.add(status=500).add(status=529, type="overloaded_error").add(text="third time")
    r = await respond(client(wire, protocol, True))
    assert r.message.text == "third time" and len(wire.requests) == 3


@every
async def test_retries_exhausted_raise_the_error(wire: WireServer, protocol: str) -> None:
    for _ in range(3):
        wire.add(
            status=429, type="rate_limit_error", message="slow down", headers={"Retry-After": "0"}
        )
    with pytest.raises(RateLimited) as info:
        await respond(client(wire, protocol, True))
    e = info.value
    assert (e.status, e.error_type, e.retryable) == (429, "rate_limit_error", True)
    assert "slow down" in e.message and len(wire.requests) == 3


@every
@pytest.mark.parametrize("status", [400, 401, 404])
async def test_client_errors_are_not_retried(wire: WireServer, protocol: str, status: int) -> None:
    wire.add(status=status, type="invalid_request_error", message="bad thing")
    with pytest.raises(ClientRequestError) as info:
        await respond(client(wire, protocol, True))
    assert info.value.status == status and not info.value.retryable
    assert "bad thing" in str(info.value) and "sk-secret-key" not in str(info.value)
    assert len(wire.requests) == 1


@every
async def test_connection_refused_is_retried_then_fails(protocol: str) -> None:
    model = CLIENTS[protocol]("m", api_key="k", base_url="http://127.0.0.1:9/v1", settings=FAST)  # type: ignore[call-arg]
    retries: list[int] = []
    with pytest.raises(ProviderConnectionError) as info:
        await respond(model, on_retry=lambda a, d, e: retries.append(a))
    assert info.value.retryable and retries == [1, 2]


@every
async def test_reset_before_first_byte_is_retried(wire: WireServer, protocol: str) -> None:
    wire.add(fault="reset").add(text="recovered")
    r = await respond(client(wire, protocol, True))
    assert r.message.text == "recovered"


@every
async def test_reset_mid_stream_after_text_is_not_retried(wire: WireServer, protocol: str) -> None:
    wire.add(text="partial answer here, and more", deltas=3, cut_after=6)
    wire.add(text="must not be used")
    deltas: list[str] = []
    with pytest.raises(ProviderConnectionError):
        await respond(client(wire, protocol, True), on_text=deltas.append)
    assert deltas and len(wire.requests) == 1  # text was shown: a retry would repeat it


@every
async def test_stream_without_terminal_event_is_never_complete(
    wire: WireServer, protocol: str
) -> None:
    for _ in range(3):
        wire.add(calls=[("add", {"a": 1})], fault="no_done")
    with pytest.raises(ProviderProtocolError, match="ended before"):
        await respond(client(wire, protocol, True))
    assert len(wire.requests) == 3  # nothing was emitted, so each was retried


@every
async def test_garbage_sse_line_is_a_protocol_error(wire: WireServer, protocol: str) -> None:
    for _ in range(3):
        wire.add(text="x", fault="garbage")
    with pytest.raises(ProviderProtocolError, match="unreadable"):
        await respond(client(wire, protocol, True))
    assert len(wire.requests) == 3  # asked again each time (nothing was shown), never read past


@every
async def test_error_event_in_stream_is_retried_then_succeeds(
    wire: WireServer, protocol: str
) -> None:
    wire.add(calls=[("add", {})], fault="stream_error").add(text="fine now")
    r = await respond(client(wire, protocol, True))
    assert r.message.text == "fine now" and len(wire.requests) == 2


@every
async def test_error_event_in_stream_fails_when_retries_run_out(
    wire: WireServer, protocol: str
) -> None:
    wire.add(calls=[("add", {})], fault="stream_error")
    with pytest.raises(ServerError) as info:
        await respond(client(wire, protocol, True, HTTPSettings(max_retries=0)))
    said = {"anthropic": ("overloaded_error", "Overloaded")}
    error_type, message = said.get(protocol, ("server_error", "The server had an error"))
    assert info.value.error_type == error_type and message in info.value.message
    assert info.value.retryable and len(wire.requests) == 1  # transient, but no retries left


@every
async def test_stalled_stream_times_out(wire: WireServer, protocol: str) -> None:
    wire.add(text="never", fault="stall", stall=5)
    t0 = time.monotonic()
    with pytest.raises(ProviderTimeout):
        await respond(client(wire, protocol, True, HTTPSettings(max_retries=0, read_timeout=0.3)))
    assert time.monotonic() - t0 < 3


@every
async def test_cancel_closes_the_stream_at_once(wire: WireServer, protocol: str) -> None:
    wire.add(text="a slow stream of many words", deltas=6, chunk_delay=1)
    model = client(wire, protocol, True)
    task = asyncio.create_task(model.respond(request()))
    await until(lambda: wire.requests, "the request to reach the server")
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: wire.closed_streams, "the server to see the stream closed", 5)
    await model.aclose()
    assert wire.closed_streams == 1
    assert wire.closed_at[0] - cancelled_at < 0.5  # the server saw the socket close


@every
async def test_a_streamed_reply_leaves_no_stream_for_the_loop_to_close(
    wire: WireServer, protocol: str
) -> None:
    """A reply read to its end, or given up on at an error, closes its stream reader there and
    then. One left open is closed later by the event loop's finalizer hook, a cross-thread
    wake-up and a task for every model call (measured: 4,000 extra tasks in 1,000 runs)."""
    import sys

    wire.add(text="done at once").add(calls=[("add", {"a": 1})])
    wire.add(text="x", fault="garbage")
    firstiter, finalizer = sys.get_asyncgen_hooks()
    left_open: list[object] = []

    def counting(agen: object) -> None:
        left_open.append(agen)
        if finalizer is not None:
            finalizer(agen)

    sys.set_asyncgen_hooks(firstiter, counting)
    model = client(wire, protocol, True, HTTPSettings(max_retries=0))
    try:
        assert (await model.respond(request())).message.text == "done at once"
        assert (await model.respond(request())).message.tool_calls
        with pytest.raises(ProviderProtocolError, match="unreadable"):
            await model.respond(request())
    finally:
        sys.set_asyncgen_hooks(firstiter, finalizer)
        await model.aclose()
    assert left_open == []


def test_sse_parser_handles_split_lines_crlf_comments_and_multiline_data() -> None:
    from tether.providers.sse import SSEParser

    p = SSEParser()
    stream = b': comment\r\nevent: a\r\ndata: {"x"\r\ndata: :1}\r\n\r\ndata: two\n\ndata: tail'
    events = []
    for i in range(0, len(stream), 3):  # split everywhere, even inside CRLF
        events += p.feed(stream[i : i + 3])
    events += p.close()
    assert events == [("a", b'{"x"\n:1}'), (None, b"two"), (None, b"tail")]


@pytest.mark.parametrize(
    "stream",
    [
        b'data: {"a": 1}\n\ndata:{"b": 2}\n\ndata: [DONE]\n\n',
        b"data: one\n\nevent: named\ndata: two\n\n: ping\n\ndata: x\ndata: y\n\ndata: end\n\n",
        b"data: one\n\n\n\ndata: two\r\n\r\ndata: three\n\n",
        b"data:\n\ndata:  two spaces\n\nretry: 10\ndata: x\n\nid: 1\n\ndata: end\n\n",
    ],
)
def test_sse_events_are_the_same_however_the_stream_is_cut(stream: bytes) -> None:
    """Whole `data:` events are read a block at a time, anything else line by line: cut in
    two anywhere (inside a line, between the two newlines, inside CRLF), the events are the
    same as read in one piece, and as read a byte at a time."""
    from tether.providers.sse import SSEParser

    def read(pieces: list[bytes]) -> list[tuple[str | None, bytes]]:
        p = SSEParser()
        return [e for piece in pieces for e in p.feed(piece)] + p.close()

    whole = read([stream])
    assert whole == read([stream[i : i + 1] for i in range(len(stream))])
    assert all(read([stream[:cut], stream[cut:]]) == whole for cut in range(1, len(stream)))
    assert len(whole) >= 3 and whole[-1][1] in (b"[DONE]", b"end", b"three")
    if stream.startswith(b"data:\n"):  # an empty value, and one space only is taken off
        assert whole[:3] == [(None, b""), (None, b" two spaces"), (None, b"x")]


@every
async def test_tool_choice_names_a_tool_in_each_dialect(wire: WireServer, protocol: str) -> None:
    wire.add(calls=[("add", {"a": 1})])
    req = ModelRequest((Message.user("add"),), (ADD,), None, None, "add")
    await respond(client(wire, protocol, False), req)
    expected = {
        "chat": {"type": "function", "function": {"name": "add"}},
        "responses": {"type": "function", "name": "add"},
        "anthropic": {"type": "tool", "name": "add"},
    }
    assert wire.requests[0]["tool_choice"] == expected[protocol]


def test_model_classes_read_the_providers_usual_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`OpenAIChatModel("gpt-4.1-mini")` with OPENAI_API_KEY set works as every peer's does;
    without a key for the provider's own endpoint it is MissingAPIKey naming the variable,
    at once; a server of one's own needs no key."""
    from tether import AnthropicModel, MissingAPIKey, OpenAIChatModel, OpenAIResponsesModel

    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    for cls, variable in (
        (OpenAIChatModel, "OPENAI_API_KEY"),
        (OpenAIResponsesModel, "OPENAI_API_KEY"),
        (AnthropicModel, "ANTHROPIC_API_KEY"),
    ):
        with pytest.raises(MissingAPIKey, match=variable) as caught:
            cls("m")
        assert caught.value.variable == variable
    own = OpenAIChatModel("llama3.2", base_url="http://127.0.0.1:11434/v1")
    assert own.http.base_url.startswith("http://127.0.0.1:11434")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    chat, claude = OpenAIChatModel("m"), AnthropicModel("c")
    assert chat.http.headers["Authorization"] == "Bearer sk-from-env"
    assert chat.http.base_url.startswith("http://127.0.0.1:9/v1")
    assert claude.http.headers["x-api-key"] == "sk-ant-from-env"
    given = OpenAIChatModel("m", api_key="sk-given", base_url="http://127.0.0.1:8/v1")
    assert given.http.headers["Authorization"] == "Bearer sk-given"


NEVER_CLOSED = """
import asyncio, sys
from tether import Agent, AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

kind = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel, "anthropic": AnthropicModel}
model = kind[sys.argv[1]]("m", base_url=sys.argv[2], api_key="k")
agent = Agent(model, [])
print(asyncio.run(agent.run("hi")).answer)
print(asyncio.run(agent.run("hi again")).answer)  # another loop: the model works there too
"""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_program_that_never_closes_its_model_exits_without_a_warning(
    wire: WireServer, protocol: str
) -> None:
    """A model's connections close with the event loop that made them (`asyncio.run`): no
    "Unclosed client session" at exit, and the model works on the next loop."""
    import sys

    import warm

    wire.add(text="one").add(text="two")
    done = warm.run(
        [sys.executable, "-X", "dev", "-c", NEVER_CLOSED, protocol, wire.url],
        capture_output=True, text=True, timeout=60, env=warm.cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["one", "two"]
    assert "Unclosed" not in done.stderr and "Warning" not in done.stderr, done.stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_model_closes_at_the_end_of_its_with_block(wire: WireServer, protocol: str) -> None:

    wire.add(text="one").add(text="two")
    async with CLIENTS[protocol]("m", base_url=wire.url, api_key="k") as model:
        assert (await Agent(model, []).run("hi")).answer == "one"
        session = model.http.session()
    assert session.closed
    first, second = (CLIENTS[protocol](n, base_url=wire.url, api_key="k") for n in "ab")
    async with FallbackModel(first, second) as both:
        assert (await Agent(both, []).run("hi")).answer == "two"
        sessions = [m.http.session() for m in (first, second)]
    assert all(s.closed for s in sessions)


@every
async def test_a_runs_messages_are_converted_once_and_sent_as_they_were_without_the_memo(
    wire: WireServer, protocol: str
) -> None:
    """A run's requests carry its `WireMemo`: Chat and Responses make each message into their
    wire form once a run, and every body says exactly what it said when each call converted
    them all, through a growing conversation, one rewritten (a fitted context) and one asked
    by another kind. (Anthropic's marks the conversation's end for its cache: it converts
    each call, and its bodies are the same too.)"""
    picture = ImagePart.of(png())
    call = ToolCall("call_1", "add", {"a": 1}, '{"a": 1}')
    grown = [
        (Message.user("add 1, and look", (picture,)),),
        (
            Message("assistant", (call,)),
            Message("tool", (ToolResult("call_1", "add", "1", images=(picture,)),)),
        ),
        (Message("assistant", (ReasoningPart("hm"), TextPart("2"))), Message.user("and?")),
    ]
    conversations = [sum(grown[: i + 1], ()) for i in range(len(grown))]
    rewritten = (Message.user("a summary of it all"), *conversations[-1][1:])
    memo, model = WireMemo(), client(wire, protocol, False)
    made: list[object] = []
    for messages in [*conversations, rewritten]:
        wire.add(text="ok").add(text="ok")
        await model.respond(ModelRequest(messages, (ADD,), "be brief", memo=memo))
        await model.respond(ModelRequest(messages, (ADD,), "be brief"))  # no memo
        made.append(list(memo.said))
    await model.aclose()
    with_memo, without = wire.requests[0::2], wire.requests[1::2]
    assert with_memo == without and len(with_memo) == 4
    if protocol == "anthropic":
        assert made == [[], [], [], []]
        return
    items = {"chat": [1, 4, 6, 6], "responses": [1, 3, 5, 5]}[protocol]  # the tool's image
    assert [len(m) for m in made] == items  # is a user message of its own on Chat
    first, second, third, fourth = made
    assert all(a is b for a, b in zip(first, second, strict=False))  # converted once
    assert all(a is b for a, b in zip(second, third, strict=False))
    assert not any(a is b for a, b in zip(third, fourth, strict=True))  # rewritten: made again

    other = memo.of(rewritten, "another kind", lambda m: [m.role])
    assert other == ["user", "assistant", "tool", "assistant", "user"]
