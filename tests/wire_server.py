"""A wire-level mock of the three model APIs, on 127.0.0.1, for testing the real clients.

    POST /v1/chat/completions   OpenAI Chat Completions
    POST /v1/responses          OpenAI Responses
    POST /v1/messages           Anthropic Messages

It plays a queue of replies, in the exact JSON and SSE shapes of each API reference, and records
every request. A reply is protocol-neutral; the route decides how it is written:

    server.add(text="hi")                                    # a text answer
    server.add(text="", calls=[("add", {"a": 1})])           # tool calls (argument fragments)
    server.add(calls=[("add", {"a": 1}, "c0")])              # ... with the id the server gives
    server.add(status=429, headers={"Retry-After": "0"})     # an error reply
    server.add(fault="reset" | "stall" | "no_done" | "garbage" | "stream_error")
    server.add(text="late", gate=threading.Event())          # answered once the test sets it

When the queue is empty a `rule` (a function of the request body) may answer instead. The server
runs in its own thread with its own event loop, so sync tests and CLI subprocesses can use it as
well as async tests.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

Reply = dict[str, Any]
Body = dict[str, Any]


def split(text: str, n: int) -> list[str]:
    size = max(1, len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def data_line(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def named_event(name: str, obj: Any) -> bytes:
    return f"event: {name}\n".encode() + data_line(obj)


def tool_results(body: Body) -> int:
    """How many tool results a request carries, in any of the three protocols."""
    if "input" in body:
        return sum(1 for i in body["input"] if i.get("type") == "function_call_output")
    n = 0
    for m in body.get("messages", ()):
        if m.get("role") == "tool":
            n += 1
        elif isinstance(m.get("content"), list):
            n += sum(1 for b in m["content"] if b.get("type") == "tool_result")
    return n


class WireServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Body] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.arrived: list[float] = []
        """When each request came (`time.time()`), in the order of `requests`."""
        self.rule: Callable[[Body], Reply] | None = None
        self.port = 0
        self.closed_streams = 0
        self.closed_at: list[float] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._server: web.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, **reply: Any) -> WireServer:
        self.replies.append(reply)
        return self

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> WireServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve(ready)), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("mock server did not start")
        return self

    async def _serve(self, ready: threading.Event) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_post("/v1/responses", self.handle)
        app.router.add_post("/v1/messages", self.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
        await runner.setup()
        self._server = runner.server
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def idle(self) -> bool:
        """Whether no client is connected. Once a killed client's connections are closed,
        every request it sent is in `requests`: one sent just before the kill may still be on
        its way when the kill returns."""
        return self._server is not None and not self._server.connections

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(5)

    # -- replies -----------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.arrived.append(time.time())
        self.requests.append(body)
        self.paths.append(request.path)
        self.headers.append(dict(request.headers))
        if self.replies:
            reply = self.replies.popleft()
        elif self.rule is not None:
            reply = self.rule(body)
        else:
            reply = {"text": "(the mock has no more replies)"}
        if "raw" in reply:  # a recorded response, replayed byte for byte
            return web.Response(
                status=reply.get("status", 200),
                body=reply["raw"],
                headers={
                    "Content-Type": reply.get("content_type", "application/json"),
                    **reply.get("headers", {}),
                },
            )
        writer = WRITERS[request.path.rsplit("/", 1)[-1]](body, reply, len(self.requests))
        if reply.get("delay"):
            await asyncio.sleep(reply["delay"])
        if "gate" in reply:  # held until the test lets it go (never for more than a minute)
            await asyncio.to_thread(reply["gate"].wait, 60)
        if "status" in reply:
            return web.Response(
                status=reply["status"],
                body=orjson.dumps(reply.get("body") or writer.error_body()),
                content_type="application/json",
                headers=reply.get("headers"),
            )
        if reply.get("fault") == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(writer.whole()), content_type="application/json")
        events, terminal = writer.events()
        fault = reply.get("fault")
        if fault == "no_done":
            events = events[:-terminal]
        elif fault == "garbage":
            events.insert(1, b"data: {this is not json\n\n")
        elif fault == "stream_error":
            events = [*events[:2], writer.stream_error()]
        return await self.send(request, events, reply)

    async def send(
        self, request: web.Request, events: list[bytes], reply: Reply
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cut = reply.get("cut_after")  # send this many events, then drop the connection
        try:
            for n, ev in enumerate(events):
                if cut is not None and n == cut:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if reply.get("fault") == "stall" and n == 1:
                    await asyncio.sleep(reply.get("stall", 30))
                await resp.write(ev)
                if reply.get("chunk_delay"):
                    await asyncio.sleep(reply["chunk_delay"])
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):  # cancelled at disconnect
            self.closed_at.append(time.monotonic())
            self.closed_streams += 1
            raise
        return resp


class Writer:
    """Writes one protocol-neutral reply in one API's shapes."""

    def __init__(self, body: Body, reply: Reply, n: int) -> None:
        self.body, self.reply, self.n = body, reply, n
        self.model = body.get("model", "mock")
        self.text: str = reply.get("text") or ""
        self.calls = []
        for i, c in enumerate(reply.get("calls") or ()):
            raw = c[1] if isinstance(c[1], str) else orjson.dumps(c[1]).decode()
            cid = c[2] if len(c) > 2 else f"call_{n}_{i}"  # (name, arguments[, id])
            self.calls.append((cid, c[0], raw))
        u = reply.get("usage") or {}
        self.prompt, self.completion = u.get("prompt", 50), u.get("completion", 10)
        self.cached, self.reasoning = u.get("cached", 0), u.get("reasoning", 0)
        self.cache_write = u.get("cache_write", 0)
        self.no_usage = bool(reply.get("no_usage"))
        """Streams carry no usage, as llama.cpp's server and some gateways send them."""

    def error_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.reply.get("message", "mock error"),
                "type": self.reply.get("type", "server_error"),
                "param": None,
                "code": self.reply.get("code"),
            }
        }

    def whole(self) -> dict[str, Any]:
        raise NotImplementedError

    def events(self) -> tuple[list[bytes], int]:
        """The stream, and how many events at its end make it complete."""
        raise NotImplementedError

    def stream_error(self) -> bytes:
        raise NotImplementedError


class ChatWriter(Writer):
    def finish_reason(self) -> str:
        return self.reply.get("finish_reason") or ("tool_calls" if self.calls else "stop")

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def whole(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.text or None,
            "refusal": None,
            "annotations": [],
        }
        if self.reply.get("reasoning"):
            message["reasoning_content"] = self.reply["reasoning"]
        if self.calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                for cid, n, a in self.calls
            ]
        choices = [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": self.finish_reason(),
            }
        ]
        for extra in range(1, self.reply.get("choices", 1)):
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
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_mock",
        }

    def events(self) -> tuple[list[bytes], int]:
        base = {
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": "fp_mock",
        }
        style = self.reply.get("style", "openai")

        def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> bytes:
            return data_line(
                {
                    **base,
                    "choices": [
                        {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
                    ],
                }
            )

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        if self.reply.get("reasoning"):
            events += [chunk({"reasoning_content": p}) for p in split(self.reply["reasoning"], 2)]
        for piece in split(self.text, self.reply.get("deltas", 3)) if self.text else ():
            events.append(chunk({"content": piece}))
            if self.reply.get("choices", 1) > 1:
                events.append(chunk({"content": "OTHER"}, index=1))
        for i, (cid, name, raw) in enumerate(self.calls):
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
        events.append(chunk({}, self.finish_reason()))
        terminal = 2
        if (self.body.get("stream_options") or {}).get("include_usage") and not self.no_usage:
            events.append(data_line({**base, "choices": [], "usage": self.usage()}))
            terminal = 3
        events.append(b"data: [DONE]\n\n")
        return events, terminal

    def stream_error(self) -> bytes:
        error = self.reply.get("error") or {
            "message": "The server had an error",
            "type": "server_error",
        }
        return data_line({"error": error})


class ResponsesWriter(Writer):
    def items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if self.reply.get("reasoning"):
            items.append(
                {
                    "id": f"rs_{self.n}",
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": self.reply["reasoning"]}],
                    "encrypted_content": f"gAAAA-encrypted-{self.n}",
                }
            )
        if self.text:
            items.append(
                {
                    "id": f"msg_{self.n}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [
                        {
                            "type": "output_text",
                            "text": self.text,
                            "annotations": [],
                            "logprobs": [],
                        }
                    ],
                }
            )
        for cid, name, raw in self.calls:
            items.append(
                {
                    "id": f"fc_{cid}",
                    "type": "function_call",
                    "status": "completed",
                    "arguments": raw,
                    "call_id": cid,
                    "name": name,
                }
            )
        return items

    def response(self, status: str, output: list[dict[str, Any]], usage: bool) -> dict[str, Any]:
        incomplete = self.reply.get("finish_reason") == "length"
        return {
            "id": f"resp_{self.n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if incomplete and status == "completed" else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": self.body.get("instructions"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "store": False,
            "usage": {
                "input_tokens": self.prompt,
                "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens": self.completion,
                "output_tokens_details": {"reasoning_tokens": self.reasoning},
                "total_tokens": self.prompt + self.completion,
            }
            if usage
            else None,
        }

    def whole(self) -> dict[str, Any]:
        return self.response("completed", self.items(), True)

    def events(self) -> tuple[list[bytes], int]:
        seq = itertools.count()
        out: list[bytes] = []

        def ev(kind: str, **kw: Any) -> None:
            out.append(named_event(kind, {"type": kind, "sequence_number": next(seq), **kw}))

        ev("response.created", response=self.response("in_progress", [], False))
        ev("response.in_progress", response=self.response("in_progress", [], False))
        items = self.items()
        for oi, item in enumerate(items):
            if item["type"] == "function_call":
                ev(
                    "response.output_item.added",
                    output_index=oi,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
                for frag in split(item["arguments"], 3):
                    ev(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=oi,
                        delta=frag,
                    )
                ev(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=oi,
                    arguments=item["arguments"],
                )
            elif item["type"] == "message":
                ev(
                    "response.output_item.added",
                    output_index=oi,
                    item={**item, "status": "in_progress", "content": []},
                )
                ev(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=oi,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
                for piece in split(self.text, self.reply.get("deltas", 3)):
                    ev(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=oi,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                ev(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=oi,
                    content_index=0,
                    text=self.text,
                    logprobs=[],
                )
                ev(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=oi,
                    content_index=0,
                    part=item["content"][0],
                )
            else:
                ev("response.output_item.added", output_index=oi, item={**item, "summary": []})
            ev("response.output_item.done", output_index=oi, item=item)
        final = self.response("completed", items, not self.no_usage)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        ev(kind, response=final)
        return out, 1

    def stream_error(self) -> bytes:
        fields = self.reply.get("error") or {
            "code": "server_error",
            "message": "The server had an error",
        }
        return named_event(
            "error", {"type": "error", "param": None, **fields, "sequence_number": 2}
        )


class AnthropicWriter(Writer):
    def error_body(self) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {
                "type": self.reply.get("type", "api_error"),
                "message": self.reply.get("message", "mock error"),
            },
        }

    def content(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if self.reply.get("reasoning"):
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": self.reply["reasoning"],
                    "signature": f"sig-{self.n}",
                }
            )
        if self.text:
            blocks.append({"type": "text", "text": self.text})
        for cid, name, raw in self.calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": cid,
                    "name": name,
                    "input": orjson.loads(raw) if raw else {},
                }
            )
        return blocks

    def stop(self) -> str:
        if self.reply.get("finish_reason") == "length":
            return "max_tokens"
        if self.reply.get("finish_reason") == "pause_turn":
            return "pause_turn"
        return "tool_use" if self.calls else "end_turn"

    def usage(self) -> dict[str, Any]:
        if self.no_usage:  # a gateway's stream: zeros
            return {"input_tokens": 0, "output_tokens": 0}
        return {
            "input_tokens": self.prompt - self.cached - self.cache_write,
            "cache_creation_input_tokens": self.cache_write,
            "cache_read_input_tokens": self.cached,
            "output_tokens": self.completion,
            "service_tier": "standard",
        }

    def whole(self) -> dict[str, Any]:
        return {
            "id": f"msg_{self.n}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content(),
            "stop_reason": self.stop(),
            "stop_sequence": None,
            "usage": self.usage(),
        }

    def events(self) -> tuple[list[bytes], int]:
        out = [
            named_event(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        **self.whole(),
                        "content": [],
                        "stop_reason": None,
                        "usage": {**self.usage(), "output_tokens": 0 if self.no_usage else 1},
                    },
                },
            )
        ]
        for i, block in enumerate(self.content()):

            def delta(d: dict[str, Any], i: int = i) -> None:
                out.append(
                    named_event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": i, "delta": d},
                    )
                )

            if block["type"] == "text":
                out.append(
                    named_event(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "text", "text": ""},
                        },
                    )
                )
                out.append(named_event("ping", {"type": "ping"}))
                for piece in split(block["text"], self.reply.get("deltas", 3)):
                    delta({"type": "text_delta", "text": piece})
            elif block["type"] == "thinking":
                out.append(
                    named_event(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                        },
                    )
                )
                for piece in split(block["thinking"], 2):
                    delta({"type": "thinking_delta", "thinking": piece})
                delta({"type": "signature_delta", "signature": block["signature"]})
            elif self.reply.get("block_per_fragment"):  # a gateway's: a block per fragment
                raw = self.calls[len([b for b in self.content()[:i] if b["type"] == "tool_use"])][2]
                for k, frag in enumerate(split(raw, 3) if raw else [""]):
                    index = i * 100 + k
                    start = {"type": "content_block_start", "index": index}
                    out.append(
                        named_event(
                            "content_block_start",
                            {**start, "content_block": {**block, "input": {}}},
                        )
                    )
                    delta_event = {"type": "input_json_delta", "partial_json": frag}
                    out.append(
                        named_event(
                            "content_block_delta",
                            {"type": "content_block_delta", "index": index, "delta": delta_event},
                        )
                    )
                    out.append(
                        named_event(
                            "content_block_stop", {"type": "content_block_stop", "index": index}
                        )
                    )
                continue
            else:
                out.append(
                    named_event(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {**block, "input": {}},
                        },
                    )
                )
                raw = self.calls[len([b for b in self.content()[:i] if b["type"] == "tool_use"])][2]
                for frag in split(raw, 3) if raw else [""]:
                    delta({"type": "input_json_delta", "partial_json": frag})
            out.append(
                named_event("content_block_stop", {"type": "content_block_stop", "index": i})
            )
        out.append(
            named_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop(), "stop_sequence": None},
                    "usage": {"output_tokens": 0 if self.no_usage else self.completion},
                },
            )
        )
        out.append(named_event("message_stop", {"type": "message_stop"}))
        return out, 2

    def stream_error(self) -> bytes:
        error = self.reply.get("error") or {"type": "overloaded_error", "message": "Overloaded"}
        return named_event("error", {"type": "error", "error": error})


WRITERS: dict[str, type[Writer]] = {
    "completions": ChatWriter,
    "responses": ResponsesWriter,
    "messages": AnthropicWriter,
}
