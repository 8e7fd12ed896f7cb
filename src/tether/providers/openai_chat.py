"""OpenAI Chat Completions, and every server that speaks it (Ollama, vLLM, llama.cpp, gateways).

Quirks handled here, each pinned by a test:
- an assistant message with tool calls is sent with `"content": ""`, never null (llama.cpp's
  server rejects null);
- streamed tool calls arrive as fragments keyed by `index`; some servers repeat the id and name in
  every chunk, send `null` or no arguments, or omit `index`;
- more than one choice: the first is used;
- usage arrives in a last chunk with no choices when `stream_options.include_usage` is set;
- reasoning that servers such as vLLM, DeepSeek and Ollama return as `reasoning_content` (or
  `reasoning`) is kept as a ReasoningPart and not sent back, as those servers ask.
"""

from __future__ import annotations

from collections.abc import Coroutine
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
from .base import TextHook, wire_items
from .http import OpenAIModel, Progress, RetryHook, json_reply
from .sse import SSEBatches, loads_event

if TYPE_CHECKING:  # imported where a request is made: `tether --help` needs none
    import aiohttp

FINISH_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filter",
}


class OpenAIChatModel(OpenAIModel):
    """OpenAI's Chat Completions API, and every server that speaks it (Ollama, vLLM,
    llama.cpp's server, gateways): `base_url` points at one. The key and URL default to
    `OPENAI_API_KEY` and `OPENAI_BASE_URL`."""

    provider = "openai-chat"
    sampling: dict[str, Any] = {}  # noqa: RUF012 - read only: a subclass sets its own
    """Sampling fields sent with every request (the local model is greedy: `temperature` 0)."""

    def respond(
        self,
        request: ModelRequest,
        on_text: TextHook | None = None,
        on_retry: RetryHook | None = None,
    ) -> Coroutine[Any, Any, ModelResponse]:
        """Answer `request` (awaited as `Model.respond` is): the HTTP call's own coroutine,
        not one more around it, which a run in flight would hold for the whole call."""
        data = orjson.dumps(request_body(self.name, request, self.stream) | self.sampling)
        parse = parse_stream if self.stream else parse_json
        return self.http.post(
            "/chat/completions", data, parse, on_retry, request.max_output_tokens, on_text
        )


def request_body(model: str, request: ModelRequest, stream: bool) -> dict[str, Any]:
    messages = wire_items(request, "openai-chat", wire_messages)  # a list of this body's own
    if request.system:
        messages.insert(0, {"role": "system", "content": request.system})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in request.tools
        ]
    if request.tool_choice and request.tools:
        choice = request.tool_choice
        body["tool_choice"] = (
            choice
            if choice in ("auto", "required", "none")
            else {"type": "function", "function": {"name": choice}}
        )
    if request.max_output_tokens:
        body["max_tokens"] = request.max_output_tokens
    if request.output is not None:
        o = request.output
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": o.name, "schema": o.schema, "strict": False},
        }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def wire_messages(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        results = m.tool_results
        said: list[dict[str, Any]] = [
            {"role": "tool", "tool_call_id": r.call_id, "content": r.output} for r in results
        ]
        shown = [r for r in results if r.images]
        if shown:  # a tool message holds text only: its images follow in a user message
            said.append({"role": "user", "content": tool_images(shown)})
        return said
    if m.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": m.text}
        calls = m.tool_calls
        if calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.raw_arguments or "{}"},
                }
                for c in calls
            ]
        return [out]
    if m.role == "user" and m.images:
        return [{"role": "user", "content": content_parts(m)}]
    return [{"role": m.role, "content": m.text}]


def image_url(image: ImagePart) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": image.data_url}}


def content_parts(m: Message) -> list[dict[str, Any]]:
    """A user message with images as Chat's content parts, in the message's order."""
    out: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, TextPart) and p.text:
            out.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            out.append(image_url(p))
    return out


def tool_images(results: list[ToolResult]) -> list[dict[str, Any]]:
    """The images tool calls returned, each group named by its call."""
    out: list[dict[str, Any]] = []
    for r in results:
        out.append({"type": "text", "text": f"The images returned by {r.name} ({r.call_id}):"})
        out.extend(image_url(i) for i in r.images)
    return out


def parse_arguments(raw: str | None) -> dict[str, Any] | None:
    """The model's argument text as an object; no or empty arguments mean `{}`, junk means None."""
    if not raw or not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def parse_usage(u: dict[str, Any] | None) -> Usage:
    if not u:
        return Usage()
    prompt = u.get("prompt_tokens_details") or {}
    completion = u.get("completion_tokens_details") or {}
    return Usage(
        input_tokens=u.get("prompt_tokens") or 0,
        cached_input_tokens=prompt.get("cached_tokens") or 0,
        output_tokens=u.get("completion_tokens") or 0,
        reasoning_tokens=completion.get("reasoning_tokens") or 0,
    )


def stop_reason(finish: str | None, has_calls: bool) -> StopReason:
    if finish is None:
        return "tool_use" if has_calls else "end_turn"
    return FINISH_REASONS.get(finish, "other")


async def parse_json(resp: aiohttp.ClientResponse, progress: Progress) -> ModelResponse:
    body = await json_reply(resp, progress)
    try:
        choice = body["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ProviderProtocolError("reply is not a chat completion", retryable=True) from None
    parts: list[Part] = []
    thought = msg.get("reasoning_content") or msg.get("reasoning")
    if isinstance(thought, str) and thought:
        parts.append(ReasoningPart(thought, provider="openai-chat"))
    if msg.get("content"):
        parts.append(TextPart(msg["content"]))
    for i, tc in enumerate(msg.get("tool_calls") or ()):
        fn = tc.get("function") or {}
        raw = fn.get("arguments") or ""
        parts.append(
            ToolCall(tc.get("id") or f"call_{i}", fn.get("name") or "", parse_arguments(raw), raw)
        )
    calls = any(isinstance(p, ToolCall) for p in parts)
    return ModelResponse(
        Message("assistant", tuple(parts)),
        stop_reason(choice.get("finish_reason"), calls),
        parse_usage(body.get("usage")),
        body.get("model") or "",
    )


async def parse_stream(resp: aiohttp.ClientResponse, progress: Progress) -> ModelResponse:
    text: list[str] = []
    thought: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [id, name, argument text]
    finish: str | None = None
    usage: Usage | None = None
    model = ""
    done = False
    loads = orjson.loads
    async for batch in SSEBatches(resp, progress):
        for _event, data in batch:
            if data == b"[DONE]":
                done = True
                break
            try:  # (no call of ours a chunk: a dozen chunks a turn)
                chunk = loads(data)
            except orjson.JSONDecodeError:
                chunk = loads_event(data)  # invalid UTF-8 made U+FFFD, or the error
            if not isinstance(chunk, dict):
                raise ProviderProtocolError("stream chunk is not an object", retryable=True)
            if chunk.get("error"):
                err = chunk["error"] if isinstance(chunk["error"], dict) else {}
                raise stream_error(  # the type names the kind; a code is often a detail
                    error_kind(err),
                    f"error in stream: {err.get('message') or chunk['error']}",
                    progress.emitted,
                    error_status(err),
                )
            model = chunk.get("model") or model
            if chunk.get("usage"):
                usage = parse_usage(chunk["usage"])
            for choice in chunk.get("choices") or ():
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                if "reasoning_content" in delta or "reasoning" in delta:
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    if isinstance(reasoning, str):
                        thought.append(reasoning)
                content = delta.get("content")
                if content:
                    text.append(content)
                    progress.said(content)
                for tc in delta.get("tool_calls") or ():
                    add_call_fragment(calls, tc)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if done:
            break
    if not done and finish is None:
        raise ProviderProtocolError(
            "the reply stream ended before it was complete", retryable=not progress.emitted
        )
    parts: list[Part] = [ReasoningPart("".join(thought), provider="openai-chat")] if thought else []
    if text:
        parts.append(TextPart("".join(text)))
    for i, (cid, name, raw) in sorted(calls.items()):
        parts.append(ToolCall(cid or f"call_{i}", name, parse_arguments(raw), raw))
    return ModelResponse(
        Message("assistant", tuple(parts)),
        stop_reason(finish, bool(calls)),
        usage or Usage(),
        model,
    )


def add_call_fragment(calls: dict[int, list[str]], tc: dict[str, Any]) -> None:
    """Merge one streamed tool-call fragment. Ids and names are set, never appended, because some
    servers repeat them in every chunk; arguments are appended."""
    index = tc.get("index")
    if index is None:  # servers that omit the index: a new id starts a new call
        ids = [c[0] for c in calls.values()]
        if tc.get("id") and tc["id"] not in ids:
            index = len(calls)
        else:
            index = max(calls) if calls else 0
            if tc.get("id") in ids:
                index = ids.index(tc["id"])
    entry = calls.get(index)
    if entry is None:
        entry = calls[index] = ["", "", ""]
    call_id = tc.get("id")
    if call_id:
        entry[0] = call_id
    fn = tc.get("function")
    if fn:
        name = fn.get("name")
        if name:
            entry[1] = name
        arguments = fn.get("arguments")
        if arguments:
            entry[2] += arguments
