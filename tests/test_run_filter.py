"""A page of runs held in memory (the page's list of `tether serve` without a store): the
filter, the order and the cursor that the store's pages share (`durable/view.page_runs`,
tested over 2,000 stored runs in test_web)."""

from __future__ import annotations

from typing import Any

import pytest

from tether.errors import ConfigError
from tether.run_filter import Cursor, RunFilter, check_limit, page_of


def run(n: int, status: str = "done", agent: str = "cli", at: int | None = None) -> Any:
    s = {"id": f"run-{n:03d}", "status": status, "task": f"task {n}", "agent": agent}
    return Cursor(n if at is None else at, s["id"]), s


def test_pages_hold_the_newest_first_and_the_cursor_goes_on_without_repeats() -> None:
    runs = [run(n) for n in range(120)]
    seen: list[str] = []
    after = None
    while True:
        page = page_of(runs, RunFilter(), after, 50)
        seen += [s["id"] for s in page.rows]
        if page.next is None:
            break
        after = Cursor.decode(page.next.encode())  # as the page sends it back
    assert seen == [f"run-{n:03d}" for n in reversed(range(120))]


def test_runs_created_in_one_millisecond_keep_one_order_across_pages() -> None:
    runs = [run(n, at=7) for n in range(5)]
    first = page_of(runs, RunFilter(), None, 2)
    rest = page_of(runs, RunFilter(), first.next, 10)
    ids = [s["id"] for s in first.rows + rest.rows]
    assert sorted(ids) == [f"run-{n:03d}" for n in range(5)] and len(set(ids)) == 5
    assert rest.next is None


def test_a_page_that_ends_the_list_has_no_cursor() -> None:
    runs = [run(n) for n in range(4)]
    assert page_of(runs, RunFilter(), None, 4).next is None
    assert page_of(runs, RunFilter(), None, 3).next == Cursor(1, "run-001")


def test_the_filter_keeps_states_an_agent_and_text_in_any_case() -> None:
    runs = [run(0, "done"), run(1, "failed", "researcher"), run(2, "waiting"), run(3, "done")]
    states = RunFilter(states=frozenset({"done", "waiting"}))
    assert [s["id"] for s in page_of(runs, states, None, 50).rows] == [
        "run-003",
        "run-002",
        "run-000",
    ]
    assert [s["id"] for s in page_of(runs, RunFilter(agent="researcher"), None, 50).rows] == [
        "run-001"
    ]
    assert [s["id"] for s in page_of(runs, RunFilter(text="TASK 2"), None, 50).rows] == ["run-002"]
    assert [s["id"] for s in page_of(runs, RunFilter(text="search"), None, 50).rows] == [
        "run-001"  # the agent's name
    ]
    assert page_of(runs, RunFilter(text="nothing"), None, 50).rows == []


@pytest.mark.parametrize(
    "text",
    [
        "nonsense",
        "WzEsMl0=",
        "e30=",
        *[
            "WzEwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAsICJ4Il0=",
            "Wy0xLCAieCJd",
            "W3RydWUsICJ4Il0=",
            "WzEsICJ4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eCJd",
        ],
    ],
)  # the last: out of range (a store's query failed with a 500), a bool, a 2,000-char id
def test_a_cursor_no_page_gave_is_refused_by_name(text: str) -> None:
    with pytest.raises(ConfigError, match="is not one a page gave"):
        Cursor.decode(text)


def test_a_page_holds_one_to_five_hundred_runs() -> None:
    assert check_limit(1) == 1 and check_limit(500) == 500
    for bad in (0, 501, -3):
        with pytest.raises(ConfigError, match="a page holds 1 to 500 runs"):
            check_limit(bad)


def test_the_inbox_pages_oldest_first_by_the_same_cursor() -> None:
    runs = [run(n, "waiting" if n % 2 else "done") for n in range(7)]
    waiting = RunFilter(states=frozenset({"waiting"}))
    first = page_of(runs, waiting, None, 2, oldest_first=True)
    assert [s["id"] for s in first.rows] == ["run-001", "run-003"]
    rest = page_of(runs, waiting, first.next, 2, oldest_first=True)
    assert [s["id"] for s in rest.rows] == ["run-005"] and rest.next is None


async def test_runs_started_one_after_the_other_page_in_that_order_in_memory() -> None:
    """A server without a store keys its runs by their first event's time: in milliseconds,
    two runs started within one were listed by id, so the inbox's "oldest first" gave a later
    run first (a test of the page saw it under load). Now the time is microseconds: the runs
    come in the order they started, whatever their ids."""
    from tether import Agent, ScriptedModel, reply
    from tether.memory_view import MemoryView
    from tether.supervisor import Supervisor

    sup = Supervisor()
    ids = ["run-z", "run-m", "run-a"]  # started in this order, ids sorted the other way
    for run_id in ids:
        sup.start(Agent(ScriptedModel([reply("ok")])), "go", run_id=run_id)
    for run_id in ids:
        await sup.get(run_id).wait()
    view = MemoryView(sup)
    oldest = view.page(RunFilter(), None, 10, oldest_first=True)
    assert [s["id"] for s in oldest.rows] == ids
    newest = view.page(RunFilter(), None, 2)
    assert [s["id"] for s in newest.rows] == ids[:0:-1]
    rest = view.page(RunFilter(), Cursor.decode(newest.next.encode()), 2)  # type: ignore[union-attr]
    assert [s["id"] for s in rest.rows] == ids[:1]
