"""One exception tree for everything Tether raises on purpose.

    TetherError
     ├── ConfigError                 bad usage or configuration (CLI exit status 2)
     │    └── MissingAPIKey          names the environment variable, never its value
     ├── RunError                    asking the runtime for something it cannot do
     │    ├── RunExists              a live run already has this id
     │    ├── NoSuchRun              no run has this id
     │    ├── RunEnded               the run is over: it takes no more messages
     │    ├── ApprovalError          no such approval waits, or it was shown other arguments
     │    ├── QuestionError          no such question waits, or an answer does not fit it
     │    └── AccountOverBudget      a new run's account is over a limit that refuses new runs
     │                               (CLI exit status 3, as for a run halted by a budget)
     ├── RecordError                 a store's record Tether did not write (a pickle, a row
     │    │                          rewritten by hand): refused, nothing of it run
     │    └── ReplayDiverged         a run's recorded steps no longer match its agent's code
     │                               (it changed since the run started): the replay stops
     ├── OutputInvalid               the model's answers never matched the agent's output type
     ├── ChildRunEnded               a child run (an agent used as a tool) ended other than done
     │                               (`run_child`; as a tool's error, its parent model reads it)
     ├── StoreUnavailable            the durable store stopped answering; what it recorded is
     │                               kept, and the run goes on once it answers (resume)
     └── ProviderError               the model call failed: .status .error_type .message
          │                          .retryable .retry_after
          ├── ProviderConnectionError   could not connect, or the connection dropped
          ├── ProviderTimeout           connect or read timeout
          ├── ProviderStatusError       the server answered with an HTTP error status
          │    ├── RateLimited          429
          │    ├── ServerError          5xx (and 529 "overloaded")
          │    └── ClientRequestError   other 4xx: 400, 401, 403, 404 ...
          ├── ProviderProtocolError     a reply we cannot read: bad JSON, a stream cut short
          └── ImagesUnsupported         the model cannot read images, and the request has some

Tool failures are not exceptions of this tree: they become error results for the model.
A `RuntimeError` from `known` is none of these either: it is a bug in Tether, to report.
"""

from __future__ import annotations

from typing import Any


class TetherError(Exception):
    """Base of every error Tether raises on purpose."""


class ConfigError(TetherError):
    """Bad usage or configuration: fix the command or the settings."""


class MissingAPIKey(ConfigError):
    """A model needs an API key and none was given nor found in `variable` (named, never its
    value)."""

    def __init__(self, variable: str, provider: str) -> None:
        super().__init__(
            f"{variable} is not set: export it to use the {provider} provider "
            "(or run offline with --provider local, the bundled model)"
        )
        self.variable = variable


class RunError(TetherError):
    """The runtime was asked for something it cannot do."""


class RunExists(RunError):
    """A live run already has this id (at most one live run per id)."""


class NoSuchRun(RunError, KeyError):
    """No run has this id (in this runtime, or in its store)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such run"


class RunEnded(RunError):
    """The run is over: it takes no more messages, approvals or cancels."""


class AccountOverBudget(RunError):
    """A new run of an account over one of its limits, where the limit refuses new runs
    (`accounts.Limits.when_over`): nothing was started or recorded."""


class ApprovalError(RunError):
    """An approval that cannot be given: unknown, already decided, or for other arguments."""


class RecordError(TetherError):
    """A store's record that is not one Tether wrote: another format, or values that are not
    what its type holds. Nothing of it was run or used."""


class ReplayDiverged(RecordError):
    """A durable run's recorded step is of another kind than its agent's code now takes (the
    code changed since the run started): the replay stops there rather than pair recorded
    answers with other questions. Run the run under the version it started with (`tether
    upgrade` says which), or fork it."""


class QuestionError(RunError):
    """No question by that id waits for an answer (answered already, or never asked), or the
    answer does not fit what was asked."""


class ChildRunEnded(TetherError):
    """A child run ended other than `done`: its id, outcome and reason, for its parent."""


class StoreUnavailable(TetherError):
    """The durable store did not answer for the runtime's patience (`store_patience`): the
    runs this process executes stop waiting for it and end `failed` here, with this error.
    Nothing they completed is lost; the store keeps them, and they go on from there when it
    answers again (`tether resume`, or a worker puts them back on its queue)."""

    kind = "store_unavailable"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "status": None, "message": str(self), "retryable": True}


class OutputInvalid(TetherError):
    """The model's final answer did not match the agent's output type, as many times as the
    run allows (`output.OUTPUT_TRIES`): the run ends `failed` with this error."""

    kind = "output_invalid"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "status": None, "message": str(self), "retryable": False}


class ProviderError(TetherError):
    """A model call failed. `retryable` says whether the same request may succeed later."""

    kind = "provider_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error_type: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.retryable = retryable
        self.retry_after = retry_after

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "status": self.status,
            "error_type": self.error_type,
            "message": self.message,
            "retryable": self.retryable,
        }


class ProviderConnectionError(ProviderError):
    """Could not connect to the model's server, or the connection dropped (retried)."""

    kind = "connection"


class ProviderTimeout(ProviderError):
    """The connect time-out or the read time-out (the longest silence in a reply) passed."""

    kind = "timeout"


class ProviderStatusError(ProviderError):
    """The server answered with an HTTP error status (or an error body carrying one)."""

    kind = "http_status"


class RateLimited(ProviderStatusError):
    """429: too many requests; retried, honouring `Retry-After` up to 60 s."""

    kind = "rate_limited"


class ServerError(ProviderStatusError):
    """5xx, or 529 'overloaded': the server's fault; retried, and a fallback model's cue."""

    kind = "server_error"


class ClientRequestError(ProviderStatusError):
    """Another 4xx (400, 401, 403, 404 ...): the request's fault; never retried."""

    kind = "client_error"


class ProviderProtocolError(ProviderError):
    """A reply that cannot be read: bad JSON, a stream cut short, the wrong content type."""

    kind = "protocol"


class ImagesUnsupported(ProviderError):
    """Raised before the request is sent: dropping the images silently would have the model
    answer about a picture it never saw."""

    kind = "images_unsupported"


def status_error(
    status: int, message: str, error_type: str | None, retry_after: float | None
) -> ProviderStatusError:
    """The exception for an HTTP error status; 408, 409, 429 and 5xx may succeed on a retry."""
    cls: type[ProviderStatusError]
    if status == 429:
        cls = RateLimited
    elif status >= 500:
        cls = ServerError
    else:
        cls = ClientRequestError
    retryable = status in (408, 409, 429) or status >= 500
    return cls(
        message, status=status, error_type=error_type, retryable=retryable, retry_after=retry_after
    )


def error_status(err: dict[str, Any]) -> int | None:
    """The HTTP status an error object names (`status`, or a number in `code`), if any."""
    for key in ("status", "code"):
        value = err.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


TRANSIENT_TYPES = {
    "rate_limit_exceeded": RateLimited,
    "rate_limit_error": RateLimited,
    "overloaded_error": ServerError,
    "api_error": ServerError,
    "server_error": ServerError,
    "internal_error": ServerError,
}


def error_kind(err: dict[str, Any]) -> str | None:
    """What kind of error an error object names: its `type`, or, when that is only "error"
    (a Responses error event), its `code`; a gateway's `code` beside a type is a detail."""
    named = err.get("type") if err.get("type") not in (None, "error") else err.get("code")
    return named if isinstance(named, str) else None


# the error types (and Responses' codes) that blame the request, when no status says so
REQUEST_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "invalid_prompt",
    "context_length_exceeded",
}


def stream_error(
    error_type: str | None, message: str, emitted: bool, status: int | None = None
) -> ProviderError:
    """An error reported inside a reply (an `error` event, a failed response). Transient ones
    (rate limits, overload, server errors) may be retried, but only while nothing was emitted.
    An error that carries its own HTTP status (a gateway's, at status 200) is classed by it."""
    if status is not None and 400 <= status < 600:
        e = status_error(status, message, error_type, None)
        e.retryable = e.retryable and not emitted
        return e
    if error_type in REQUEST_TYPES:  # the request's fault: the same request fails again
        return ClientRequestError(message, error_type=error_type, retryable=False)
    cls = TRANSIENT_TYPES.get(error_type or "")
    if cls is None:
        return ProviderProtocolError(message, error_type=error_type, retryable=False)
    return cls(message, error_type=error_type, retryable=not emitted)


def known[T](value: T | None, what: str) -> T:
    """`value`, which the code's own order sets before this point (`what` names it): an
    `assert` said so before, which `python -O` removes, leaving an AttributeError further on.
    A RuntimeError that names the broken promise if it is None (a bug in Tether)."""
    if value is None:
        raise RuntimeError(f"bug in Tether: {what} is not set here")
    return value
