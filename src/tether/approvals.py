"""Approvals: a person (or a policy) decides a tool call before it runs.

A tool's `approval` policy says which calls need one: "never", "always", or a predicate on the
arguments. Each call that needs one gets its own request, named by an id and bound to the hash of
the exact arguments it was shown, so an approval can never be replayed onto different arguments.
An `Approver` answers requests: `approve_all` and `deny_all` for unattended runs, an
`ApprovalDesk` when a person decides later (the web page, `tether approve`), with expiry.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from .errors import ApprovalError, ConfigError
from .messages import ToolCall

Policy = Literal["never", "always"] | Callable[[dict[str, Any]], bool]


def needs_approval(policy: Policy, arguments: dict[str, Any] | None) -> bool:
    if policy == "never":
        return False
    if policy == "always":
        return True
    if not callable(policy):
        raise ConfigError(f"approval: {policy!r} is not 'never', 'always' or a function")
    return bool(policy(arguments or {}))


def arguments_hash(name: str, arguments: dict[str, Any] | None) -> str:
    """A stable hash of a tool name and its exact arguments (keys sorted)."""
    blob = orjson.dumps({"name": name, "arguments": arguments}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()


def approval_id(call_id: str) -> str:
    """The id of the approval a call waits for: one call, one approval, the same in memory
    and on a store, and after a restart (a call's id is unique in its run: `unique_calls`)."""
    return f"ap_{call_id}"


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    id: str
    call: ToolCall
    args_hash: str
    expires_at: float | None = None  # wall-clock seconds

    @classmethod
    def for_call(cls, call: ToolCall, ttl: float | None = None) -> ApprovalRequest:
        """The request for `call`, named by the call (`approval_id`), bound to its arguments,
        expiring after `ttl` seconds (None: a durable run's waits a day, `APPROVAL_WAIT_S`)."""
        return cls(
            approval_id(call.id),
            call,
            arguments_hash(call.name, call.arguments),
            time.time() + ttl if ttl else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "approval_id": self.id,
            "id": self.call.id,
            "name": self.call.name,
            "arguments": self.call.arguments or {},
            "args_hash": self.args_hash,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    approved: bool
    reason: str = ""

    def event(self, approval_id: str, call_id: str) -> dict[str, Any]:
        """The `approval_decided` event's data (in memory and on a store alike)."""
        return {
            "approval_id": approval_id,
            "id": call_id,
            "approved": self.approved,
            "reason": self.reason,
        }


Approver = Callable[[ApprovalRequest], Awaitable[Decision]]


async def approve_all(request: ApprovalRequest) -> Decision:
    """An approver that approves every call (`--approve auto`, `--yolo`)."""

    return Decision(True, "approved by policy (--approve auto)")


async def deny_all(request: ApprovalRequest) -> Decision:
    """An approver that denies every call (`--approve deny`); the model reads the reason."""

    return Decision(False, "denied by policy (--approve deny): no one is here to approve it")


def check_answer(
    approval_id: str, shown: str | None, decided: Decision | None, args_hash: str | None
) -> None:
    """Refuse an answer to approval `approval_id` (ApprovalError) unless it is taken: the one
    rule for a run in memory (`ApprovalDesk`), a durable run of this process and one answered
    from another (`tether approve`). `shown`: the hash of the arguments the waiting request
    showed (None: nothing waits); `decided`: how it was decided, if it was. A decision that
    came too late says how the call was decided."""
    if decided is not None:
        raise decided_already(approval_id, decided.approved, decided.reason)
    if shown is None:
        raise ApprovalError(
            f"approval {approval_id!r} is not waiting: it was never asked, or it expired"
        )
    if args_hash is not None and args_hash != shown:
        raise ApprovalError(f"approval {approval_id!r} was shown other arguments")


def decided_already(approval_id: str, approved: bool, reason: str) -> ApprovalError:
    """The error for a decision that came too late: it says how the call was decided, and
    by whom where the reason says (a page open in two tabs, a colleague at the inbox)."""
    how = "approved" if approved else "denied"
    return ApprovalError(f"approval {approval_id!r} was {how} already: {reason}")


@dataclass
class ApprovalDesk:
    """Requests wait here until someone decides them or they expire; how each was decided is
    kept for as long as the run, to answer a decision that comes too late."""

    ttl: float | None = None
    pending: dict[str, tuple[ApprovalRequest, asyncio.Future[Decision]]] = field(
        default_factory=dict
    )
    decided: dict[str, Decision] = field(default_factory=dict)

    async def __call__(self, request: ApprovalRequest) -> Decision:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.pending[request.id] = (request, future)
        try:
            timeout = None if request.expires_at is None else request.expires_at - time.time()
            async with asyncio.timeout(timeout):
                decision = await future
        except TimeoutError:
            decision = Decision(False, f"the approval expired after {self.ttl:g} s")
        finally:
            self.pending.pop(request.id, None)
        self.decided[request.id] = decision
        return decision

    def decide(
        self, approval_id: str, approved: bool, reason: str = "", args_hash: str | None = None
    ) -> None:
        """Approve or deny a waiting request. With `args_hash`, only if it names the arguments
        the request was made for."""
        entry = self.pending.get(approval_id)
        given = self.decided.get(approval_id)
        if entry is not None and entry[1].done():
            if not entry[1].cancelled():
                given = entry[1].result()  # decided a moment ago, not yet taken by the run
            entry = None
        check_answer(approval_id, entry[0].args_hash if entry else None, given, args_hash)
        if entry is not None:
            decision = Decision(approved, reason or ("approved" if approved else "denied"))
            entry[1].set_result(decision)

    def waiting(self) -> list[ApprovalRequest]:
        return [request for request, _ in self.pending.values()]
