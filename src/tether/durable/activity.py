"""What a store's runs did over a recent window, for the page's dashboard: when runs were
created, how and when they ended (outcome, reason, tokens, cost), and how long each model call
took. Read through the process's client of the store (`view.client`), never executing a run.

Each read is capped (`LIMIT`): a day of a busy store is summed from its most recent 20,000
runs and 5,000 model calls, and the dashboard says so when a cap was reached.
"""

from __future__ import annotations

import datetime
from typing import Any

from ..dashboard import Ended
from .steps import MODEL, ModelStep
from .steps import read as read_step
from .view import ENDED, WORKFLOW, listing

LIMIT = {"runs": 20_000, "model_calls": 5_000}


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()


def started_since(store: Any, since: float) -> list[float]:
    """When the runs created since `since` were created (queued or started), Unix time."""
    found = store.list_workflows(
        name=WORKFLOW,
        start_time=iso(since),
        load_input=False,
        load_output=False,
        sort_desc=True,
        limit=LIMIT["runs"],
    )
    return [(w.created_at or 0) / 1000 for w in found]


def ended_since(store: Any, since: float) -> list[Ended]:
    """The runs that ended since `since`: when, how, why, and what they used."""
    found = store.list_workflows(
        name=WORKFLOW,
        status=list(ENDED),
        completed_after=iso(since),
        load_input=False,
        sort_desc=True,
        limit=LIMIT["runs"],
    )
    ended = []
    for w in found:
        row = listing(w)
        out = w.output if isinstance(w.output, dict) else {}
        reason = out.get("reason") or (str(w.error).split("\n", 1)[0] if w.error else "")
        ended.append(Ended.of(row["ended_at"] or 0.0, row["state"], reason, row))
    return ended


def model_seconds_since(store: Any, since: float) -> list[float]:
    """How long each model call recorded since `since` took, in seconds."""
    took = []
    for output in store.ledger.recent_steps(MODEL, since, LIMIT["model_calls"]):
        step = read_step(MODEL, output, "a model step")
        if isinstance(step, ModelStep):
            took.append(max(0.0, step.ended - step.began))
    return took
