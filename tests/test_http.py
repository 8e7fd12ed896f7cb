"""The HTTP layer under every model client (`providers/http.py`), met as a client meets it:
real requests to a local server that answers as each test writes it. Which failures are
retried and which are not, what an error says, and where a reply's bounds lie, to the byte."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import types
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from helpers import Hostile, stream, until
from tether import HTTPSettings, OpenAIChatModel
from tether.errors import ProviderError, ProviderProtocolError, ProviderTimeout
from tether.messages import Message, ModelRequest
from tether.providers import http
from tether.providers.http import (
    MAX_LINE,
    MAX_REPLY,
    HTTPClient,
    Progress,
    json_reply,
    reply_error,
    stream_allowance,
)
from tether.providers.sse import SSEBatches, SSEParser, loads_event

QUICK = HTTPSettings(max_retries=1, backoff_base=0.001, read_timeout=5)


async def body(resp: aiohttp.ClientResponse, progress: Progress) -> Any:
    """A reply's JSON, as a client that does not stream reads it."""
    return await json_reply(resp)


async def events(resp: aiohttp.ClientResponse, progress: Progress) -> list[Any]:
    """A stream's events, every one of them."""
    return [e async for batch in SSEBatches(resp, progress) for e in batch]


def counted(hostile: Hostile, answer: Any) -> list[int]:
    """Answer every request with `answer`; the list grows by one a request."""
    seen: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(len(seen) + 1)
        return await answer(request)

    hostile.handler = handler
    return seen


async def post(hostile: Hostile, parse: Any = body, **settings: Any) -> Any:
    client = HTTPClient(hostile.url, {}, dataclasses.replace(QUICK, **settings))
    try:
        return await client.post("/chat/completions", b"{}", parse)
    finally:
        await client.aclose()


async def failure(hostile: Hostile, parse: Any = body, **settings: Any) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await post(hostile, parse, **settings)
    return caught.value


# -- what an error says ---------------------------------------------------------------------


def error_reply(status: int, body: bytes, content_type: str = "application/json") -> Any:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, content_type=content_type)

    return answer


@pytest.mark.parametrize(
    ("body", "said", "kind"),
    [
        (b'{"error": {"message": "bad key", "type": "auth", "code": "invalid_api_key"}}',
         "bad key", "invalid_api_key"),
        (b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
         "Overloaded", "overloaded_error"),
        (b'{"error": "plain words"}', "plain words", None),
        (b'{"message": "said at the top"}', "said at the top", None),
    ],
)  # fmt: skip
async def test_an_error_says_what_the_server_said(
    hostile: Hostile, body: bytes, said: str, kind: str | None
) -> None:
    counted(hostile, error_reply(400, body))
    e = await failure(hostile)
    assert (e.message, e.status, e.error_type) == (f"HTTP 400: {said}", 400, kind)


async def test_an_error_without_words_says_its_status_and_text_is_cut_to_300(
    hostile: Hostile,
) -> None:
    counted(hostile, error_reply(503, b"", "text/plain"))
    assert (await failure(hostile, max_retries=0)).message == "HTTP 503: Service Unavailable"
    counted(hostile, error_reply(500, b"  upstream " + b"x" * 1000, "text/plain"))
    said = (await failure(hostile, max_retries=0)).message
    assert said == "HTTP 500: " + ("  upstream " + "x" * 1000)[:300].strip()


@pytest.mark.parametrize(("size", "read_whole"), [(63 << 10, True), ((64 << 10) + 600, False)])
async def test_an_error_body_is_read_to_64_kb(
    hostile: Hostile, size: int, read_whole: bool
) -> None:
    """An error's JSON is read only as far as 64 KB: one longer is taken as text."""
    head = b'{"error": {"message": "too big", "pad": "'
    body = head + b"x" * (size - len(head) - 3) + b'"}}'
    counted(hostile, error_reply(400, body))
    said = (await failure(hostile)).message
    assert said == "HTTP 400: too big" if read_whole else said.startswith('HTTP 400: {"error"')


async def test_a_page_that_is_not_the_reply_is_named_by_its_type_and_first_200_characters(
    hostile: Hostile,
) -> None:
    page = "".join(chr(ord("a") + i % 26) for i in range(1000))
    seen = counted(hostile, error_reply(200, page.encode(), "text/html"))
    e = await failure(hostile)
    assert isinstance(e, ProviderProtocolError) and "text/html" in e.message
    assert repr(page[:200]) in e.message and repr(page[:201]) not in e.message
    assert len(seen) == 2  # a proxy's page may be gone on the next try: retried


def test_an_unreadable_event_is_quoted_to_80_characters() -> None:
    data = b"{" + "".join(chr(ord("a") + i % 26) for i in range(200)).encode()
    with pytest.raises(ProviderProtocolError) as caught:
        loads_event(data)
    assert repr(data[:80].decode()) in caught.value.message
    assert repr(data[:81].decode()) not in caught.value.message


def test_an_error_in_place_of_a_reply_is_that_error_and_a_reply_is_a_reply() -> None:
    refused = reply_error({"error": {"message": "quota", "code": "insufficient_quota"}})
    assert refused is not None and "quota" in refused.message
    # a reply that carries an error of its own is read as a reply
    assert reply_error({"error": {"message": "x"}, "choices": []}) is None
    assert reply_error({"id": "r1", "output": []}) is None
    assert reply_error({"id": "r1"}) is None


# -- what is retried --------------------------------------------------------------------------


async def test_a_failing_server_is_asked_three_times_by_default(hostile: Hostile) -> None:
    seen = counted(hostile, error_reply(503, b"{}"))
    client = HTTPClient(hostile.url, {}, HTTPSettings(backoff_base=0.001))
    with pytest.raises(ProviderError):
        await client.post("/x", b"{}", body)
    await client.aclose()
    assert len(seen) == 3


async def test_no_answer_in_time_is_retried(hostile: Hostile) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        return web.json_response({})

    seen = counted(hostile, slow)
    e = await failure(hostile, read_timeout=0.2)
    assert isinstance(e, ProviderTimeout) and "no reply" in e.message and len(seen) == 2


async def test_a_stall_after_part_of_the_reply_was_shown_is_not_retried(hostile: Hostile) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        await resp.write(b"data: {}\n\n")
        await asyncio.sleep(2)
        return resp

    async def shown(resp: aiohttp.ClientResponse, progress: Progress) -> None:
        async for _ in SSEBatches(resp, progress):
            progress.emitted = True  # as a client does once it handed text on

    seen = counted(hostile, stall)
    e = await failure(hostile, shown, read_timeout=0.3)
    assert isinstance(e, ProviderTimeout) and not e.retryable and len(seen) == 1
    assert "stalled after part of it was shown" in e.message


async def test_a_reply_that_keeps_coming_is_not_cut_however_long_it_takes(
    hostile: Hostile,
) -> None:
    """The read timeout is the longest silence, not the longest reply: a stream whose events
    come more often than it, for three times as long, is read to its end, once; and an
    attempt's limit ends with it (the next await of the caller is no timeout's)."""

    async def slow_but_steady(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        for i in range(9):
            await resp.write(b'data: {"n": %d}\n\n' % i)
            await asyncio.sleep(0.1)
        return resp

    seen = counted(hostile, slow_but_steady)
    got = await post(hostile, events, read_timeout=0.3)
    assert [data for _, data in got] == [b'{"n": %d}' % i for i in range(9)] and len(seen) == 1
    await asyncio.sleep(0.4)  # past the last limit's deadline: nothing is cancelled


async def test_a_cancel_during_an_attempt_is_a_cancel_not_a_timeout(hostile: Hostile) -> None:
    """A caller's cancel while the reply is awaited reaches the caller as a cancel, even
    with the read limit in force: it is not retried or said as a timeout."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    seen = counted(hostile, slow)
    attempt = asyncio.ensure_future(post(hostile, read_timeout=1))
    await until(lambda: len(seen) == 1, "the request to reach the server")
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert len(seen) == 1


async def test_stray_bytes_without_an_event_time_out_and_are_retried(hostile: Hostile) -> None:
    async def drip(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        await resp.write(b"data: {")
        try:
            for _ in range(40):  # never silent long enough for a socket timeout
                await resp.write(b"a")
                await asyncio.sleep(0.05)
        except ConnectionError:
            pass
        return resp

    seen = counted(hostile, drip)
    e = await failure(hostile, events, read_timeout=0.3)
    assert isinstance(e, ProviderTimeout) and "no event" in e.message and len(seen) == 2


async def test_a_server_that_does_not_speak_http_is_retried() -> None:
    accepted: list[int] = []

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await reader.read(1024)
        writer.write(b"HELLO THERE\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HTTPClient(f"http://127.0.0.1:{port}", {}, QUICK)
    with pytest.raises(ProviderError) as caught:
        await client.post("/x", b"{}", body)
    await client.aclose()
    server.close()
    assert caught.value.retryable and len(accepted) == 2
    assert f"127.0.0.1:{port}" in caught.value.message


async def test_a_retry_after_of_the_longest_wait_is_waited_and_a_longer_one_is_not(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's Retry-After up to a minute is obeyed (the wait is recorded here, not
    slept); past it the call fails at once and says when the server takes requests again."""
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    fake = types.SimpleNamespace(sleep=sleep, CancelledError=asyncio.CancelledError)
    monkeypatch.setattr(http, "asyncio", fake)
    wait = {"s": "60"}

    async def busy_once(request: web.Request) -> web.Response:
        if len(seen) == 1:
            return web.json_response({}, status=429, headers={"Retry-After": wait["s"]})
        return web.json_response({"ok": True})

    seen = counted(hostile, busy_once)
    assert await post(hostile) == {"ok": True} and slept == [60.0]
    seen.clear()
    wait["s"] = "3600"
    before = time.time()
    e = await failure(hostile)
    after = time.time()
    assert len(seen) == 1 and slept == [60.0] and not e.retryable
    times = {time.strftime("%H:%M:%S", time.gmtime(t + 3600)) for t in (before, after)}
    assert any(f"at {t} UTC" in e.message for t in times), e.message


# -- the bounds of a reply ----------------------------------------------------------------------


def json_of_size(n: int) -> bytes:
    return b'"' + b"a" * (n - 2) + b'"'


@pytest.mark.parametrize(("size", "taken"), [(MAX_REPLY, True), (MAX_REPLY + 1, False)])
async def test_a_reply_is_read_to_64_mb_and_not_a_byte_more(
    hostile: Hostile, size: int, taken: bool
) -> None:
    body = json_of_size(size)
    seen = counted(hostile, error_reply(200, body))
    if taken:
        assert len(await post(hostile)) == size - 2
    else:
        e = await failure(hostile)
        assert "over 64 MB" in e.message and not e.retryable and len(seen) == 1


def test_a_stream_may_bring_a_megabyte_and_400_bytes_a_token_up_to_64_mb() -> None:
    assert stream_allowance(None) == MAX_REPLY == 64 << 20
    assert stream_allowance(1000) == (1 << 20) + 400_000
    assert stream_allowance(10**9) == MAX_REPLY


@pytest.mark.parametrize("extra", [0, 1])
async def test_a_stream_is_cut_at_its_allowance_to_the_byte(hostile: Hostile, extra: int) -> None:
    allowance = stream_allowance(0)
    event = b"data: " + b"a" * (allowance + extra - 8) + b"\n\n"

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        with contextlib.suppress(ConnectionError):
            await resp.write(event)
        return resp

    seen = counted(hostile, answer)
    client = HTTPClient(hostile.url, {}, QUICK)
    try:
        if not extra:
            got = await client.post("/x", b"{}", events, max_output_tokens=0)
            assert len(got) == 1 and len(got[0][1]) == allowance - 8
        else:
            with pytest.raises(ProviderProtocolError) as caught:
                await client.post("/x", b"{}", events, max_output_tokens=0)
            assert "output limit" in caught.value.message and not caught.value.retryable
            assert len(seen) == 1
    finally:
        await client.aclose()


def test_a_line_may_be_16_mb_and_not_a_byte_more() -> None:
    parser = SSEParser()
    assert parser.feed(b"a" * MAX_LINE) == []
    with pytest.raises(ProviderProtocolError) as caught:
        parser.feed(b"a")
    assert "over 16 MB" in caught.value.message and not caught.value.retryable


def test_fields_without_a_space_after_the_colon_are_read() -> None:
    parser = SSEParser()
    got = parser.feed(b"event:ping\ndata:{}\n\nevent: done\ndata: [DONE]\n\n")
    assert got == [("ping", b"{}"), ("done", b"[DONE]")]


# -- the client ------------------------------------------------------------------------------


async def test_calls_of_one_client_run_side_by_side(hostile: Hostile) -> None:
    """No connection limit by default: two calls are at the server at once (the runtime's
    admission control bounds calls, not the HTTP pool)."""
    both = asyncio.Event()
    arrived: list[int] = []

    async def meet(request: web.Request) -> web.Response:
        arrived.append(1)
        if len(arrived) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)
        return web.json_response({"ok": True})

    hostile.handler = meet
    client = HTTPClient(hostile.url, {}, HTTPSettings(max_retries=0))
    try:
        got = await asyncio.gather(*(client.post("/x", b"{}", body) for _ in range(2)))
    finally:
        await client.aclose()
    assert got == [{"ok": True}] * 2


async def test_a_client_closes_its_connections_and_may_be_closed_unused(hostile: Hostile) -> None:
    await HTTPClient(hostile.url, {}, QUICK).aclose()
    counted(hostile, error_reply(200, b"{}"))
    client = HTTPClient(hostile.url, {}, QUICK)
    await client.post("/x", b"{}", body)
    session = client.session()
    await client.aclose()
    assert session.closed


def test_settings_cannot_change_under_a_client() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        QUICK.max_retries = 5  # type: ignore[misc]


async def test_an_openai_style_client_streams_unless_told_not_to(hostile: Hostile) -> None:
    bodies: list[dict[str, Any]] = []

    async def note(request: web.Request) -> web.Response:
        bodies.append(orjson.loads(await request.read()))
        return web.Response(
            status=400, body=b'{"error": "enough"}', content_type="application/json"
        )

    hostile.handler = note
    request = ModelRequest((Message.user("hi"),))
    url = hostile.url
    for model in (OpenAIChatModel("m", api_key="k", base_url=url),
                  OpenAIChatModel("m", api_key="k", base_url=url, stream=False)):  # fmt: skip
        with pytest.raises(ProviderError):
            await model.respond(request)
        await model.aclose()
    assert [b.get("stream", False) for b in bodies] == [True, False]


def chat_delta(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def test_streamed_text_is_handed_on_a_network_read_at_a_time(hostile: Hostile) -> None:
    """Deltas that arrive together are one piece (one `text_delta` event, not one a delta);
    deltas that arrive apart are apart, each as soon as its read is parsed."""
    second_sent = asyncio.Event()

    async def two_reads(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        await resp.write(chat_delta("one ") + chat_delta("two ") + chat_delta("three "))
        await asyncio.sleep(0.2)  # the client has read and handed on the first three
        second_sent.set()
        await resp.write(chat_delta("four") + b'data: {"choices": [{"index": 0, "delta": {}, '
                         b'"finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')  # fmt: skip
        return resp

    hostile.handler = two_reads
    pieces: list[str] = []
    handed_early: list[bool] = []

    def on_text(text: str) -> None:
        pieces.append(text)
        handed_early.append(not second_sent.is_set())

    model = OpenAIChatModel("m", api_key="k", base_url=hostile.url)
    try:
        reply = await model.respond(ModelRequest((Message.user("hi"),)), on_text)
    finally:
        await model.aclose()
    assert reply.message.text == "one two three four"
    assert pieces == ["one two three ", "four"]
    assert handed_early == [True, False]  # the first piece did not wait for the second read


async def test_text_said_in_the_read_that_brings_an_error_is_not_shown_and_the_call_is_retried(
    hostile: Hostile,
) -> None:
    sent: list[int] = []

    async def text_then_error(request: web.Request) -> web.StreamResponse:
        sent.append(1)
        resp = await stream(request)
        if len(sent) == 1:
            error = b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n'
            await resp.write(chat_delta("half an ans") + error)
        else:
            await resp.write(chat_delta("whole answer") + b"data: [DONE]\n\n")
        return resp

    hostile.handler = text_then_error
    pieces: list[str] = []
    model = OpenAIChatModel(
        "m", api_key="k", base_url=hostile.url, settings=dataclasses.replace(QUICK)
    )
    try:
        reply = await model.respond(ModelRequest((Message.user("hi"),)), pieces.append)
    finally:
        await model.aclose()
    assert reply.message.text == "whole answer" and pieces == ["whole answer"]
    assert len(sent) == 2
