"""A run's events as a readable transcript, and as an ATIF trajectory (Harbor's Agent Trajectory
Interchange Format, v1.4): one step per user message and per model reply, with the tool calls of
a reply and their results as its observation."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import orjson

from .events import Event
from .tree import child_run_id
from .version import __version__

ATIF_VERSION = "ATIF-v1.4"


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def atif(events: list[Event], agent_name: str = "tether") -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}  # tool call id -> the agent step that made it
    model = ""
    final: dict[str, Any] = {}
    for e in events:
        d = e.data
        if e.type == "run_started":
            model = model or d.get("model", "")
            if d.get("task"):
                steps.append({"source": "user", "message": d["task"], "timestamp": iso(e.ts)})
        elif e.type == "user_message":
            steps.append({"source": "user", "message": d["text"], "timestamp": iso(e.ts)})
        elif e.type == "model_response":
            usage = d.get("usage") or {}
            step: dict[str, Any] = {
                "source": "agent",
                "message": d.get("text", ""),
                "timestamp": iso(e.ts),
                "model_name": model,
                "metrics": {
                    "prompt_tokens": usage.get("input_tokens", 0),
                    "completion_tokens": usage.get("output_tokens", 0),
                    "cached_tokens": usage.get("cached_input_tokens", 0),
                    "extra": {"reasoning_tokens": usage.get("reasoning_tokens", 0)},
                },
            }
            if d.get("tool_calls"):
                step["tool_calls"] = [
                    {
                        "tool_call_id": c["id"],
                        "function_name": c["name"],
                        "arguments": c.get("arguments") or {},
                    }
                    for c in d["tool_calls"]
                ]
                for c in d["tool_calls"]:
                    calls[c["id"]] = step
            steps.append(step)
        elif e.type == "tool_result":
            owner = calls.get(d["id"])
            if owner is not None:
                results = owner.setdefault("observation", {"results": []})["results"]
                result: dict[str, Any] = {"source_call_id": d["id"], "content": d["output"]}
                if d.get("is_error"):
                    result["extra"] = {"is_error": True}
                results.append(result)
        elif e.type == "run_finished":
            final = d
    for i, step in enumerate(steps, 1):
        step["step_id"] = i
    usage = final.get("usage") or {}
    trajectory: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": events[0].run_id if events else "",
        "agent": {"name": agent_name, "version": __version__, "model_name": model},
        "steps": [dict(sorted(s.items(), key=lambda kv: kv[0] != "step_id")) for s in steps],
        "final_metrics": {
            "total_prompt_tokens": usage.get("input_tokens", 0),
            "total_completion_tokens": usage.get("output_tokens", 0),
            "total_cached_tokens": usage.get("cached_input_tokens", 0),
            "total_cost_usd": final.get("cost_usd", 0.0),
            "total_steps": len(steps),
            "extra": {
                "outcome": final.get("outcome", "unfinished"),
                "reason": final.get("reason", ""),
            },
        },
    }
    return trajectory


def readable(
    events: list[Event],
    children: Callable[[str], list[Event] | None] | None = None,
    indent: str = "",
) -> str:
    """The run as a person reads it: who said what, which tools ran with what result.
    `children` gives the events of a child run by its id (an agent used as a tool, see
    `tree`), shown nested before the result of the call that started it."""
    lines: list[str] = []
    for e in events:
        d = e.data
        if e.type == "run_started" and d.get("task"):
            lines.append(f"user: {d['task']}")
            lines.extend(f"  {image_line(i)}" for i in d.get("images", ()))
        elif e.type == "user_message":
            lines.append(f"user: {d['text']}")
        elif e.type == "model_response" and d.get("text"):
            lines.append(f"assistant: {d['text']}")
        elif e.type == "tool_call":
            lines.append(f"  → {d['name']}({orjson.dumps(d.get('arguments') or {}).decode()})")
        elif e.type == "tool_result":
            child_id = child_run_id(e.run_id, d.get("id"), "")
            child = children(child_id) if children is not None and d.get("id") else None
            if child:
                lines.append(f"    [{child_id}]")
                lines.append(readable(child, children, "    "))
            mark = "✗" if d.get("is_error") else "←"
            lines.append(f"  {mark} {d['output'].rstrip()}")
            lines.extend(f"    {image_line(i)}" for i in d.get("images", ()))
        elif e.type == "upgraded":
            lines.append(f"[upgraded from version {d.get('from')} to {d.get('to')}]")
        elif e.type == "run_finished":
            lines.append(f"[{d.get('outcome')}] {d.get('reason') or ''}".rstrip())
    return "\n".join(indent + line if indent else line for line in "\n".join(lines).split("\n"))


def image_line(image: dict[str, Any]) -> str:
    """An image as a transcript names it (events carry no image's bytes)."""
    size = f", {image['bytes']} bytes" if "bytes" in image else ""
    return f"[image {image.get('media_type')}{size}, sha256 {str(image.get('sha256'))[:12]}]"
