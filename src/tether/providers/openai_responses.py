"""OpenAI Responses (`POST /responses`), streamed and not, stateless (`store: false`).

Quirks handled here, each pinned by a test:
- the stream ends with `response.completed`, `response.failed` or `response.incomplete` (there is
  no `[DONE]`); a stream that stops before one of them is an error, never a complete answer;
- function calls carry a `call_id` (what `function_call_output` answers) beside the item `id`;
- reasoning items are kept with their `encrypted_content` (asked for with `include`) and sent back
  unchanged, so multi-turn tool use works with reasoning models without server-side state;
- an `error` event in the stream is a failure, retryable only while nothing was emitted.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ProviderError, ProviderProtocolError, error_kind, error_status, stream_error
from ..messages import (
    ImagePart,
    Message,
    ModelRequest,
    ModelResponse,
    Part,
    ReasoningPart,
    StopReason,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
)
from .base import TextHook, wire_items
from .http import OpenAIModel, Progress, RetryHook, json_reply
from .openai_chat import parse_arguments
from .sse import SSEBatches, loads_event

if TYPE_CHECKING:  # imported where a request is made: `tether --help` needs none
    import aiohttp

PROVIDER = "openai-responses"


class OpenAIResponsesModel(OpenAIModel):
    """OpenAI's Responses API, used statelessly: each request carries the conversation, and
    reasoning items are carried across turns. The key and URL default to `OPENAI_API_KEY` and
    `OPENAI_BASE_URL`."""

    provider = PROVIDER

    def respond(
        self,
        request: ModelRequest,
        on_text: TextHook | None = None,
        on_retry: RetryHook | None = None,
    ) -> Coroutine[Any, Any, ModelResponse]:
        """Answer `request` (awaited as `Model.respond` is): the HTTP call's own coroutine,
        not one more around it, which a run in flight would hold for the whole call."""
        data = orjson.dumps(request_body(self.name, request, self.stream))
        parse = parse_stream if self.stream else parse_json
        return self.http.post(
            "/responses", data, parse, on_retry, request.max_output_tokens, on_text
        )


async def parse_json(resp: aiohttp.ClientResponse, progress: Progress) -> ModelResponse:
    return parse_response(await json_reply(resp, progress))


def request_body(model: str, request: ModelRequest, stream: bool) -> dict[str, Any]:
    items = wire_items(request, PROVIDER, input_items)
    body: dict[str, Any] = {
        "model": model,
        "input": items,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    if request.system:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in request.tools
        ]
    if request.tool_choice and request.tools:
        choice = request.tool_choice
        body["tool_choice"] = (
            choice
            if choice in ("auto", "required", "none")
            else {"type": "function", "name": choice}
        )
    if request.max_output_tokens:
        body["max_output_tokens"] = request.max_output_tokens
    if request.output is not None:
        o = request.output
        body["text"] = {
            "format": {"type": "json_schema", "name": o.name, "schema": o.schema, "strict": False}
        }
    if stream:
        body["stream"] = True
    return body


def input_items(m: Message) -> list[dict[str, Any]]:
    if m.role == "user" and m.images:
        return [{"role": "user", "content": content_items(m.parts)}]
    if m.role in ("user", "system"):
        return [{"role": m.role, "content": m.text}]
    out: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, TextPart):
            if p.text:
                out.append({"role": "assistant", "content": p.text})
        elif isinstance(p, ToolCall):
            out.append(
                {
                    "type": "function_call",
                    "call_id": p.id,
                    "name": p.name,
                    "arguments": p.raw_arguments or "{}",
                }
            )
        elif isinstance(p, ToolResult):
            output: str | list[dict[str, Any]] = p.output
            if p.images:
                output = content_items((TextPart(p.output), *p.images))
            out.append({"type": "function_call_output", "call_id": p.call_id, "output": output})
        elif isinstance(p, ReasoningPart) and p.provider == PROVIDER and p.id:
            item: dict[str, Any] = {
                "type": "reasoning",
                "id": p.id,
                "summary": [{"type": "summary_text", "text": p.text}] if p.text else [],
            }
            if p.encrypted:
                item["encrypted_content"] = p.encrypted
            out.append(item)
    return out


def content_items(parts: tuple[Part, ...]) -> list[dict[str, Any]]:
    """Text and images as input content (a user message's, or a tool output's)."""
    out: list[dict[str, Any]] = []
    for p in parts:
        if isinstance(p, TextPart) and p.text:
            out.append({"type": "input_text", "text": p.text})
        elif isinstance(p, ImagePart):
            out.append({"type": "input_image", "image_url": p.data_url, "detail": "auto"})
    return out


def parse_usage(u: dict[str, Any] | None) -> Usage:
    if not u:
        return Usage()
    return Usage(
        input_tokens=u.get("input_tokens") or 0,
        cached_input_tokens=(u.get("input_tokens_details") or {}).get("cached_tokens") or 0,
        output_tokens=u.get("output_tokens") or 0,
        reasoning_tokens=(u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0,
    )


def output_parts(output: list[dict[str, Any]]) -> list[Part]:
    parts: list[Part] = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            text = "".join(
                c.get("text", "")
                for c in item.get("content") or ()
                if c.get("type") == "output_text"
            )
            if text:
                parts.append(TextPart(text))
        elif kind == "function_call":
            raw = item.get("arguments") or ""
            parts.append(
                ToolCall(
                    item.get("call_id") or item.get("id") or "",
                    item.get("name") or "",
                    parse_arguments(raw),
                    raw,
                )
            )
        elif kind == "reasoning":
            summary = "".join(s.get("text", "") for s in item.get("summary") or ())
            parts.append(
                ReasoningPart(
                    summary,
                    encrypted=item.get("encrypted_content"),
                    id=item.get("id"),
                    provider=PROVIDER,
                )
            )
    return parts


def stop_reason(data: dict[str, Any], has_calls: bool) -> StopReason:
    if data.get("status") == "incomplete":
        reason = (data.get("incomplete_details") or {}).get("reason")
        return "content_filter" if reason == "content_filter" else "max_tokens"
    return "tool_use" if has_calls else "end_turn"


def failure(data: dict[str, Any], emitted: bool) -> ProviderError:
    """The error of a `failed` response, or of an `error` event (`data` is then the event)."""
    err: dict[str, Any] = data["error"] if isinstance(data.get("error"), dict) else data
    message = err.get("message") or "the response failed"
    return stream_error(
        error_kind(err),
        f"response failed: {message}",
        emitted,
        error_status(err),  # a gateway's own status, at HTTP 200
    )


def parse_response(data: Any) -> ModelResponse:
    if not isinstance(data, dict) or "output" not in data:
        raise ProviderProtocolError("reply is not a response object", retryable=True)
    if data.get("status") == "failed":
        raise failure(data, emitted=False)
    parts = output_parts(data.get("output") or [])
    has_calls = any(isinstance(p, ToolCall) for p in parts)
    return ModelResponse(
        Message("assistant", tuple(parts)),
        stop_reason(data, has_calls),
        parse_usage(data.get("usage")),
        data.get("model") or "",
    )


async def parse_stream(resp: aiohttp.ClientResponse, progress: Progress) -> ModelResponse:
    done_items: dict[int, dict[str, Any]] = {}
    async for batch in SSEBatches(resp, progress):
        for event_name, data in batch:
            event = loads_event(data)
            if not isinstance(event, dict):
                raise ProviderProtocolError("stream event is not an object", retryable=True)
            kind = event.get("type") or event_name
            if kind == "response.output_text.delta":
                delta = event.get("delta") or ""
                if delta:
                    progress.said(delta)
            elif kind == "response.output_item.done":
                done_items[int(event.get("output_index", len(done_items)))] = (
                    event.get("item") or {}
                )
            elif kind in ("response.completed", "response.incomplete"):
                final = dict(event.get("response") or {})
                if not final.get("output"):  # some servers leave it empty: use what streamed
                    final["output"] = [done_items[i] for i in sorted(done_items)]
                return parse_response(final)
            elif kind == "response.failed":
                raise failure(event.get("response") or {}, progress.emitted)
            elif kind == "error":
                raise failure(event, progress.emitted)
    raise ProviderProtocolError(
        "the reply stream ended before it was complete", retryable=not progress.emitted
    )
