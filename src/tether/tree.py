"""One budget for a tree of runs: what a run and its descendants may still spend.

    lead (max_steps=9) ── researcher ×8 (2 calls each wanted)  ->  exactly 9 model requests

An agent used as a tool (`Agent.as_tool`) starts a child run, and a child can start its own.
Every run of the tree has an `Allowance`: its own budget's limits, what it and its descendants
have spent, and its parent's allowance. Before each model call the driver reserves the call
against the run's allowance and every ancestor's at once (`reserve`), so parallel children can
never overshoot the root's limit: peers that check after the fact let a limit of 9 tool calls
with 8 parallel children make 16 (pydantic-ai-harness#696). Asyncio runs one thing at a time,
so a reservation is a plain check-then-add with no await between. Tokens and cost are known
only when a call ends: each is charged to every ancestor then (`charge`), and a limit that
is reached refuses the next call of every run below it.

Values only: no I/O, no clock of its own (the driver passes `now`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .messages import Usage


@dataclass(eq=False)
class Allowance:
    """A run's share of its tree's budget. None for a limit means none of the run's own (its
    ancestors' still hold)."""

    run_id: str
    max_calls: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    parent: Allowance | None = None
    calls: int = 0
    """Model calls reserved by this run and its descendants (a reserved call counts even if it
    then fails: it reached the model)."""
    tokens: int = 0
    """Tokens used by this run and its descendants (input and output: what `max_tokens`
    counts; a sum, not a `Usage` made again at every charge)."""
    cost_usd: float = 0.0
    held: int = 0
    """Tokens expected by calls reserved with an estimate and not yet charged (a tool's model
    calls on the run's behalf, which may be made side by side): counted as used meanwhile."""

    def chain(self) -> list[Allowance]:
        """This allowance, then its parent's, up to the root's (a list: a generator was made
        and run down three times per model call)."""
        nodes = [self]
        while (parent := nodes[-1].parent) is not None:
            nodes.append(parent)
        return nodes

    @property
    def root(self) -> Allowance:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def refusal(self, tokens: int = 0) -> str:
        """Why this allowance has no room for another model call, or ""; `tokens`, if given,
        is what the call is expected to use (a call that would pass the limit is refused)."""
        if self.max_calls is not None and self.calls >= self.max_calls:
            return (
                f"max_steps: {self.calls} model calls made by run {self.run_id} and the runs "
                f"it started, the limit is {self.max_calls}"
            )
        total = self.tokens + self.held
        if self.max_tokens is not None and (
            total >= self.max_tokens or total + tokens > self.max_tokens
        ):
            return (
                f"max_tokens: {total} used by run {self.run_id} and the runs it started, "
                f"the limit is {self.max_tokens}"
            )
        if self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd:
            return (
                f"max_cost: ${self.cost_usd:.4f} spent by run {self.run_id} and the runs it "
                f"started, the limit is ${self.max_cost_usd:g}"
            )
        return ""

    def reserve(self, tokens: int = 0) -> str:
        """Reserve one model call against this allowance and every ancestor's; "" when it is
        reserved, else why not (then nothing is reserved anywhere)."""
        chain = self.chain()
        for node in chain:
            reason = node.refusal(tokens)
            if reason:
                return reason
        for node in chain:
            node.calls += 1
            node.held += tokens
        return ""

    def release(self, tokens: int) -> None:
        """Let go of what `reserve(tokens)` held, once the call is charged or not made."""
        for node in self.chain():
            node.held -= tokens

    def charge(self, usage: Usage, cost_usd: float) -> None:
        """Count what a finished call used against this allowance and every ancestor's."""
        tokens = usage.total_tokens
        for node in self.chain():
            node.tokens += tokens
            node.cost_usd += cost_usd


UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def child_run_id(parent_run_id: str, call_id: str | None, fallback: str) -> str:
    """The id of the child run a tool call starts: the parent's id and the call's, so the same
    call of the same run always names the same child (a replay finds it again). Characters a
    run id cannot hold become `-`; over 128 characters, the end is kept."""
    name = f"{parent_run_id}.{UNSAFE.sub('-', call_id or fallback)}"
    return name if len(name) <= 128 else name[-128:].lstrip("._:-")
