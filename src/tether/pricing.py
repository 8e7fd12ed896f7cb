"""Prices per million tokens, per model, for cost accounting and the `--max-cost` budget.

The table is a default; `--prices FILE` (JSON: {"model": {"input": 2.0, "cached_input": 0.5,
"output": 8.0}}) overrides or extends it. A model with no known price costs nothing, so a cost
budget refuses to start for it rather than pretend (see `cli`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from .errors import ConfigError
from .messages import Usage


@dataclass(frozen=True, slots=True)
class Price:
    """What a model costs, in USD per million tokens: input, cached input and output. Used
    for `cost_usd` and the `max_cost_usd` budget."""

    input: float
    cached_input: float
    output: float

    def cost(self, usage: Usage) -> float:
        fresh = usage.input_tokens - usage.cached_input_tokens
        return (
            fresh * self.input
            + usage.cached_input_tokens * self.cached_input
            + usage.output_tokens * self.output
        ) / 1_000_000


PRICES: dict[str, Price] = {
    "gpt-5": Price(1.25, 0.125, 10.0),
    "gpt-5-mini": Price(0.25, 0.025, 2.0),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "gpt-4.1": Price(2.0, 0.50, 8.0),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40),
    "gpt-4o": Price(2.50, 1.25, 10.0),
    "gpt-4o-mini": Price(0.15, 0.075, 0.60),
    "o3": Price(2.0, 0.50, 8.0),
    "o4-mini": Price(1.10, 0.275, 4.40),
    "claude-opus-4-1": Price(15.0, 1.50, 75.0),
    "claude-sonnet-4-5": Price(3.0, 0.30, 15.0),
    "claude-haiku-4-5": Price(1.0, 0.10, 5.0),
    "scripted": Price(0.0, 0.0, 0.0),
    "smollm2-135m-instruct": Price(0.0, 0.0, 0.0),
}


def price_for(model: str, table: dict[str, Price] | None = None) -> Price | None:
    """The price of `model`; a dated or suffixed name (`gpt-4.1-2025-04-14`) falls back to its
    longest known prefix."""
    table = PRICES if table is None else table
    if model in table:
        return table[model]
    base = re.sub(r"-\d{4}-\d{2}-\d{2}$|-\d{8}$|-latest$", "", model)
    candidates = [m for m in table if base == m or base.startswith(m + "-")]
    return table[max(candidates, key=len)] if candidates else None


def load_prices(path: str | Path) -> dict[str, Price]:
    """The default table with the entries of a JSON price file laid over it."""
    try:
        raw = orjson.loads(Path(path).read_bytes())
        table = dict(PRICES)
        for model, p in raw.items():
            table[model] = Price(
                float(p["input"]), float(p.get("cached_input", p["input"])), float(p["output"])
            )
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise ConfigError(f"cannot read prices from {path}: {type(e).__name__}: {e}") from None
    return table
