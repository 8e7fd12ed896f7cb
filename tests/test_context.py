"""Context-window management: a long run that would overflow a small window completes, with the
trimming and the summary visible in its events; a context-length error shrinks and retries once."""

from __future__ import annotations

import pytest

from tether import (
    Agent,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    Runtime,
    ScriptedModel,
    reply,
    tool,
)
from tether.context import SUMMARY_MARK, SUMMARY_PROMPT, ContextPolicy, estimate
from tether.errors import ClientRequestError
from tether.events import Event
from tether.messages import ToolCall, ToolResult

CUT = "characters cut to fit the context window"


@tool
def dump(page: int) -> str:
    """Print a long page."""
    return f"page {page}: " + "lorem ipsum " * 250  # about 3,000 characters


class Reader:
    """A model that reads ten pages, one a turn, then answers; it summarises when asked."""

    def __init__(self, fail_first_over: int | None = None) -> None:
        self.requests: list[ModelRequest] = []
        self.summaries = 0
        self.fail_first_over = fail_first_over
        self.failed = False

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if request.messages[-1].text == SUMMARY_PROMPT:
            self.summaries += 1
            return reply(f"Read pages up to {self.pages(request) - 1}; all lorem ipsum.")
        size = estimate(list(request.messages), request.system)
        if self.fail_first_over is not None and size > self.fail_first_over and not self.failed:
            self.failed = True
            raise ClientRequestError(
                "HTTP 400: This model's maximum context length is 2000 tokens.",
                status=400,
                error_type="context_length_exceeded",
            )
        pages = self.pages(request)
        if pages < 10:
            return reply(tool_calls=[("dump", {"page": pages})])
        return reply("I read all ten pages.")

    def pages(self, request: ModelRequest) -> int:
        done = sum(len(m.tool_results) for m in request.messages)
        summary = next((m.text for m in request.messages if m.text.startswith(SUMMARY_MARK)), "")
        earlier = int(summary.split("up to ")[1].split(";")[0]) + 1 if summary else 0
        return earlier + done


def valid(messages: tuple[Message, ...]) -> bool:
    """Every tool message follows the assistant message that made its calls."""
    for i, m in enumerate(messages):
        if m.role == "tool":
            before = messages[i - 1] if i else None
            if before is None or [c.id for c in before.tool_calls] != [
                r.call_id for r in m.tool_results
            ]:
                return False
    return True


@pytest.mark.parametrize("nudged", [None, *range(1, 8)])
async def test_a_long_run_fits_a_small_window(nudged: int | None) -> None:
    """The older turns are summarised whole: no tool result is parted from the call that asked
    for it (a provider refuses an orphan result), wherever the turns fall. A message the user
    sends during the run (after the `nudged`-th request) moves where the older ones end: after
    the 4th or the 5th, the cut would fall between a call and its result."""
    inbox: list[str] = []
    reader = Reader()

    def read(request: ModelRequest) -> ModelResponse:
        if len(reader.requests) == nudged:
            inbox.append("Take your time.")  # `send`: it reaches the model with the next call
        return reader(request)

    model = ScriptedModel([read] * 40)
    events: list[Event] = []
    policy = ContextPolicy(window=2000, reserve=500)
    result = await Agent(model, [dump], context=policy).run(
        "Read the pages.", sinks=[events.append], inbox=inbox
    )
    assert result.outcome == "done" and result.answer == "I read all ten pages."
    types = [e.type for e in events]
    assert "context_trimmed" in types and "context_summarized" in types
    summarized = next(e for e in events if e.type == "context_summarized")
    assert summarized.data["messages_replaced"] > 0 and "pages up to" in summarized.data["summary"]
    work = [r for r in reader.requests if r.messages[-1].text != SUMMARY_PROMPT]
    assert all(estimate(list(r.messages), r.system) <= policy.limit for r in work)
    assert all(valid(r.messages) for r in reader.requests)
    assert reader.summaries >= 1
    assert result.usage.input_tokens > 0  # the summary calls are counted too


async def test_no_summary_is_asked_for_when_trimming_old_outputs_is_enough() -> None:
    """A summary costs a model call and loses detail: it is made only when the trimmed
    conversation still does not fit."""
    reader = Reader()
    events: list[Event] = []
    policy = ContextPolicy(window=3500, reserve=500)  # ten trimmed pages fit in 3,000 tokens
    result = await Agent(ScriptedModel([reader] * 40), [dump], context=policy).run(
        "Read the pages.", sinks=[events.append]
    )
    assert result.answer == "I read all ten pages."
    types = [e.type for e in events]
    assert "context_trimmed" in types and "context_summarized" not in types
    assert reader.summaries == 0 and len(reader.requests) == 11
    # the outputs the model has just asked for reach it whole each turn; older ones are cut
    for n, request in enumerate(reader.requests[1:]):
        assert [r.output for r in request.messages[-1].tool_results] == [dump(n)]
    older = reader.requests[-1].messages[:-1]
    assert any(CUT in r.output for m in older for r in m.tool_results)


async def test_a_context_length_error_shrinks_and_retries_once() -> None:
    reader = Reader(fail_first_over=1500)
    model = ScriptedModel([reader] * 40)
    events: list[Event] = []
    policy = ContextPolicy(window=100_000)  # the window was wrong: the provider says so
    result = await Agent(model, [dump], context=policy).run(
        "Read the pages.", sinks=[events.append]
    )
    assert reader.failed and result.outcome == "done"
    assert any(e.type in ("context_trimmed", "context_summarized") for e in events)
    work = [r for r in reader.requests if r.messages[-1].text != SUMMARY_PROMPT]
    sizes = [estimate(list(r.messages), r.system) for r in work]
    refused = next(i for i, n in enumerate(sizes) if n > 1500)
    # the refused turn was asked again, smaller, and the run went on from there
    assert sizes[refused + 1] < sizes[refused] and len(work) > refused + 1


async def test_without_a_policy_the_error_ends_the_run() -> None:
    reader = Reader(fail_first_over=1500)
    result = await Agent(ScriptedModel([reader] * 40), [dump]).run("Read the pages.")
    assert result.outcome == "failed" and result.error is not None
    assert result.error["status"] == 400


@pytest.mark.parametrize(
    ("model", "window"),
    [("gpt-4.1-mini", 1_047_576), ("claude-sonnet-4-5", 200_000), ("mystery", None)],
)
def test_known_windows(model: str, window: int | None) -> None:
    from tether.context import window_for

    assert window_for(model) == window


@pytest.mark.parametrize(("over", "trimmed"), [(0, False), (1, True)])
async def test_a_conversation_is_fitted_only_when_it_is_over_the_limit(
    over: int, trimmed: bool
) -> None:
    """At its limit exactly a conversation is sent as it is; one token over, its older tool
    outputs are trimmed first (the check is `>`, the limit itself fits)."""
    policy = ContextPolicy(window=1300, reserve=1000, keep_chars=100)  # a limit of 300 tokens

    def history() -> list[Message]:
        out = []
        for i in range(2):
            out.append(Message("assistant", (ToolCall(f"c{i}", "dump", {}, "{}"),)))
            out.append(Message("tool", (ToolResult(f"c{i}", "dump", "y" * 400),)))
        return out

    def size(chars: int) -> int:
        return estimate([*history(), Message.user("x" * chars)])

    chars = max(n for n in range(2000) if size(n) == policy.limit + over)
    events: list[Event] = []
    model = ScriptedModel([reply("ok")] * 3)  # its reply by the turns so far: two in history
    result = await Agent(model, context=policy).run(
        "x" * chars, transcript=history(), sinks=[events.append]
    )
    assert result.outcome == "done"
    assert ("context_trimmed" in [e.type for e in events]) is trimmed
    sent = model.requests[0].messages
    assert (sent[1].tool_results[0].output == "y" * 400) is not trimmed


async def test_the_summary_calls_count_against_the_runs_account() -> None:
    """A summary is a model call the run pays for: its tokens reach the run's account with the
    rest, so the account's spend is the run's whole usage."""
    reader = Reader()
    policy = ContextPolicy(window=2000, reserve=500)
    agent = Agent(ScriptedModel([reader] * 40), [dump], context=policy, name="reader")
    async with Runtime(agents=[agent]) as rt:
        run = await rt.start("reader", "Read the pages.", context=RunContext(account_id="acme"))
        result = await run.wait()
        assert result is not None and result.outcome == "done" and reader.summaries >= 1
        spent = (await rt.account("acme")).spent["total"]
        assert spent.tokens == result.usage.total_tokens > 0
