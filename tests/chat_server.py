"""A wire-level mock of OpenAI Chat Completions, on 127.0.0.1, for testing the real client.

It plays a queue of replies, in the exact JSON and SSE shapes of the API reference, and records
every request. Faults are injected per reply:

    server.add(text="hi")                                    # a text answer
    server.add(calls=[("add", {"a": 1})], text="")           # tool calls (argument fragments)
    server.add(status=429, headers={"Retry-After": "0"})     # an error reply
    server.add(fault="reset" | "stall" | "no_done" | "garbage")

When the queue is empty a `rule` (a function of the request body) may answer instead.
The server runs in its own thread with its own event loop, so sync tests and CLI subprocesses
can use it as well as async tests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

Reply = dict[str, Any]


def split(text: str, n: int) -> list[str]:
    size = max(1, len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class ChatServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.rule: Callable[[dict[str, Any]], Reply] | None = None
        self.port = 0
        self.closed_streams = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, **reply: Any) -> ChatServer:
        self.replies.append(reply)
        return self

    # -- server lifecycle -------------------------------------------------------------------
    def start(self) -> ChatServer:
        ready = threading.Event()

        def serve() -> None:
            asyncio.run(self._serve(ready))

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("mock chat server did not start")
        return self

    async def _serve(self, ready: threading.Event) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(5)

    # -- replies ----------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.replies:
            reply = self.replies.popleft()
        elif self.rule is not None:
            reply = self.rule(body)
        else:
            reply = {"text": "(the mock has no more replies)"}
        if reply.get("delay"):
            await asyncio.sleep(reply["delay"])
        if "status" in reply:
            payload = reply.get("body") or {
                "error": {
                    "message": reply.get("message", "mock error"),
                    "type": reply.get("type", "server_error"),
                    "param": None,
                    "code": reply.get("code"),
                }
            }
            return web.Response(
                status=reply["status"],
                body=orjson.dumps(payload),
                content_type="application/json",
                headers=reply.get("headers"),
            )
        if reply.get("fault") == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if body.get("stream"):
            return await self.stream(request, body, reply)
        return web.Response(
            body=orjson.dumps(self.completion(body, reply)), content_type="application/json"
        )

    def usage(self, reply: Reply) -> dict[str, Any]:
        u = reply.get("usage") or {}
        prompt, completion = u.get("prompt", 50), u.get("completion", 10)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": u.get("cached", 0), "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": u.get("reasoning", 0),
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def calls(self, reply: Reply) -> list[tuple[str, str, str]]:
        out = []
        for i, c in enumerate(reply.get("calls") or ()):
            name, args = c[0], c[1]
            raw = args if isinstance(args, str) else orjson.dumps(args).decode()
            out.append((f"call_{len(self.requests)}_{i}", name, raw))
        return out

    def finish_reason(self, reply: Reply) -> str:
        return reply.get("finish_reason") or ("tool_calls" if reply.get("calls") else "stop")

    def completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        calls = self.calls(reply)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.get("text") or None,
            "refusal": None,
            "annotations": [],
        }
        if reply.get("reasoning"):
            message["reasoning_content"] = reply["reasoning"]
        if calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                for cid, n, a in calls
            ]
        choices = [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": self.finish_reason(reply),
            }
        ]
        for extra in range(1, reply.get("choices", 1)):
            choices.append(
                {
                    "index": extra,
                    "logprobs": None,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"other choice {extra}"},
                }
            )
        return {
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "mock"),
            "choices": choices,
            "usage": self.usage(reply),
            "service_tier": "default",
            "system_fingerprint": "fp_mock",
        }

    async def stream(
        self, request: web.Request, body: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", "mock"),
            "system_fingerprint": "fp_mock",
        }
        style = reply.get("style", "openai")

        def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> bytes:
            c = {
                **base,
                "choices": [
                    {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            return b"data: " + orjson.dumps(c) + b"\n\n"

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        for piece in split(reply.get("reasoning", ""), 2) if reply.get("reasoning") else ():
            events.append(chunk({"reasoning_content": piece}))
        for piece in (
            split(reply.get("text", ""), reply.get("deltas", 3)) if reply.get("text") else ()
        ):
            events.append(chunk({"content": piece}))
            if reply.get("choices", 1) > 1:
                events.append(chunk({"content": "OTHER"}, index=1))
        for i, (cid, name, raw) in enumerate(self.calls(reply)):
            head: dict[str, Any] = {
                "index": i,
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            if style == "null_args":
                head["function"]["arguments"] = None
            if style == "id_then_args":
                head = {"index": i, "id": cid, "type": "function", "function": {"name": name}}
            if style == "no_index":
                head.pop("index")
            events.append(chunk({"tool_calls": [head]}))
            for frag in split(raw, 3) if raw else ():
                tc: dict[str, Any] = {"index": i, "function": {"arguments": frag}}
                if style == "repeat_id_name":
                    tc = {
                        "index": i,
                        "id": cid,
                        "type": "function",
                        "function": {"name": name, "arguments": frag},
                    }
                if style == "no_index":
                    tc.pop("index")
                events.append(chunk({"tool_calls": [tc]}))
        events.append(chunk({}, self.finish_reason(reply)))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(
                b"data: "
                + orjson.dumps({**base, "choices": [], "usage": self.usage(reply)})
                + b"\n\n"
            )
        events.append(b"data: [DONE]\n\n")

        fault = reply.get("fault")
        if fault == "no_done":
            events = events[:-3] if len(events) > 3 else events[:1]
        if fault == "garbage":
            events.insert(1, b"data: {this is not json\n\n")
        cut = reply.get("cut_after")  # send this many events, then drop the connection
        try:
            for n, ev in enumerate(events):
                if cut is not None and n == cut:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if fault == "stall" and n == 1:
                    await asyncio.sleep(reply.get("stall", 30))
                await resp.write(ev)
                if reply.get("chunk_delay"):
                    await asyncio.sleep(reply["chunk_delay"])
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.closed_streams += 1
            raise
        return resp
