"""Context-window management: keep the next request inside the model's window.

Before a model call whose estimated input would pass the window minus a reserve:
1. old tool outputs are cut to their head and tail (the latest turn's are left whole);
2. if that is not enough, the older turns are summarised by the model itself and replaced by
   the summary, never splitting a tool call from its result.
A provider's context-length error shrinks the conversation the same way, and the call is retried
once. What was replaced is recorded as `context_trimmed` and `context_summarized` events.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .errors import ProviderError
from .events import Emitter
from .messages import Message, ModelRequest, TextPart, Usage, message_chars
from .providers.base import Model

SUMMARY_PROMPT = (
    "Summarise the conversation so far for your own later use: the task, what has been done, "
    "what each tool call found, and what remains. Be complete about facts, brief in words."
)
SUMMARY_MARK = "[Summary of the earlier conversation]"
CONTEXT_ERROR = re.compile(
    r"context[_ ]length|maximum context|context window|prompt is too long|too many tokens",
    re.I,
)


WINDOWS = {
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "gpt-4o": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude": 200_000,
    "smollm2-135m-instruct": 8192,
}


def window_for(model: str) -> int | None:
    """The context window of a known model family (longest matching prefix), else None."""
    matches = [k for k in WINDOWS if model.startswith(k)]
    return WINDOWS[max(matches, key=len)] if matches else None


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    window: int
    """The model's context window, in tokens."""
    reserve: int = 1024
    """Kept free for the reply."""
    keep_chars: int = 600
    """How much of an old tool output survives a trim (head and tail together)."""

    @property
    def limit(self) -> int:
        return max(256, self.window - self.reserve)


def estimate(messages: list[Message], system: str | None = None) -> int:
    return (len(system or "") + sum(message_chars(m) for m in messages)) // 4 + 1


def is_context_error(e: ProviderError) -> bool:
    return e.status in (400, 413) and bool(
        CONTEXT_ERROR.search(f"{e.error_type or ''} {e.message}")
    )


def trim_tool_outputs(messages: list[Message], keep_chars: int) -> tuple[int, int]:
    """Cut the tool outputs of every turn but the latest to head and tail; returns how many
    outputs were cut and how many characters that saved."""
    last_tool = max((i for i, m in enumerate(messages) if m.role == "tool"), default=-1)
    cut = saved = 0
    half = keep_chars // 2
    for i, m in enumerate(messages):
        if m.role != "tool" or i == last_tool:
            continue
        parts = []
        for r in m.tool_results:
            if len(r.output) > keep_chars + 80:
                dropped = len(r.output) - 2 * half
                output = (
                    f"{r.output[:half]}\n[... {dropped} characters cut to fit the "
                    f"context window ...]\n{r.output[-half:]}"
                )
                saved += len(r.output) - len(output)
                cut += 1
                r = dataclasses.replace(r, output=output)
            parts.append(r)
        messages[i] = Message("tool", tuple(parts))
    return cut, saved


def split_point(messages: list[Message], keep_last: int) -> int:
    """Where older turns end: the start of a message that is not a tool result (so no call is
    parted from its result), leaving at least `keep_last` messages after it."""
    i = max(1, len(messages) - keep_last)
    while i < len(messages) and messages[i].role == "tool":
        i += 1
    return i if i < len(messages) else 0


async def summarise(
    model: Model, messages: list[Message], system: str | None, keep_last: int = 4
) -> tuple[int, str, Usage] | None:
    """Replace the older turns (after the first message, the task) by a summary the model
    writes; returns (messages replaced, summary), or None if there is nothing to replace."""
    cut = split_point(messages, keep_last)
    if cut <= 1:
        return None
    older = messages[:cut]
    request = ModelRequest((*older, Message.user(SUMMARY_PROMPT)), (), system)
    response = await model.respond(request)
    summary = response.message.text.strip() or "(no summary)"
    first = messages[0]
    messages[:cut] = [first, Message("user", (TextPart(f"{SUMMARY_MARK}\n{summary}"),))]
    return cut - 1, summary, response.usage


async def fit(
    model: Model,
    messages: list[Message],
    system: str | None,
    policy: ContextPolicy,
    emitter: Emitter,
    force: bool = False,
) -> Usage:
    """Make the conversation fit the policy's limit (or shrink it anyway, with `force`);
    returns the usage of the summary call, if one was made."""
    if not force and estimate(messages, system) <= policy.limit:
        return Usage()
    cut, saved = trim_tool_outputs(messages, policy.keep_chars)
    if cut:
        emitter.context_trimmed(
            outputs=cut,
            characters_saved=saved,
            estimated_tokens=estimate(messages, system),
        )
    if not force and estimate(messages, system) <= policy.limit:
        return Usage()
    done = await summarise(model, messages, system)
    if done is None:
        return Usage()
    replaced, summary, usage = done
    emitter.context_summarized(
        messages_replaced=replaced,
        summary=summary,
        estimated_tokens=estimate(messages, system),
        usage=usage.to_dict(),
    )
    return usage
