"""Model servers that misbehave on purpose (a broken proxy, a hostile or careless server), seen
from `tether run`: every reply is bounded in size and time, and every error says what came."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from aiohttp import web

import warm
from helpers import TETHER, Hostile, cli_env, stream


def run(h: Hostile, *extra: str, provider: str = "openai-chat") -> dict[str, Any]:
    """`tether run` against the server; its last event (run_finished)."""
    p = warm.run(
        [*TETHER, "run", "x", "--provider", provider, "--base-url", h.url, "--json",
         "--tools", "none", "--store", "memory", "--max-retries", "0", *extra],
        capture_output=True, text=True, timeout=120,
        env=cli_env(OPENAI_API_KEY="k", ANTHROPIC_API_KEY="k"),
    )  # fmt: skip
    assert "Traceback" not in p.stderr, p.stderr
    finished: dict[str, Any] = json.loads(p.stdout.splitlines()[-1])
    assert finished["type"] == "run_finished"
    return finished


def chunk(text: str) -> bytes:
    body = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def finish(resp: web.StreamResponse) -> web.StreamResponse:
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    await resp.write(b"data: " + orjson.dumps(done) + b"\n\ndata: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.mark.parametrize("provider", ["openai-chat", "openai-responses", "anthropic"])
@pytest.mark.parametrize("streamed", [True, False])
def test_an_html_page_is_an_error_that_says_what_came(
    hostile: Hostile, provider: str, streamed: bool
) -> None:
    async def portal(request: web.Request) -> web.Response:
        page = "<!doctype html><title>Captive portal</title><p>Please log in"
        return web.Response(text=page, content_type="text/html")

    hostile.handler = portal
    finished = run(hostile, *([] if streamed else ["--no-stream"]), provider=provider)
    assert finished["outcome"] == "failed"
    message = finished["error"]["message"]
    assert "text/html" in message and "<!doctype html><title>Captive portal" in message, message


def test_one_long_event_split_over_many_reads_arrives_whole(hostile: Hostile) -> None:
    """15 MB of text in one event, written 4 KB at a time (the parser joins a line's pieces
    once, when it ends: joining them at every read made a 128 MB line take 51 s)."""
    line = chunk("a" * (15 << 20))

    async def long_line(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        for i in range(0, len(line), 4096):
            await resp.write(line[i : i + 4096])
        return await finish(resp)

    hostile.handler = long_line
    finished = run(hostile)
    assert finished["outcome"] == "done" and len(finished["answer"]) == 15 << 20


def test_a_line_beyond_the_cap_ends_the_call(hostile: Hostile) -> None:
    async def endless_line(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        await resp.write(b'data: {"choices": [{"delta": {"content": "')
        try:
            for _ in range(40 << 4):  # 40 MB, if the client kept reading
                await resp.write(b"a" * 65536)
        except ConnectionError:
            hostile.notes.append("the client stopped reading")
        return resp

    hostile.handler = endless_line
    finished = run(hostile)
    assert finished["outcome"] == "failed"
    assert "a line of the reply stream is over 16 MB" in finished["error"]["message"]


def test_a_reply_beyond_the_cap_is_not_taken_as_the_answer(hostile: Hostile) -> None:
    body = orjson.dumps(
        {
            "choices": [
                {"index": 0, "message": {"content": "a" * (80 << 20)}, "finish_reason": "stop"}
            ]
        }
    )

    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    hostile.handler = huge
    finished = run(hostile, "--no-stream")
    assert finished["outcome"] == "failed" and finished["answer"] == ""
    assert "the reply is over 64 MB" in finished["error"]["message"]


def test_an_error_body_is_read_only_as_far_as_its_start(hostile: Hostile) -> None:
    async def huge_error(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=500, headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        try:
            await resp.write(b"upstream exploded: ")
            for _ in range(256 << 4):  # 256 MB, if the client read it all
                await resp.write(b"x" * 65536)
            hostile.notes.append("the client read the whole body")
        except ConnectionError:
            hostile.notes.append("the client stopped reading")
        return resp

    hostile.handler = huge_error
    finished = run(hostile)
    assert finished["outcome"] == "failed"
    assert finished["error"]["message"].startswith("HTTP 500: upstream exploded: xxx")
    assert "the client read the whole body" not in hostile.notes


def test_a_server_dripping_bytes_is_cut_off_after_the_read_timeout(hostile: Hostile) -> None:
    stop = asyncio.Event()

    async def drip(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        await resp.write(b'data: {"choices": [{"delta": {"content": "')
        try:
            while not stop.is_set():  # a byte every 0.2 s: the socket is never silent
                await resp.write(b"a")
                await asyncio.sleep(0.2)
        except ConnectionError:
            hostile.notes.append("the client stopped reading")
        return resp

    hostile.handler = drip
    finished = run(hostile, "--read-timeout", "1")
    hostile.loop.call_soon_threadsafe(stop.set)
    assert finished["outcome"] == "failed" and finished["error"]["kind"] == "timeout"
    assert "no event for 1 s" in finished["error"]["message"]


def test_an_endless_stream_is_stopped_at_the_output_budget(hostile: Hostile) -> None:
    sent = {"bytes": 0}

    async def endless(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        hostile.notes.append(f"max_tokens={body.get('max_tokens')}")
        resp = await stream(request)
        try:
            while sent["bytes"] < 500 << 20:
                data = chunk("word ")
                await resp.write(data)
                sent["bytes"] += len(data)
        except ConnectionError:
            hostile.notes.append("the client stopped reading")
        return resp

    hostile.handler = endless
    finished = run(hostile, "--max-output-tokens", "100")
    assert finished["outcome"] == "failed"
    assert "more than the call's output limit allows" in finished["error"]["message"]
    assert "max_tokens=100" in hostile.notes  # the server was told the budget, too
    assert sent["bytes"] < 100 << 20


def test_invalid_utf8_in_a_delta_becomes_a_replacement_character(hostile: Hostile) -> None:
    async def bad_bytes(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        await resp.write(b'data: {"choices": [{"index": 0, "delta": {"content": "caf\xc3"}}]}\n\n')
        await resp.write(chunk(" ok"))
        return await finish(resp)

    hostile.handler = bad_bytes
    finished = run(hostile)
    assert finished["outcome"] == "done" and finished["answer"] == "caf\ufffd ok"


def test_a_stall_after_part_of_the_reply_was_shown_says_so(hostile: Hostile) -> None:
    stop = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        resp = await stream(request)
        await resp.write(chunk("The answer is"))
        await stop.wait()
        return resp

    hostile.handler = stall
    finished = run(hostile, "--read-timeout", "1")
    hostile.loop.call_soon_threadsafe(stop.set)
    assert finished["outcome"] == "failed" and finished["answer"] == ""
    assert "stalled after part of it was shown" in finished["error"]["message"]


@pytest.mark.parametrize("provider", ["openai-chat", "openai-responses", "anthropic"])
def test_a_redirect_elsewhere_gets_no_key(provider: str) -> None:
    """A model server that answers 307 to another address: followed, the call went there with
    its key (Anthropic's `x-api-key` too); now it is not followed, and the run fails saying
    where it was sent and what to do."""
    source, elsewhere = Hostile(), Hostile()
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(status=400)

    async def away(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": f"{elsewhere.url}/messages"})

    source.handler, elsewhere.handler = away, record
    try:
        finished = run(source, provider=provider)
    finally:
        source.stop()
        elsewhere.stop()
    assert seen == []  # nothing reached the other address, key or not
    assert finished["outcome"] == "failed"
    message = finished["error"]["message"]
    assert (
        "HTTP 307" in message and "redirected the call to" in message and "not followed" in message
    )
