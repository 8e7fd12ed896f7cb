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
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from .errors import ApprovalError
from .messages import ToolCall

Policy = Literal["never", "always"] | Callable[[dict[str, Any]], bool]


def needs_approval(policy: Policy, arguments: dict[str, Any] | None) -> bool:
    if policy == "never":
        return False
    if policy == "always":
        return True
    assert callable(policy)
    return bool(policy(arguments or {}))


def arguments_hash(name: str, arguments: dict[str, Any] | None) -> str:
    """A stable hash of a tool name and its exact arguments (keys sorted)."""
    blob = orjson.dumps({"name": name, "arguments": arguments}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    id: str
    call: ToolCall
    args_hash: str
    expires_at: float | None = None  # wall-clock seconds

    @classmethod
    def for_call(cls, call: ToolCall, ttl: float | None) -> ApprovalRequest:
        return cls(
            f"ap_{uuid.uuid4().hex[:12]}",
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
        if entry is not None and entry[1].done() and not entry[1].cancelled():
            given = entry[1].result()  # decided a moment ago, not yet taken by the run
        if given is not None:
            raise decided_already(approval_id, given.approved, given.reason)
        if entry is None or entry[1].done():
            raise ApprovalError(f"no approval {approval_id!r} is waiting (decided or expired)")
        request, future = entry
        if args_hash is not None and args_hash != request.args_hash:
            raise ApprovalError(f"approval {approval_id!r} was shown other arguments")
        future.set_result(Decision(approved, reason or ("approved" if approved else "denied")))

    def waiting(self) -> list[ApprovalRequest]:
        return [request for request, _ in self.pending.values()]
