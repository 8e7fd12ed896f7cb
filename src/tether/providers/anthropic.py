"""Anthropic Messages (`POST /v1/messages`), streamed and not.

Quirks handled here, each pinned by a test:
- `max_tokens` is required: always sent;
- tool results travel as `tool_result` blocks (with `is_error`) in a user message, and turns of
  the same role are merged so the conversation alternates;
- thinking blocks (with their signature) and redacted thinking are returned unchanged on the next
  turn, as tool use with extended thinking requires;
- `server_tool_use` and other server-tool blocks are not client tool calls;
- a tool call without arguments streams an empty `partial_json`: its input is `{}`;
- `input_tokens` is normalized to include cache reads and cache writes;
- `overloaded_error` (HTTP 529, or an `error` event in the stream) is retryable while nothing
  was emitted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ProviderProtocolError, error_kind, error_status, stream_error
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
from .base import TextHook
from .http import (
    HTTPModel,
    HTTPSettings,
    Progress,
    RetryHook,
    credentials,
    json_reply,
)
from .openai_chat import parse_arguments
from .sse import SSEBatches, loads_event

if TYPE_CHECKING:  # imported where a request is made: `tether --help` needs none
    import aiohttp

PROVIDER = "anthropic"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096

STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "refusal": "content_filter",
    "pause_turn": "pause",
}


class AnthropicModel(HTTPModel):
    """Anthropic's Messages API. The key and URL default to `ANTHROPIC_API_KEY` and
    `ANTHROPIC_BASE_URL` (see `http.credentials`); `max_tokens` is each reply's limit, which
    the API requires."""

    provider = PROVIDER

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        stream: bool = True,
        settings: HTTPSettings | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        self.max_tokens = max_tokens
        api_key, base_url = credentials(
            PROVIDER, api_key, base_url, "ANTHROPIC", "https://api.anthropic.com"
        )
        base = base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        super().__init__(
            name,
            base_url=base,
            api_key=api_key,
            headers={"x-api-key": api_key, "anthropic-version": API_VERSION},
            stream=stream,
            settings=settings,
        )

    async def respond(
        self,
        request: ModelRequest,
        on_text: TextHook | None = None,
        on_retry: RetryHook | None = None,
    ) -> ModelResponse:
        data = orjson.dumps(request_body(self.name, request, self.stream, self.max_tokens))
        parse = parse_stream if self.stream else parse_json
        limit = request.max_output_tokens or self.max_tokens
        response: ModelResponse = await self.http.post(
            "/messages", data, parse, on_retry, limit, on_text
        )
        return response if request.output is None else answer_of(response)


async def parse_json(resp: aiohttp.ClientResponse, progress: Progress) -> ModelResponse:
    data = await json_reply(resp, progress)
    if not isinstance(data, dict) or data.get("type") != "message":
        raise ProviderProtocolError("reply is not a message", retryable=True)
    return parse_message(data)


def request_body(
    model: str, request: ModelRequest, stream: bool, max_tokens: int
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for m in request.messages:
        role, blocks = wire_blocks(m)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_output_tokens or max_tokens,
        "messages": messages,
    }
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
    if request.output is not None:  # no native form: the answer is a tool's input
        body.setdefault("tools", []).append(
            {
                "name": ANSWER_TOOL,
                "description": "Give your final answer: call this when you are done, with the "
                "answer as its input, instead of answering in text.",
                "input_schema": request.output.schema,
            }
        )
    if request.tool_choice and request.tools:
        choice = request.tool_choice
        named = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}
        body["tool_choice"] = named.get(choice, {"type": "tool", "name": choice})
    if stream:
        body["stream"] = True
    return body


ANSWER_TOOL = "final_answer"


def answer_of(response: ModelResponse) -> ModelResponse:
    """A reply whose `final_answer` call is the answer: its input as the reply's text (so the
    loop ends the run on it, as on the native forms of the other protocols)."""
    parts = response.message.parts
    answers = [p for p in parts if isinstance(p, ToolCall) and p.name == ANSWER_TOOL]
    if not answers:
        return response
    rest = tuple(p for p in parts if not (isinstance(p, ToolCall) and p.name == ANSWER_TOOL))
    text = TextPart(answers[-1].raw_arguments or orjson.dumps(answers[-1].arguments).decode())
    calls = any(isinstance(p, ToolCall) for p in rest)
    return dataclasses.replace(
        response,
        message=Message("assistant", (*rest, text)),
        stop_reason=response.stop_reason if calls else "end_turn",
    )


def wire_blocks(m: Message) -> tuple[str, list[dict[str, Any]]]:
    role = "assistant" if m.role == "assistant" else "user"
    blocks: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, TextPart):
            if p.text:
                blocks.append({"type": "text", "text": p.text})
        elif isinstance(p, ToolCall):
            blocks.append(
                {"type": "tool_use", "id": p.id, "name": p.name, "input": p.arguments or {}}
            )
        elif isinstance(p, ImagePart):
            blocks.append(image_block(p))
        elif isinstance(p, ToolResult):
            content: str | list[dict[str, Any]] = p.output
            if p.images:
                text = [{"type": "text", "text": p.output}] if p.output else []
                content = [*text, *(image_block(i) for i in p.images)]
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": p.call_id,
                "content": content,
            }
            if p.is_error:
                block["is_error"] = True
            blocks.append(block)
        elif isinstance(p, ReasoningPart) and p.provider == PROVIDER:
            if p.encrypted is not None:
                blocks.append({"type": "redacted_thinking", "data": p.encrypted})
            else:
                blocks.append({"type": "thinking", "thinking": p.text, "signature": p.signature})
    return role, blocks


def image_block(image: ImagePart) -> dict[str, Any]:
    source = {"type": "base64", "media_type": image.media_type, "data": image.base64}
    return {"type": "image", "source": source}


def parse_usage(u: dict[str, Any] | None) -> Usage:
    if not u:
        return Usage()
    read = u.get("cache_read_input_tokens") or 0
    write = u.get("cache_creation_input_tokens") or 0
    return Usage(
        input_tokens=(u.get("input_tokens") or 0) + read + write,
        cached_input_tokens=read,
        output_tokens=u.get("output_tokens") or 0,
    )


def block_part(block: dict[str, Any]) -> Part | None:
    """Our part for one content block; None for blocks that are not ours to act on."""
    kind = block.get("type")
    if kind == "text":
        return TextPart(block.get("text") or "")
    if kind == "tool_use":
        args = block.get("input")
        raw = block.get("raw_input")
        if raw is None:
            raw = orjson.dumps(args).decode() if isinstance(args, dict) else ""
        arguments = args if isinstance(args, dict) else None
        return ToolCall(block.get("id") or "", block.get("name") or "", arguments, raw)
    if kind == "thinking":
        return ReasoningPart(
            block.get("thinking") or "", signature=block.get("signature"), provider=PROVIDER
        )
    if kind == "redacted_thinking":
        return ReasoningPart("", encrypted=block.get("data") or "", provider=PROVIDER)
    return None  # server_tool_use, web_search_tool_result, ...: run by Anthropic, not by us


def parse_message(data: dict[str, Any]) -> ModelResponse:
    parts = [p for b in data.get("content") or () if (p := block_part(b)) is not None]
    parts = [p for p in parts if not (isinstance(p, TextPart) and not p.text)]
    return ModelResponse(
        Message("assistant", tuple(parts)),
        STOP_REASONS.get(data.get("stop_reason") or "", "other"),
        parse_usage(data.get("usage")),
        data.get("model") or "",
    )


async def parse_stream(resp: aiohttp.ClientResponse, progress: Progress) -> ModelResponse:
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    json_parts: dict[int, list[str]] = {}
    merged: dict[int, int] = {}  # a block that continues an earlier one -> that block's index
    usage: dict[str, Any] = {}
    async for batch in SSEBatches(resp, progress):
        for _name, data in batch:
            event = loads_event(data)
            if not isinstance(event, dict):
                raise ProviderProtocolError("stream event is not an object", retryable=True)
            kind = event.get("type")
            if kind == "message_start":
                message = dict(event.get("message") or {})
                usage.update(message.get("usage") or {})
            elif kind == "content_block_start":
                index = int(event.get("index", len(blocks)))
                started = dict(event.get("content_block") or {})
                earlier = continued(started, blocks, json_parts)
                if earlier is not None:
                    merged[index] = earlier
                    continue
                blocks[index] = started
                if started.get("type") in ("tool_use", "server_tool_use"):
                    json_parts[index] = []
            elif kind == "content_block_delta":
                index = int(event.get("index", -1))
                index = merged.get(index, index)
                block = blocks.get(index)
                if block is None:
                    raise ProviderProtocolError(
                        "delta for a block that never started", retryable=True
                    )
                apply_delta(block, event.get("delta") or {}, json_parts, index)
                if (event.get("delta") or {}).get("type") == "text_delta":
                    progress.said(event["delta"].get("text") or "")
            elif kind == "message_delta":
                if message is None:
                    raise ProviderProtocolError(
                        "message_delta before message_start", retryable=True
                    )
                message.update(event.get("delta") or {})
                usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            elif kind == "message_stop":
                if message is None:
                    raise ProviderProtocolError("message_stop before message_start", retryable=True)
                for index, pieces in json_parts.items():
                    raw = "".join(pieces)
                    blocks[index]["input"] = parse_arguments(raw)
                    blocks[index]["raw_input"] = raw or "{}"
                message["content"] = [blocks[i] for i in sorted(blocks)]
                message["usage"] = usage
                return parse_message(message)
            elif kind == "error":
                err = event.get("error") or {}
                raise stream_error(
                    error_kind(err),
                    f"error in stream: {err.get('message')}",
                    progress.emitted,
                    error_status(err),  # a gateway's own status, at HTTP 200
                )
            # ping and unknown events are ignored, as the API reference asks
    raise ProviderProtocolError(
        "the reply stream ended before it was complete", retryable=not progress.emitted
    )


def continued(
    block: dict[str, Any], blocks: dict[int, dict[str, Any]], json_parts: dict[int, list[str]]
) -> int | None:
    """The index of the tool call this block goes on with, if any: some gateways send a call's
    argument fragments as blocks of their own under the call's id. A block with the id of the
    last call, whose arguments are not yet whole JSON, is a fragment of it; one whose arguments
    are whole is a call of its own (its clashing id is made unique later, `loop.unique_calls`)."""
    if block.get("type") not in ("tool_use", "server_tool_use") or not json_parts:
        return None
    last = max(json_parts)
    if blocks[last].get("id") != block.get("id"):
        return None
    so_far = "".join(json_parts[last])
    try:
        orjson.loads(so_far)
    except orjson.JSONDecodeError:
        return last
    return None


def apply_delta(
    block: dict[str, Any], delta: dict[str, Any], json_parts: dict[int, list[str]], index: int
) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = (block.get("text") or "") + (delta.get("text") or "")
    elif kind == "input_json_delta":
        json_parts.setdefault(index, []).append(delta.get("partial_json") or "")
    elif kind == "thinking_delta":
        block["thinking"] = (block.get("thinking") or "") + (delta.get("thinking") or "")
    elif kind == "signature_delta":
        block["signature"] = (block.get("signature") or "") + (delta.get("signature") or "")
