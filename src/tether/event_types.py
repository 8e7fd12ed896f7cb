"""The fields of each event type, declared once: a `TypedDict` per type, each field annotated
with its type and what it holds. `events.SCHEMA` (and from it the docs' event reference) is read
from these, and each `Emitter` method takes its type's fields, so mypy checks what every emit
site sends, and the schema, the docs and the code cannot drift.

They are plain dicts at run time (a `TypedDict` allocates nothing of its own): an event's data
costs what it did when it was written out by hand.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

USAGE = (
    "{input_tokens (all prompt tokens, cached included), cached_input_tokens, output_tokens,"
    " reasoning_tokens}, with estimated: true where the server sent no counts"
)
IMAGES = "[{media_type, sha256, bytes}] when there are images: named, never inlined"
UsageField = Annotated[dict[str, Any], USAGE]
ImagesField = Annotated[list[dict[str, Any]], IMAGES]


class RunStartedFields(TypedDict, total=False):
    """A run begins."""

    task: Annotated[str | None, "the task as given (null: a fork that goes on with no new message)"]
    provider: Annotated[str | None, "the model's protocol"]
    model: Annotated[str | None, "the model's name"]
    agent: Annotated[str | None, "the agent's name"]
    version: Annotated[str | None, "the agent's version (given, or its definition's fingerprint)"]
    images: ImagesField
    forked_from: Annotated[str, "a fork's: the run it was forked from"]
    at: Annotated[int, "a fork's: the step of that run it starts after"]
    account: Annotated[str, "the account the run belongs to, if it has one (tether limits)"]


class RunResumedFields(TypedDict, total=False):
    """A durable run goes on in this process after a crash or a stop."""


class ModelRequestFields(TypedDict, total=False):
    """A model call starts."""

    messages: Annotated[int, "how many messages the request holds"]


class TextDeltaFields(TypedDict, total=False):
    """A piece of the model's text, while it streams: what one read of the stream brought."""

    text: Annotated[str, "the piece"]


class ModelResponseFields(TypedDict, total=False):
    """The model answered."""

    text: Annotated[str, "its text"]
    tool_calls: Annotated[list[dict[str, Any]], "[{id, name, arguments}] the tools it asks for"]
    stop_reason: Annotated[str, "end_turn, tool_use, max_tokens ..."]
    usage: UsageField
    model: Annotated[str, "the model that answered (with fallback models, the one that served)"]


class ToolCallFields(TypedDict, total=False):
    """A tool call starts."""

    id: Annotated[str, "the call's id, unique within the run"]
    name: Annotated[str, "the tool"]
    arguments: Annotated[dict[str, Any], "its arguments, an object"]
    raw_arguments: Annotated[str, "the model's text when it was not a JSON object"]
    child_run_id: Annotated[str, "the child run an agent tool starts"]


class ToolResultFields(TypedDict, total=False):
    """A tool call ended."""

    id: Annotated[str, "the call's id"]
    name: Annotated[str, "the tool"]
    output: Annotated[str, "what goes back to the model"]
    is_error: Annotated[
        bool, "true when the call failed (bad arguments, exception, timeout, denial ...)"
    ]
    images: ImagesField
    usage: Annotated[
        dict[str, Any],
        "the run's model, asked by the call (MCP sampling): counted in the run's usage;"
        " absent when it was not",
    ]


class RetryFields(TypedDict, total=False):
    """A model call failed and is tried again."""

    attempt: Annotated[int, "1, 2 ..."]
    delay: Annotated[float, "seconds before the next try"]
    error: Annotated[dict[str, Any], "{kind, status, message, retryable}"]


class FallbackFields(TypedDict, total=False):
    """A model could not serve now and the next one answers."""

    failed: Annotated[str, "the model that failed"]
    to: Annotated[str, "the model that answers next"]
    error: Annotated[
        dict[str, Any], "{kind, status, message, retryable}: why the first could not serve"
    ]


class GuardrailFields(TypedDict, total=False):
    """A guardrail's verdict."""

    name: Annotated[str, "the guardrail"]
    kind: Annotated[str, "input, tool or output"]
    passed: Annotated[bool, "true or false"]
    message: Annotated[str, "why it tripped"]
    id: Annotated[str, "a tool guardrail's call id"]


class UserMessageFields(TypedDict, total=False):
    """A message reached a live run (delivered before its next model call)."""

    text: Annotated[str, "the message"]
    by: Annotated[str, "check when it is the check-your-work turn"]


class ApprovalRequestedFields(TypedDict, total=False):
    """A tool call waits for a human."""

    approval_id: Annotated[str, "what approve and deny name"]
    id: Annotated[str, "the call's id"]
    name: Annotated[str, "the tool"]
    arguments: Annotated[dict[str, Any], "its exact arguments"]
    args_hash: Annotated[str, "SHA-256 of those arguments"]
    expires_at: Annotated[float | None, "when the request expires (Unix time), or null"]


class ApprovalDecidedFields(TypedDict, total=False):
    """A waiting call was approved or denied."""

    approval_id: Annotated[str, "the request"]
    id: Annotated[str, "the call's id"]
    approved: Annotated[bool, "true or false"]
    reason: Annotated[str, "why (a denial's reason reaches the model)"]


class ToolProgressFields(TypedDict, total=False):
    """A running tool call reports how far it has come (an MCP server's progress)."""

    id: Annotated[str | None, "the call's id"]
    progress: Annotated[float | None, "how much is done"]
    total: Annotated[float | None, "how much there is, or null"]
    message: Annotated[str | None, "what it says it is doing, or null"]


class QuestionAskedFields(TypedDict, total=False):
    """A tool call asks the person behind the run for values (MCP elicitation)."""

    question_id: Annotated[str, "what answer names"]
    asker: Annotated[str, "who asks (the MCP server)"]
    message: Annotated[str, "the question"]
    schema: Annotated[dict[str, Any], "a JSON Schema of the values wanted"]
    url: Annotated[str, "a page the person is asked to visit instead, or empty"]
    id: Annotated[str, "the call's id"]


class SampledFields(TypedDict, total=False):
    """An MCP server had the run's model answer a request in the middle of a call (sampling)."""

    id: Annotated[str | None, "the call's id"]
    asker: Annotated[str, "the MCP server"]
    messages: Annotated[int, "how many messages it sent"]
    text: Annotated[str, "the model's answer"]
    usage: Annotated[dict[str, Any], "the tokens it used (the run's, added when the call ends)"]


class QuestionAnsweredFields(TypedDict, total=False):
    """The question was answered, declined or cancelled."""

    question_id: Annotated[str, "the question"]
    action: Annotated[str, "accept, decline or cancel"]
    reason: Annotated[str, "who or what answered"]


UpgradedFields = TypedDict(
    "UpgradedFields",
    {
        "from": Annotated[str, "the version it began with"],
        "to": Annotated[str, "the version it goes on under"],
    },
    total=False,
)
UpgradedFields.__doc__ = (
    "A run goes on under another version of its agent than it began with (tether upgrade)."
)


class QueuedFields(TypedDict, total=False):
    """Work waits for a free slot (admission), a new run for room in its account's budget, or
    a model call's attempt for its endpoint's rate limit or a server's pause."""

    what: Annotated[str, "run, model_call, account (a limit with when_over queue) or rate"]
    position: Annotated[int, "its place in the queue (run, model_call)"]
    account: Annotated[str, "the account (account)"]
    endpoint: Annotated[str, "the provider, URL and a hash of the key (rate)"]
    reason: Annotated[
        str,
        "the limit reached, as a halt would say it (account); the rate, or until when the"
        " server asked for no requests (rate)",
    ]


class AdmittedFields(TypedDict, total=False):
    """Queued work got its slot, its account room or its endpoint's rate room."""

    what: Annotated[str, "run, model_call, account or rate"]
    endpoint: Annotated[str, "(rate)"]


class ContextTrimmedFields(TypedDict, total=False):
    """Old tool outputs were cut to head and tail to fit the context window."""

    outputs: Annotated[int, "how many"]
    characters_saved: Annotated[int, "characters cut"]
    estimated_tokens: Annotated[int, "the request's estimate after"]


class ContextSummarizedFields(TypedDict, total=False):
    """Older turns were summarised by the model to fit the context window."""

    messages_replaced: Annotated[int, "how many messages the summary replaced"]
    summary: Annotated[str, "its text"]
    estimated_tokens: Annotated[int, "the request's estimate after"]
    usage: UsageField


class IdleFields(TypedDict, total=False):
    """A permanent run waits for its next message."""


class RunCrashedFields(TypedDict, total=False):
    """The run's own code raised (a bug, not a model or tool error)."""

    error: Annotated[str, "the exception's type and message"]


class RestartingFields(TypedDict, total=False):
    """A restart policy starts the run again."""

    attempt: Annotated[int, "1, 2 ..."]
    reason: Annotated[str, "why the last attempt ended"]


class GaveUpFields(TypedDict, total=False):
    """Restarts passed the policy's intensity limit."""

    restarts: Annotated[int, "how many were made"]
    within: Annotated[float, "the policy's window in seconds"]
    reason: Annotated[str, "why the last attempt ended"]


class RunFinishedFields(TypedDict, total=False):
    """The run ended; always the last event."""

    outcome: Annotated[str, "done, halted, cancelled or failed"]
    answer: Annotated[str, "the final answer"]
    reason: Annotated[str, "why it ended (a budget, a guardrail, an error ...)"]
    usage: UsageField
    cost_usd: Annotated[float, "what its model calls cost, where prices are known"]
    steps: Annotated[int, "model calls made"]
    output: Annotated[Any, "the typed answer as JSON, with an output type"]
    error: Annotated[dict[str, Any], "for failed: {kind, status, message, retryable}"]


TYPES: dict[str, type] = {
    "run_started": RunStartedFields,
    "run_resumed": RunResumedFields,
    "model_request": ModelRequestFields,
    "text_delta": TextDeltaFields,
    "model_response": ModelResponseFields,
    "tool_call": ToolCallFields,
    "tool_result": ToolResultFields,
    "retry": RetryFields,
    "fallback": FallbackFields,
    "guardrail": GuardrailFields,
    "user_message": UserMessageFields,
    "approval_requested": ApprovalRequestedFields,
    "approval_decided": ApprovalDecidedFields,
    "tool_progress": ToolProgressFields,
    "question_asked": QuestionAskedFields,
    "sampled": SampledFields,
    "question_answered": QuestionAnsweredFields,
    "upgraded": UpgradedFields,
    "queued": QueuedFields,
    "admitted": AdmittedFields,
    "context_trimmed": ContextTrimmedFields,
    "context_summarized": ContextSummarizedFields,
    "idle": IdleFields,
    "run_crashed": RunCrashedFields,
    "restarting": RestartingFields,
    "gave_up": GaveUpFields,
    "run_finished": RunFinishedFields,
}
"""Every event type's fields, by its name, in the order the docs list them."""
