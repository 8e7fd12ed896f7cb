"""What the page shows of a run: a summary (its status, steps, tokens, cost, answer) folded from
its events or read from a store's listing, and its messages as JSON."""

from __future__ import annotations

from typing import Any

from .dashboard import Ended
from .events import Event
from .messages import Message, TextPart, ToolCall, ToolResult
from .tally import Tally


def row_summary(row: dict[str, Any]) -> dict[str, Any]:
    """A store's listing of a run (`store.listing`) in the shape of `summary`."""
    usage = row.get("usage") or {}
    return {
        "id": row["id"],
        "task": row["task"],
        "status": row["state"],
        "steps": row.get("steps") or 0,
        "tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
        "cost_usd": row.get("cost_usd") or 0.0,
        "answer": row.get("answer") or "",
        "started": row.get("started_at"),
        "queued_at": row.get("queued_at"),
        "usage": row.get("usage"),
        "model": "",
        "agent": row.get("agent"),
        "account": row.get("account"),
        "version": row.get("version"),
        "worker": row.get("worker"),
        "waiting_for_version": row.get("waiting_for_version"),
    }


def first_us(events: list[Event]) -> int:
    """When a run held in memory was created, in microseconds: its key in a page's order. In
    milliseconds, two runs a page started within one were listed in either order."""
    return int(events[0].ts * 1_000_000) if events else 0


def summarize(events: list[Event]) -> dict[str, Any]:
    s: dict[str, Any] = {
        "task": "",
        "status": "queued",
        "steps": 0,
        "tokens": 0,
        "cost_usd": 0.0,
        "answer": "",
        "started": None,
        "usage": None,
        "model": "",
        "agent": None,
        "account": None,
        "version": None,
        "parent_run_id": None,
    }
    tally = Tally()  # steps, tokens and cost as the run counts them, while it goes on too
    end: dict[str, Any] | None = None
    for e in events:
        tally(e)
        d = e.data
        if e.type == "run_started":
            s["parent_run_id"] = d.get("parent_run_id")  # a child run (an agent as a tool)
            s["task"] = s["task"] or (d.get("task") or "")
            s["model"] = d.get("model", "")
            s["agent"], s["version"] = d.get("agent"), d.get("version")
            s["account"] = d.get("account")
            s["started"] = s["started"] or e.ts
            s["status"] = "running"
        elif e.type == "run_finished":
            s["status"] = d.get("outcome", "done")
            s["answer"] = d.get("answer", "")
            s["usage"] = d.get("usage")
            end = d
    s["steps"], s["tokens"], s["cost_usd"] = tally.steps, tally.tokens, tally.cost
    if end is not None:  # the run's own figures at its end (priced by its own table)
        s["cost_usd"] = end.get("cost_usd", tally.cost)
        s["steps"] = end.get("steps", tally.steps)
    return s


def message_dict(m: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, TextPart):
            parts.append({"type": "text", "text": p.text})
        elif isinstance(p, ToolCall):
            parts.append(
                {"type": "tool_call", "id": p.id, "name": p.name, "arguments": p.arguments}
            )
        elif isinstance(p, ToolResult):
            parts.append(
                {
                    "type": "tool_result",
                    "id": p.call_id,
                    "name": p.name,
                    "output": p.output,
                    "is_error": p.is_error,
                }
            )
    return {"role": m.role, "parts": parts}


def activity(events: list[Event]) -> tuple[float | None, Ended | None, list[float]]:
    """What the dashboard counts of a run held in memory: when it was created, how it ended
    (None: it has not), and how long each of its model calls took (seconds)."""
    created = events[0].ts if events else None
    ended, took, asked = None, [], None
    for e in events:
        if e.type == "model_request":
            asked = e.ts
        elif e.type == "model_response" and asked is not None:
            took.append(e.ts - asked)
            asked = None
        elif e.type == "run_finished":
            d = e.data
            ended = Ended.of(e.ts, d.get("outcome", "done"), d.get("reason") or "", d)
    return created, ended, took
