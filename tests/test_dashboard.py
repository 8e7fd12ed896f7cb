"""The dashboard's figures from plain facts: which period each run falls in, the outcomes,
tokens and cost per period, the reasons of failures and halts, the latency percentiles (drawn
in a browser over a store's runs in test_web)."""

from __future__ import annotations

import pytest

from tether.dashboard import Ended, figures, percentile
from tether.errors import ConfigError

NOW = 10_000.0


def ended(ago: float, outcome: str, reason: str = "", tokens: int = 0, cost: float = 0.0) -> Ended:
    return Ended(NOW - ago, outcome, reason, tokens, cost)


def test_runs_fall_in_their_minute_of_the_last_hour_and_older_ones_in_none() -> None:
    f = figures("hour", NOW, [NOW - 5, NOW - 65, NOW - 3599, NOW - 3601, NOW + 1], [], [])
    assert len(f["started"]) == 60 and f["period_s"] == 60 and f["start"] == NOW - 3600
    assert f["started"][-1] == 1 and f["started"][-2] == 1 and f["started"][0] == 1
    assert sum(f["started"]) == 3  # an hour and a second ago, and a second ahead: in none


def test_ended_runs_count_by_outcome_with_their_tokens_and_cost_where_they_ended() -> None:
    runs = [
        ended(10, "done", tokens=100, cost=0.5),
        ended(20, "done", tokens=50, cost=0.25),
        ended(7300, "halted", "max_steps: 3", tokens=7),
        ended(5, "failed", "HTTP 400"),
        ended(5, "cancelled"),
    ]
    f = figures("day", NOW, [], runs, [])
    assert len(f["tokens"]) == 24
    assert f["ended"]["done"][-1] == 2 and f["tokens"][-1] == 150 and f["cost_usd"][-1] == 0.75
    assert f["ended"]["halted"][-3] == 1 and f["tokens"][-3] == 7  # two hours and more ago
    assert [sum(f["ended"][o]) for o in ("done", "halted", "failed", "cancelled")] == [2, 1, 1, 1]


def test_failures_and_halts_are_counted_by_reason_most_frequent_first() -> None:
    runs = [ended(1, "halted", "max_cost"), ended(2, "failed", "HTTP 500")]
    runs += [ended(3, "halted", "max_steps: 3")] * 3 + [ended(4, "failed", "")]
    f = figures("hour", NOW, [], [*runs, ended(5, "done", "answered")], [])
    assert f["reasons"][0] == {"outcome": "halted", "reason": "max_steps: 3", "runs": 3}
    assert {(r["outcome"], r["reason"], r["runs"]) for r in f["reasons"][1:]} == {
        ("halted", "max_cost", 1),
        ("failed", "HTTP 500", 1),
        ("failed", "(none given)", 1),
    }


def test_model_latency_is_given_as_nearest_rank_percentiles_in_milliseconds() -> None:
    f = figures("hour", NOW, [], [], [i / 1000 for i in range(1, 101)])
    assert f["model_ms"] == {"calls": 100, "p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert figures("hour", NOW, [], [], [])["model_ms"] == {
        "calls": 0,
        "p50": None,
        "p90": None,
        "p99": None,
    }
    assert percentile([3.0], 99) == 3.0


def test_a_window_other_than_an_hour_or_a_day_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="window 'week': use hour or day"):
        figures("week", NOW, [], [], [])
