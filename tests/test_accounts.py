"""Budgets per account (`accounts.py`): limits that hold across runs, processes and machines,
checked before each model call. What the model server is paid is counted where it is paid: at
the wire mock, from the usage it answered with, at the prices the runs were given."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env, store_runs, tether, wait_until
from tether import (
    AccountOverBudget,
    Agent,
    ConfigError,
    Limits,
    Price,
    RateLimited,
    RunContext,
    Runtime,
    ScriptedModel,
    tool,
)
from tether.accounts import Cost, MemoryAccounts, Standing, estimate, periods_at
from tether.messages import Message, ToolResult, Usage
from tether.providers.scripted import reply
from wire_server import WireServer, tool_results

PRICE = Price(1000.0, 1000.0, 1000.0)
"""$0.001 a token, in and out: a wire call of 50 in and 10 out costs $0.06."""
CALL = 0.06
PRICED: dict[str, Any] = {"prices": {"scripted": PRICE}, "max_output_tokens": 60}


# -- the rule, pure ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        {"cost_per_day": -1.0},
        {"cost_total": float("nan")},
        {"tokens_per_month": float("inf")},
        {"tokens_total": True},
        {"cost_per_month": "5"},
        {"when_over": "wait"},
    ],
)
def test_a_limit_that_is_not_a_number_of_zero_or_more_is_refused_by_name(
    given: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError, match=next(iter(given))):
        Limits(**given)


def test_a_limit_is_reached_by_what_is_spent_and_what_calls_in_flight_hold() -> None:
    limits = Limits(cost_per_day=1.0, tokens_total=1000)
    assert Standing("a", limits, {"day": Cost(0.5, 10)}, {"day": Cost(0.4, 10)}).refusal() == ""
    held = Standing("a", limits, {"day": Cost(0.5, 10)}, {"day": Cost(0.5, 10)}).refusal()
    assert held == (
        "account budget: a has spent $1.0000 today (with calls in flight), its limit is $1 a day"
    )
    spent = Standing("a", limits, {"total": Cost(0, 1000)}).refusal()
    assert spent == "account budget: a has used 1000 tokens in all, its limit is 1000 tokens in all"
    assert Standing("a", None, {"day": Cost(99, 99)}).refusal() == ""  # no limits: no refusal


def test_a_cost_limit_refuses_a_model_with_no_known_price() -> None:
    """A cost limit cannot be kept for calls whose dollars are unknown: they are refused, not
    counted as free. A tokens-only limit still counts them."""
    unpriced = estimate([Message.user("hi")], None, 10, None)
    assert not unpriced.priced and unpriced.usd == 0
    assert "no known price" in Standing("a", Limits(cost_total=5)).refusal(unpriced)
    assert Standing("a", Limits(tokens_total=50)).refusal(unpriced) == ""


def test_an_estimate_allows_for_the_whole_reply() -> None:
    got = estimate([Message.user("x" * 300)], "be brief", 100, PRICE)
    assert got.tokens == (300 + 4 + 8) // 3 + 1 + 100
    assert got.usd == pytest.approx(got.tokens * 0.001)
    assert estimate([Message.user("x")], None, None, PRICE).tokens > 1000  # no max: 1,024 out


def test_an_estimate_counts_the_tool_calls_and_results_in_the_request() -> None:
    """A request is its whole conversation: a tool result of 30,000 characters is about
    10,000 tokens in, as the model is sent it (the estimate counted only text)."""
    from tether.messages import ToolCall

    call = ToolCall("c1", "page", {"n": 1}, '{"n": 1}')
    messages = [
        Message.user("read the page"),
        Message("assistant", (call,)),
        Message("tool", (ToolResult("c1", "page", "y" * 30_000),)),
    ]
    assert estimate(messages, None, 100, PRICE).tokens >= 10_000 + 100


def test_concurrent_runs_with_long_tool_outputs_keep_their_accounts_token_limit() -> None:
    """Ten runs at once, each reading a page of 30,000 characters, then asking the model with
    it: each call holds its whole request's estimate, so the account's 40,000 tokens are
    passed by at most one call (they were passed many times over)."""
    from tether.tools.tool import tool as make_tool

    @make_tool
    def page(n: int) -> str:
        """A page."""
        return "y" * 30_000

    model = ScriptedModel([reply(tool_calls=[("page", {"n": 1})]), reply("read it")])
    respond = model.respond

    async def slow(request: Any, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)  # every run's call in flight at once
        return await respond(request, *args, **kwargs)

    model.respond = slow  # type: ignore[method-assign]
    agent = Agent(model, [page], name="reader", max_output_tokens=50)

    async def go() -> list[Any]:
        async with Runtime(agents=[agent]) as rt:
            await rt.set_limits("acme", Limits(tokens_total=40_000))
            handles = [
                await rt.start("reader", "read", context=RunContext(account_id="acme"))
                for _ in range(10)
            ]
            results = [await h.wait() for h in handles]
            standing = await rt.account("acme")
            assert standing.held["total"] == Cost()
            return results

    results = asyncio.run(go())
    used = sum(r.usage.total_tokens for r in results if r is not None)
    one_call = max(r.usage.total_tokens for r in results if r is not None)
    assert used <= 40_000 + one_call, used
    assert any(r is not None and r.outcome == "halted" for r in results)


def test_periods_are_utc_days_and_months() -> None:
    assert periods_at(1_764_806_399) == {"day": "2025-12-03", "month": "2025-12", "total": ""}
    assert periods_at(1_764_806_400) == {"day": "2025-12-04", "month": "2025-12", "total": ""}


def test_a_reservation_a_crash_left_counts_as_spent_when_the_call_is_made_again() -> None:
    """A call cut short may have been paid for, and nobody saw what it used: its estimate is
    counted, and the call made again reserves anew; its settlement takes its place. A call
    that held nothing (a summary) is added as it is."""

    async def go() -> None:
        book = MemoryAccounts()
        await book.set_limits("a", Limits(cost_total=1.0))
        assert await book.reserve("a", "r1", "step 0", Cost(0.4, 40)) == ""
        assert await book.reserve("a", "r1", "step 0", Cost(0.4, 40)) == ""  # made again
        now = await book.standing("a")
        assert (now.spent["total"], now.held["total"]) == (Cost(0.4, 40), Cost(0.4, 40))
        await book.settle("a", "r1", "step 0", Cost(0.1, 10))
        assert (await book.standing("a")).spent["total"] == Cost(0.5, 50)
        assert (await book.standing("a")).held["total"] == Cost()
        await book.settle("a", "r1", "summary 1", Cost(0.2, 20))  # never reserved
        assert (await book.standing("a")).spent["total"] == Cost(0.7, 70)

    asyncio.run(go())


# -- in memory: many runs of one account, at once ----------------------------------------------


@tool
def look(what: str) -> str:
    """Look something up."""
    return f"found {what}"


def looking_agent(turns: int = 6) -> Agent:
    """An agent whose every call uses 50 tokens in and 10 out ($0.06 at PRICE), `turns` calls
    of a tool and then an answer."""
    calls = [reply(tool_calls=[("look", {"what": "x"})], usage=Usage(50, 0, 10))] * turns
    model = ScriptedModel([*calls, reply("found it", usage=Usage(50, 0, 10))])
    return Agent(model, [look], name="looker", prices={"scripted": PRICE}, max_output_tokens=60)


def test_runs_at_once_in_memory_stop_at_their_accounts_limit_and_a_new_run_is_refused() -> None:
    """Twenty runs of one account at once, seven calls each wanted ($8.40 in all) and a limit
    of $1: at most one call past it is paid, every run ends done or halted by the account's
    budget, and a new run is refused before anything starts. Another account is untouched."""

    async def go() -> None:
        async with Runtime(agents=[looking_agent()]) as rt:
            await rt.set_limits("acme", Limits(cost_total=1.0))
            handles = [
                await rt.start("looker", "go", context=RunContext(account_id="acme"))
                for _ in range(20)
            ]
            results = [await h.wait() for h in handles]
            paid = sum(r.cost_usd for r in results if r is not None)
            assert 0.9 <= paid <= 1.0 + CALL + 1e-9  # short of it: estimates held at the end
            assert {r.outcome for r in results if r is not None} <= {"done", "halted"}
            halted = [r for r in results if r is not None and r.outcome == "halted"]
            assert halted and all(r.reason.startswith("account budget: acme ") for r in halted)
            standing = await rt.account("acme")
            assert standing.spent["total"].usd == pytest.approx(paid)
            assert standing.held["total"] == Cost()
            with pytest.raises(AccountOverBudget, match="the run was not started"):
                await rt.start("looker", "go", context=RunContext(account_id="acme"))
            named: list[Any] = []
            other = await rt.start(
                "looker",
                "go",
                context=RunContext(account_id="beta"),
                sinks=[lambda e: named.append(e.data) if e.type == "run_started" else None],
            )
            assert (await other.wait()).outcome == "done"  # type: ignore[union-attr]
            assert named[0]["account"] == "beta"  # its events say whose it is
            assert [s.account for s in await rt.accounts()] == ["acme", "beta"]

    asyncio.run(go())


def test_a_new_run_of_an_account_that_queues_waits_for_room_and_then_goes_on() -> None:
    """With `when_over="queue"` a new run over the limit starts, says it waits (`queued`, with
    the limit reached), makes no call, and goes on once the limit is raised."""

    async def go() -> None:
        async with Runtime(agents=[looking_agent(turns=1)]) as rt:
            await rt.set_limits("acme", Limits(tokens_total=1, when_over="queue"))
            first = await rt.start("looker", "go", context=RunContext(account_id="acme"))
            assert (await first.wait()).outcome == "halted"  # type: ignore[union-attr]
            queued = asyncio.Event()
            events: list[Any] = []

            def seen(e: Any) -> None:
                events.append(e)
                if e.type == "queued":
                    queued.set()

            second = await rt.start(
                "looker", "go", context=RunContext(account_id="acme"), sinks=[seen]
            )
            await queued.wait()
            waiting = next(e for e in events if e.type == "queued")
            assert waiting.data["what"] == "account" and "acme has used" in waiting.data["reason"]
            assert not any(e.type == "model_request" for e in events)
            await rt.set_limits("acme", Limits(tokens_total=10_000, when_over="queue"))
            result = await second.wait()
            assert result is not None and result.outcome == "done"
            assert [e.type for e in events].count("admitted") == 1

    asyncio.run(go())


def test_a_refused_call_costs_nothing_and_a_cancelled_one_its_estimate() -> None:
    """A call the server refused (an error status) was not paid for: nothing is counted. A
    call cancelled in flight may have been: its estimate is counted. Nothing stays held."""

    async def never(request: Any) -> Any:
        await asyncio.Event().wait()

    async def go() -> None:
        refused = Agent(
            ScriptedModel([RateLimited("slow down", status=429)]), name="refused", **PRICED
        )
        hanging = Agent(ScriptedModel([never]), name="hanging", **PRICED)
        async with Runtime(agents=[refused, hanging]) as rt:
            await rt.set_limits("acme", Limits(cost_total=10.0))
            acme = RunContext(account_id="acme")
            failed = await (await rt.start("refused", "go", context=acme)).wait()
            assert failed is not None and failed.outcome == "failed"
            assert (await rt.account("acme")).spent["total"] == Cost()
            asked = asyncio.Event()
            run = await rt.start(
                "hanging",
                "go",
                context=RunContext(account_id="acme"),
                sinks=[lambda e: asked.set() if e.type == "model_request" else None],
            )
            await asked.wait()
            run.cancel()
            assert (await run.wait()).outcome == "cancelled"  # type: ignore[union-attr]
            standing = await rt.account("acme")
            expected = estimate([Message.user("go")], None, 60, PRICE)
            assert standing.spent["total"] == Cost(expected.usd, expected.tokens)
            assert standing.held["total"] == Cost()

    asyncio.run(go())


def test_runs_waiting_for_their_accounts_room_leave_their_slots_to_other_accounts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two slots for runs (a page's server's `max_runs`), both taken by runs of an account
    over a limit that says to queue: a run of another account starts and ends meanwhile (it
    waited behind them for as long as they waited); raised, the account's runs go on."""
    from tether import paying

    monkeypatch.setattr(paying, "QUEUE_POLL_S", 0.05)

    async def go() -> None:
        async with Runtime(agents=[looking_agent(turns=0)], max_runs=2) as rt:
            await rt.set_limits("acme", Limits(tokens_total=0, when_over="queue"))
            waiting = [
                await rt.start("looker", "go", context=RunContext(account_id="acme"))
                for _ in range(2)
            ]
            other = await rt.start("looker", "go", context=RunContext(account_id="beta"))
            done = await asyncio.wait_for(other.wait(), 10)
            assert done is not None and done.outcome == "done"
            assert all(h.alive for h in waiting)  # still waiting for their room
            await rt.set_limits("acme", Limits(tokens_total=10_000, when_over="queue"))
            ended = [await asyncio.wait_for(h.wait(), 10) for h in waiting]
            assert [r.outcome for r in ended if r is not None] == ["done", "done"]

    asyncio.run(go())


def test_a_bad_account_name_is_refused_before_anything_starts() -> None:
    async def go() -> None:
        async with Runtime(agents=[looking_agent()]) as rt:
            with pytest.raises(ConfigError, match="an account is"):
                await rt.start("looker", "go", context=RunContext(account_id="a b"))
            with pytest.raises(ConfigError, match="an account is"):
                await rt.set_limits("", Limits(cost_total=1))
            assert rt.runs == {}

    asyncio.run(go())


# -- the command line, on a SQLite store ---------------------------------------------------------


def test_tether_limits_and_run_account_on_sqlite(wire: WireServer, tmp_path: Path) -> None:
    """`tether limits set`, then runs of the account until one halts (exit 3, `account
    budget`) and the next is refused (exit 3, nothing started), `tether limits` showing the
    spend; the bad inputs each a one-line error with exit 2, nothing changed."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"m": {"input": 1000, "output": 1000}}))
    wire.rule = lambda body: {"text": "hello"}
    env = cli_env(OPENAI_API_KEY="sk-test")

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return tether(
            *("run", "say hello", "--store", store, "--base-url", wire.url, "--model", "m"),
            *("--prices", str(prices), "--max-output-tokens", "60", *extra),
            env=env,
        )

    limits = tether("limits", "set", "acme", "--cost-per-day", "0.1", "--store", store, env=env)
    assert limits.returncode == 0, limits.stderr
    assert "limit $0.1" in limits.stdout
    assert run("--account", "acme").returncode == 0  # $0.06
    assert run("--account", "acme").returncode == 0  # $0.12: one call past the limit
    refused = run("--account", "acme")
    assert refused.returncode == 3
    assert "account budget: acme has spent $0.1200 today" in refused.stderr
    assert "the run was not started" in refused.stderr
    assert len(wire.requests) == 2
    queued = run("--account", "acme", "--queue")  # nor queued for a worker
    assert queued.returncode == 3 and "the runs were not queued" in queued.stderr
    listed = tether("runs", "--json", "--store", store, env=env).stdout.splitlines()
    assert [json.loads(line)["state"] for line in listed] == ["done", "done"]  # none queued
    shown = tether("limits", "acme", "--store", store, "--json", env=env)
    standing = json.loads(shown.stdout)
    assert standing["spent"]["day"]["usd"] == pytest.approx(0.12)
    assert standing["held"]["total"]["usd"] == 0
    assert run("--account", "beta").returncode == 0  # no limits: it runs, and is counted
    mine = tether("runs", "--account", "acme", "--json", "--store", store, env=env).stdout
    assert [json.loads(line)["account"] for line in mine.splitlines()] == ["acme", "acme"]
    listed = tether("limits", "--store", store, env=env).stdout
    assert listed.splitlines()[0] == "acme" and "beta (no limits)" in listed
    for bad, said in [
        (("set", "acme", "--cost-total", "-1"), "--cost-total must be a number of 0 or more"),
        (("set", "acme", "--cost-total", "nan"), "--cost-total must be a number of 0 or more"),
        (("set", "acme"), "give at least one limit"),
        (("acme", "--cost-total", "1"), "tether limits set ACCOUNT"),
        (("nobody",), "account nobody has no limits and has spent nothing"),
        (("set", "a b", "--cost-total", "1"), "an account is 1 to 128"),
    ]:
        p = tether("limits", *bad, "--store", store, env=env)
        assert (p.returncode, p.stderr.count("\n")) == (2, 1), p.stderr
        assert said in p.stderr
    assert json.loads(tether("limits", "acme", "--store", store, "--json", env=env).stdout)[
        "limits"
    ] == {"cost_per_day": 0.1, "when_over": "refuse"}  # nothing changed by the bad ones


def killed_mid_call(
    wire: WireServer, tmp_path: Path, store: str, then: str | None = None
) -> dict[str, str]:
    """`tether run --account acme` (a $5 limit, a price for model `m`) as run `cut`, killed
    with SIGKILL while its call waits at the mock; the mock's next reply `then`, if given.
    The environment the commands ran with."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"m": {"input": 1000, "output": 1000}}))
    held = threading.Event()
    wire.add(text="late", gate=held)
    if then is not None:
        wire.add(text=then)
    env = cli_env(OPENAI_API_KEY="sk-test")
    assert tether("limits", "set", "acme", "--cost-total", "5", "--store", store).returncode == 0
    run = warm.Popen(
        [
            *(*TETHER, "run", "say hello", "--store", store, "--base-url", wire.url),
            *("--model", "m", "--prices", str(prices), "--max-output-tokens", "60"),
            *("--account", "acme", "--run-id", "cut"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_until(lambda: wire.requests, "the call at the mock", 30)
        run.send_signal(signal.SIGKILL)
        run.wait()
    finally:
        held.set()
    return env


def test_a_cancelled_run_whose_process_died_mid_call_holds_nothing(
    wire: WireServer, tmp_path: Path
) -> None:
    """A run killed while its call waits at the mock, then cancelled: it is never taken over,
    so the cancel counts what it held as spent (it may have been paid) and nothing stays
    held against its account."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    env = killed_mid_call(wire, tmp_path, store)

    def standing() -> dict[str, Any]:
        shown = tether("limits", "acme", "--store", store, "--json", env=env)
        return dict(json.loads(shown.stdout))

    before = standing()["held"]["total"]["usd"]
    assert before > 0  # the kill left its reservation
    cancelled = tether("cancel", "cut", "--store", store, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    after = standing()
    assert after["held"]["total"] == {"usd": 0, "tokens": 0}
    assert after["spent"]["total"]["usd"] == pytest.approx(before)  # counted at its estimate


def test_a_durable_run_queued_for_its_accounts_room_goes_on_when_the_limit_is_raised(
    wire: WireServer, tmp_path: Path
) -> None:
    """On a store, `--when-over queue`: a new run of an account over its limit starts, says
    it waits (its `queued` event names the limit) and asks the model nothing; `tether limits
    set` from another process raises the limit, and the run goes on to its answer."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wire.rule = lambda body: {"text": "hello"}
    env = cli_env(OPENAI_API_KEY="sk-test")
    limits = ("limits", "set", "acme", "--when-over", "queue", "--store", store)
    assert tether(*limits, "--tokens-total", "1", env=env).returncode == 0
    args = ("run", "hi", "--store", store, "--base-url", wire.url, "--account", "acme")
    assert tether(*args, env=env).returncode == 0  # 60 tokens: the limit is passed
    waiting = warm.Popen(
        [*TETHER, *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        assert waiting.stdout is not None
        line = ""
        while '"queued"' not in line:
            line = waiting.stdout.readline()
            assert line, "the run ended before it was queued"
        assert json.loads(line)["what"] == "account" and "acme has used" in line
        assert len(wire.requests) == 1
        queued = tether("run", "later", "--queue", "--store", store, "--account", "acme", env=env)
        assert queued.returncode == 0, queued.stderr  # queued too, to wait for its room
        listed = tether("runs", "--state", "queued", "--store", store, env=env).stdout
        assert listed.split("\t")[0] == queued.stdout.strip()
        assert tether(*limits, "--tokens-total", "1000", env=env).returncode == 0
        rest = waiting.stdout.read()
        assert waiting.wait(30) == 0
    finally:
        waiting.kill()
        waiting.wait()
    assert '"admitted"' in rest and '"answer": "hello"' in rest.replace('":"', '": "')
    assert len(wire.requests) == 2


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_run_killed_mid_call_is_resumed_and_its_account_counts_the_cut_call(
    wire: WireServer, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A run of an account killed while its call waits at the mock, then `tether resume`d,
    on each store (the kill was tested on Postgres only; on SQLite a resume failed with an
    IntegrityError): it finishes, the cut call counts at its estimate (it may have been
    paid), the new one at what it cost, and nothing stays held."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    if backend == "postgres":
        store = request.getfixturevalue("postgres")
    env = killed_mid_call(wire, tmp_path, store, then="hello")
    shown = tether("limits", "acme", "--store", store, "--json", env=env)
    estimate = json.loads(shown.stdout)["held"]["total"]["usd"]
    assert estimate > 0.06
    resumed = tether("resume", "cut", "--store", store, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("hello")
    after = json.loads(tether("limits", "acme", "--store", store, "--json", env=env).stdout)
    assert after["held"]["total"] == {"usd": 0, "tokens": 0}
    assert after["spent"]["total"]["usd"] == pytest.approx(estimate + 0.06)


# -- four workers on one Postgres ---------------------------------------------------------------


def paid_at_the_wire(wire: WireServer) -> float:
    """What the mock was paid: each request's usage (50 in, 10 out) at PRICE."""
    return len(wire.requests) * CALL


def largest_estimate(wire: WireServer) -> float:
    """More than any call's estimate: the JSON of its messages (more characters than their
    text) over 3, plus the 60 tokens out, at PRICE."""
    return max((len(json.dumps(b["messages"])) // 3 + 1 + 60) * 0.001 for b in wire.requests)


def user_text(body: dict[str, Any]) -> str:
    """The task of the run a request came from (its first user message)."""
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def fleet_of_one_account(
    wire: WireServer, tmp_path: Path, postgres: str, limit: float, kill_one: bool
) -> None:
    """200 queued runs of one account, four workers, a cost limit; with `kill_one`, a worker
    is killed while it holds runs in the middle of their calls. The limit holds at the wire,
    every run ends done or halted by the budget, none calls after its halt, and nothing is
    left held."""
    runs, tag = 200, uuid.uuid4().hex[:6]
    released = threading.Event()  # with kill_one, the first calls wait until the kill

    def two_turns(body: dict[str, Any]) -> dict[str, Any]:
        if tool_results(body) == 0:
            turn: dict[str, Any] = {"calls": [("note", {"text": "x"})]}
            return {**turn, "gate": released} if kill_one else turn
        return {"text": "Noted."}

    wire.rule = two_turns
    if not kill_one:
        released.set()
    env = cli_env(OPENAI_API_KEY="sk-test", NOTES_FILE=str(tmp_path / "notes"))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"m": {"input": 1000, "output": 1000}}))
    limits = tether("limits", "set", "acme", "--cost-total", str(limit), "--store", postgres)
    assert limits.returncode == 0, limits.stderr
    queued = tether(
        *("run", "--queue", "--tasks", "-", "--run-id", f"q-{tag}", "--account", "acme"),
        *("--store", postgres, "--base-url", wire.url, "--model", "m", "--prices", str(prices)),
        *("--max-output-tokens", "60", "--tools-from", str(FIXTURES / "durable_tools.py")),
        stdin="".join(f"job {i}\n" for i in range(runs)),
        env=env,
    )
    assert queued.returncode == 0, queued.stderr
    ids = queued.stdout.split()
    tasks = {i: f"job {n}" for n, i in enumerate(ids)}

    def worker(name: str) -> subprocess.Popen[str]:
        return warm.Popen(
            [
                *(*TETHER, "worker", "--store", postgres, "--executor-id", f"{name}-{tag}"),
                *("--tools-from", str(FIXTURES / "durable_tools.py"), "--allow-base-url", wire.url),
                *("--beat", "0.5", "--dead-after", "3", "--concurrency", "20"),
                *("--store-connections", "3"),  # eight workers of two tests on one server
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )

    # with kill_one, a starts alone, and is killed once its first calls wait at the mock
    workers = [worker("a")] if kill_one else [worker(name) for name in "abcd"]
    try:
        with store_runs(postgres) as stored:
            if kill_one:

                def a_calls() -> bool:
                    held = [i for i, r in stored("running").items() if r["worker"] == f"a-{tag}"]
                    asked = {user_text(body) for body in list(wire.requests)}
                    return any(tasks[i] in asked for i in held)

                wait_until(a_calls, "calls in flight on worker a", 60, 0.05)
                workers += [worker(name) for name in "bcd"]
                workers[0].send_signal(signal.SIGKILL)
                workers[0].wait()
                released.set()
            wait_until(lambda: not stored("queued", "running"), "every run to end", 180, 0.2)
            rows = stored()
    finally:
        released.set()
        for w in workers:
            w.kill()
            w.wait()
    assert sorted(rows) == sorted(ids)
    outcomes = {i: (r["state"], r["reason"]) for i, r in rows.items()}
    assert all(
        s == "done" or (s == "halted" and (why or "").startswith("account budget: acme "))
        for s, why in outcomes.values()
    ), outcomes
    assert sum(s == "halted" for s, _ in outcomes.values()) > runs / 2  # most: $24 was wanted
    paid = paid_at_the_wire(wire)
    assert paid <= limit + largest_estimate(wire) + 1e-9
    by_run: dict[str, int] = {}
    for body in wire.requests:
        by_run[user_text(body)] = by_run.get(user_text(body), 0) + 1
    for i, r in rows.items():  # a halted run asked nothing after its halt
        if not kill_one:
            assert by_run.get(tasks[i], 0) == (r["steps"] or 0), (i, r)
        else:  # a call the kill cut short was made again by the run's new worker
            assert by_run.get(tasks[i], 0) >= (r["steps"] or 0), (i, r)
    if kill_one:  # the kill cut calls short: they were made again, and counted again
        assert sum(by_run.values()) > sum(r["steps"] or 0 for r in rows.values())
    standing = json.loads(tether("limits", "acme", "--store", postgres, "--json").stdout)
    assert standing["held"]["total"] == {"usd": 0, "tokens": 0}  # none held for good
    # every paid call is counted (a cut-short one at its estimate, at least what it cost),
    # and the limit was reached by what was counted: a kill's cut calls may never have left
    # the killed worker, and are counted all the same
    assert max(paid, 0.9 * limit) <= standing["spent"]["total"]["usd"] + 1e-9


def test_four_workers_keep_one_accounts_limit_on_postgres(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    fleet_of_one_account(wire, tmp_path, postgres, limit=3.0, kill_one=False)


def test_a_worker_killed_mid_call_leaves_the_accounts_limit_whole(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    fleet_of_one_account(wire, tmp_path, postgres, limit=3.0, kill_one=True)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_call_is_counted_once_whichever_process_settles_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The settlement rule, run against both stores' SQL: a held call settled by the process
    that reserved it, or by another (a worker, a run resumed elsewhere), moves its estimate to
    what it cost; a call of an account with no limits is added up; a call released first
    (counted at its estimate) adds nothing when its settlement comes late. It was decided by
    the reserving process's memory: settled elsewhere, a call was counted twice and its
    estimate held for good."""
    from tether.durable.accounts import StoredAccounts
    from tether.durable.ledger import Ledger

    store = (
        f"sqlite:///{tmp_path / 'runs.sqlite'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres")
    )
    here, there = Ledger(store), Ledger(store)
    mine, other = StoredAccounts(here), StoredAccounts(there)
    estimate, cost = Cost(0.10, 100), Cost(0.06, 60)

    async def go() -> None:
        await mine.set_limits("acme", Limits(cost_total=1.0))
        for n, settler in enumerate((mine, other)):
            assert await mine.reserve("acme", "r1", f"call {n}", estimate) == ""
            held = await mine.standing("acme")
            assert held.held["total"] == estimate
            await settler.settle("acme", "r1", f"call {n}", cost)
            settled = await other.standing("acme")
            assert settled.held["total"] == Cost(), settler
            assert settled.spent["total"].usd == pytest.approx(0.06 * (n + 1))
        await other.settle("beta", "r2", "call 0", cost)  # no limits: added up
        assert (await mine.standing("beta")).spent["total"].usd == pytest.approx(0.06)
        assert await mine.reserve("acme", "r3", "call 0", estimate) == ""
        await other.release("r3")  # the run ended with the call in flight: at its estimate
        await mine.settle("acme", "r3", "call 0", cost)  # a late settlement adds nothing
        ended = await other.standing("acme")
        assert ended.spent["total"].usd == pytest.approx(0.12 + 0.10)
        assert ended.held["total"] == Cost()

    try:
        asyncio.run(go())
    finally:
        for ledger in (here, there):
            if ledger.engine is not None:
                ledger.engine.dispose()


LIMIT_KINDS = [
    "cost_per_day", "cost_per_month", "cost_total",
    "tokens_per_day", "tokens_per_month", "tokens_total",
]  # fmt: skip


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
def test_every_limit_kind_refuses_alike_in_memory_and_on_each_store(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The account rule has three copies (Python in memory and on SQLite, SQL on Postgres):
    each limit kind, against what is spent and what calls in flight hold, run through each.
    A limit of $1 (or 1,000 tokens): a call of 0.6 goes, a second goes (one call past a limit
    is the rule), a third is refused; the same with the first two still held, not settled."""
    from tether.durable.accounts import StoredAccounts
    from tether.durable.ledger import Ledger

    ledger = None
    if backend == "memory":
        accounts: Any = MemoryAccounts()
    else:
        store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
        if backend == "postgres":
            store = request.getfixturevalue("postgres")
        ledger = Ledger(store)
        accounts = StoredAccounts(ledger)
    call = Cost(0.6, 600)

    async def go() -> None:
        for kind in LIMIT_KINDS:
            value = 1.0 if kind.startswith("cost") else 1000
            for settled in (True, False):
                account = f"{kind}-{'settled' if settled else 'held'}"
                await accounts.set_limits(account, Limits(**{kind: value}))
                for n in range(2):
                    assert await accounts.reserve(account, account, f"c{n}", call) == "", kind
                    if settled:
                        await accounts.settle(account, account, f"c{n}", call)
                refused = await accounts.reserve(account, account, "c2", Cost(0.01, 1))
                assert refused.startswith(f"account budget: {account} has "), (kind, refused)
                other = f"{account}-other"  # untouched by its neighbour's spend
                await accounts.set_limits(other, Limits(**{kind: value}))
                assert await accounts.reserve(other, f"r-{other}", "c0", call) == ""

    try:
        asyncio.run(go())
    finally:
        if ledger is not None and ledger.engine is not None:
            ledger.engine.dispose()


QUEUE_MANY = """
import asyncio, gc, json, os, sys
from tether import Agent, Limits, RunContext, Runtime, ScriptedModel, reply

def open_files():
    return len(os.listdir("/proc/self/fd"))

async def main(store):
    agent = Agent(ScriptedModel([reply("Done.")]), name="billed")
    async with Runtime(store, [agent], take_over=False) as rt:
        await rt.set_limits("acme", Limits(tokens_total=1_000_000))
        rt.enqueue("billed", "first", context=RunContext(account_id="acme"))
        gc.disable()  # what is not closed stays open, as between two collections
        before = open_files()
        for i in range(20):
            rt.enqueue("billed", f"task {i}", context=RunContext(account_id="acme"))
        after = open_files()
        gc.enable()
    print(json.dumps({"opened": after - before}))

asyncio.run(main(sys.argv[1]))
"""


def test_queueing_runs_of_an_account_leaves_no_connection_open(tmp_path: Path) -> None:
    """Each run queued for an account reads the account's standing from the store's ledger:
    that ledger is closed after (each left a connection and its files open until a garbage
    collection, twenty runs sixty files)."""
    from helpers import program_output

    seen = program_output(QUEUE_MANY, f"sqlite:///{tmp_path}/runs.sqlite")
    assert seen["opened"] <= 2, seen
