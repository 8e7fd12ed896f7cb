"""What a run's events add up to: its usage, its model calls (steps) and their cost, counted
from the events alone, as the loop counts them while the run goes on (`loop.step`).

One fold for every reader that has only the events: the page's and `tether runs`' live
figures (`summaries.summarize`), a durable run's end when it was cut short in the store, the
Harbor trajectory's running totals. They were four folds that disagreed: two left out what a
context summary and an MCP server's sampling cost, one counted the cost only at the end.

Counted: each `model_response`'s usage (a step), priced by the model that served it (with
fallback models, not always the run's); a `context_summarized` event's (the summary call) and
a `tool_result`'s (the run's model, asked by an MCP server), priced as the run's model.
"""

from __future__ import annotations

from typing import Any

from .events import Event
from .messages import Usage
from .pricing import Price, price_for


class Tally:
    """Feed it a run's events in order (`tally(event)`); read `usage`, `steps`, `cost`."""

    __slots__ = ("cost", "model", "price", "steps", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        self.steps = 0
        self.cost = 0.0
        self.model = ""
        self.price: Price | None = None

    def __call__(self, event: Event) -> None:
        kind = event.type
        if kind == "model_response":
            self.steps += 1
            self.add(event.data.get("usage"), event.data.get("model"))
        elif kind == "tool_result" or kind == "context_summarized":
            self.add(event.data.get("usage"), None)
        elif kind == "run_started":
            self.model = str(event.data.get("model") or "")
            self.price = price_for(self.model)

    def add(self, usage: dict[str, Any] | None, model: str | None) -> None:
        if not usage:
            return
        used = Usage.from_dict(usage)
        self.usage = self.usage + used
        price = self.price if not model or model == self.model else price_for(model)
        if price is not None:
            self.cost += price.cost(used)

    @property
    def tokens(self) -> int:
        return self.usage.input_tokens + self.usage.output_tokens
