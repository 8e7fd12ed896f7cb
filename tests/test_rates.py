"""Rate limits per endpoint and key (`rates.py`): the rule, runs in memory, the CLI on SQLite,
four workers on one Postgres; a server's `Retry-After` heeded by every process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env, store_runs, tether, wait_until
from tether import Agent, ConfigError, Runtime
from tether.durable import rates as stored_rates
from tether.durable.ledger import Ledger
from tether.durable.notices import RATES
from tether.durable.rates import StoredRates
from tether.events import Event
from tether.providers.openai_chat import OpenAIChatModel
from tether.rates import SLACK, Rate, wait_for
from wire_server import WireServer, tool_results


def most_in_any_window(times: list[float], per: float) -> int:
    """The most requests the server saw in any `per` seconds (each window starting at one)."""
    ordered = sorted(times)
    return max((sum(1 for t in ordered if s <= t < s + per) for s in ordered), default=0)


# -- the rule, pure ------------------------------------------------------------------------------


def test_an_attempt_waits_until_the_oldest_that_must_leave_has_left() -> None:
    rate, span = Rate(requests=2, per=10.0), 10.0 + SLACK
    assert wait_for(rate, 0.0, [(100.0, 1)], 101.0, 1) == 0  # room for one more
    assert wait_for(rate, 0.0, [(100.0, 1), (104.0, 1)], 105.0, 1) == pytest.approx(
        100.0 + span - 105.0
    )
    assert wait_for(rate, 0.0, [(90.0, 1), (104.0, 1)], 105.0, 1) == 0  # 90 has left


def test_tokens_wait_for_enough_to_leave_and_a_huge_attempt_goes_alone() -> None:
    rate, span = Rate(tokens=100, per=10.0), 10.0 + SLACK
    admitted = [(100.0, 40), (101.0, 40), (102.0, 10)]
    assert wait_for(rate, 0.0, admitted, 103.0, 10) == 0  # 90 + 10 fits
    assert wait_for(rate, 0.0, admitted, 103.0, 50) == pytest.approx(100.0 + span - 103.0)
    assert wait_for(rate, 0.0, admitted, 103.0, 60) == pytest.approx(101.0 + span - 103.0)
    assert wait_for(rate, 0.0, admitted, 103.0, 500) == pytest.approx(102.0 + span - 103.0)
    assert wait_for(rate, 0.0, [], 103.0, 500) == 0  # larger than the limit: alone, not never


def test_a_servers_pause_holds_with_or_without_a_rate() -> None:
    assert wait_for(None, 110.0, [], 108.5, 1) == pytest.approx(1.5)
    assert wait_for(Rate(requests=5), 110.0, [], 108.5, 1) == pytest.approx(1.5)
    assert wait_for(None, 100.0, [], 108.5, 1) == 0


@pytest.mark.parametrize(
    "given",
    [
        {"requests": 0},
        {"tokens": -5},
        {"requests": 2.5},
        {"requests": True},
        {"requests": 5, "per": 0.0},
        {"requests": 5, "per": float("nan")},
        {},
    ],
)
def test_a_bad_rate_is_refused_by_name(given: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="a rate"):
        Rate(**given)


# -- runs in memory --------------------------------------------------------------------------------


def chat_agent(wire: WireServer) -> Agent:
    model = OpenAIChatModel("m", base_url=wire.url, api_key="sk-test", stream=False)
    return Agent(model, [], name="asker")


def test_runs_in_memory_keep_their_endpoints_rate(wire: WireServer) -> None:
    """Nine runs at once, three requests in any half second: the mock never sees more, the
    runs that waited say so (`queued`, what: rate, and the rate), and all end done."""
    wire.rule = lambda body: {"text": "hi"}
    agent = chat_agent(wire)
    seen: list[Event] = []

    async def go() -> None:
        async with Runtime(agents=[agent]) as rt:
            await rt.set_rate(agent.model, Rate(requests=3, per=0.5))
            handles = [await rt.start("asker", f"q{i}", sinks=[seen.append]) for i in range(9)]
            results = [await h.wait() for h in handles]
            assert {r.outcome for r in results if r is not None} == {"done"}
            (standing,) = await rt.rates()
            assert standing.endpoint == agent.model.endpoint  # type: ignore[attr-defined]
            assert "sk-test" not in standing.endpoint  # a hash of the key, never the key

    asyncio.run(go())
    assert len(wire.arrived) == 9
    assert most_in_any_window(wire.arrived, 0.5) <= 3
    assert wire.arrived[-1] - wire.arrived[0] >= 1.0  # three windows at least
    waits = [e.data for e in seen if e.type == "queued" and e.data["what"] == "rate"]
    assert len(waits) >= 6 and waits[0]["reason"] == "rate limit: at most 3 requests in 0.5 s"
    assert sum(e.type == "admitted" and e.data["what"] == "rate" for e in seen) == len(waits)


def test_a_servers_retry_after_pauses_every_run_of_the_endpoint(wire: WireServer) -> None:
    """A 429 with `Retry-After: 1` to one run: another run that starts meanwhile sends nothing
    to that endpoint until the second has passed (it says why it waits), with no rate set."""
    wire.add(status=429, headers={"Retry-After": "1"})
    wire.rule = lambda body: {"text": "hi"}
    agent = chat_agent(wire)
    seen: list[Event] = []

    async def go() -> None:
        async with Runtime(agents=[agent]) as rt:
            first = await rt.start("asker", "one")
            while len(wire.arrived) < 1:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # its 429 came back
            second = await rt.start("asker", "two", sinks=[seen.append])
            assert (await first.wait()).outcome == "done"  # type: ignore[union-attr]
            assert (await second.wait()).outcome == "done"  # type: ignore[union-attr]

    asyncio.run(go())
    assert len(wire.arrived) == 3  # the refused one, its retry, the second run's
    assert min(wire.arrived[1:]) >= wire.arrived[0] + 0.95
    (waited,) = [e.data for e in seen if e.type == "queued"]
    assert waited["what"] == "rate" and "the server asked for no requests until" in waited["reason"]


def test_a_model_with_no_endpoint_cannot_be_rated() -> None:
    from tether import ScriptedModel
    from tether.providers.scripted import reply

    async def go() -> None:
        async with Runtime() as rt:
            with pytest.raises(ConfigError, match="has no HTTP endpoint to limit"):
                await rt.set_rate(ScriptedModel([reply("x")]), Rate(requests=1))

    asyncio.run(go())


# -- the CLI on SQLite ---------------------------------------------------------------------------


def test_tether_limits_rate_across_processes_on_sqlite(wire: WireServer, tmp_path: Path) -> None:
    """`tether limits rate` for the mock's endpoint, four `tether run`s at once in processes
    of their own: the mock sees at most two in any second. Listed with its recent requests,
    cleared, and the bad inputs each a one-line error (exit 2) that changes nothing."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    wire.rule = lambda body: {"text": "hello"}
    env = cli_env(OPENAI_API_KEY="sk-test")
    where = ("--base-url", wire.url, "--store", store)
    set_ = tether("limits", "rate", *where, "--requests", "2", "--per", "1", env=env)
    assert set_.returncode == 0, set_.stderr
    assert "at most 2 requests in 1 s" in set_.stdout and "sk-test" not in set_.stdout
    runs = [
        subprocess.Popen(
            [*TETHER, "run", f"say hello {i}", *where, "--model", "m"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for p in runs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert len(wire.arrived) == 4
    assert most_in_any_window(wire.arrived, 1.0) <= 2
    listed = tether("limits", "--store", store, env=env)
    assert "at most 2 requests in 1 s" in listed.stdout
    shown = json.loads(tether("limits", "rate", *where, "--json", env=env).stdout)
    assert shown["rate"] == {"requests": 2, "tokens": None, "per": 1.0}
    endpoint = shown["endpoint"]
    for bad, said in [
        (("--requests", "0"), "requests must be a whole number of 1 or more"),
        (("--tokens", "-1"), "tokens must be a whole number of 1 or more"),
        (("--requests", "3", "--per", "nan"), "period (per) must be a number of seconds"),
        (("clear", "--requests", "3"), "takes no --requests"),
        (("sometimes", "--requests", "3"), "usage: tether limits rate"),
        (("--endpoint", endpoint, "--provider", "anthropic"), "--endpoint names an endpoint"),
    ]:
        p = tether("limits", "rate", *bad, *where, env=env)
        assert (p.returncode, p.stderr.count("\n")) == (2, 1), p.stderr
        assert said in p.stderr
    p = tether("limits", "rate", "--requests", "3", "--store", store, env=env)
    assert (p.returncode, "name the endpoint") == (2, p.stderr.split(": ", 2)[-1][:17])
    keyless = tether(
        "limits",
        "rate",
        "--provider",
        "openai-chat",
        "--requests",
        "3",
        "--store",
        store,
        env=cli_env(),
    )
    assert (keyless.returncode, keyless.stderr.count("\n")) == (2, 1)
    assert "OPENAI_API_KEY is not set: a rate is for an endpoint and key" in keyless.stderr
    again = json.loads(tether("limits", "rate", *where, "--json", env=env).stdout)
    assert again["rate"] == shown["rate"]  # nothing changed by the bad ones
    cleared = tether("limits", "rate", "clear", "--endpoint", endpoint, "--store", store, env=env)
    assert cleared.returncode == 0 and "no rate" in cleared.stdout


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_change_of_the_rates_is_heeded_at_once_by_every_process(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes' views of one store (each its own connection, as two `tether`
    processes have), both having read the rates table: a pause one of them records for an
    endpoint with no rate, and a rate one of them sets, hold in the other from its next
    attempt. The table is never read again by the clock here (`REFRESH_S` an hour): the
    change is said (`durable/notices.py`: a notification on Postgres, heard once it arrives;
    the stamp beside the file on SQLite, at once)."""
    monkeypatch.setattr(stored_rates, "REFRESH_S", 3600.0)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    if kind == "postgres":
        store = request.getfixturevalue("postgres")
    here, there = StoredRates(Ledger(store, 1)), StoredRates(Ledger(store, 1))
    endpoint = "openai-chat http://127.0.0.1:9/v1 key:abc"

    async def heard(told: int) -> None:
        """On Postgres, until `there` has heard of `told` changes (and of its LISTEN)."""
        while kind == "postgres" and there.ledger.notices.heard[RATES] < told:
            await asyncio.sleep(0.01)

    async def go() -> None:
        notices = there.ledger.notices
        listening = asyncio.create_task(notices.listen(store)) if kind == "postgres" else None
        await asyncio.wait_for(heard(1), 10)
        assert await there.try_admit(endpoint, 10) == (0.0, "")  # the table read: empty
        await here.pause(endpoint, 2.0)
        assert (await here.try_admit(endpoint, 10))[0] > 1.0  # where it was seen, at once
        await asyncio.wait_for(heard(2), 10)
        wait, why = await there.try_admit(endpoint, 10)
        assert 1.0 < wait <= 2.0 and "the server asked for no requests until" in why
        other = endpoint.replace("abc", "def")
        assert await there.try_admit(other, 10) == (0.0, "")
        stamp = here.ledger.notices.stamps.get(RATES)
        if stamp is not None:  # removed by hand: looked for in vain, made again
            stamp.unlink()
            assert await there.try_admit(other, 10) == (0.0, "")
        await here.set_rate(other, Rate(requests=1, per=60))
        await asyncio.wait_for(heard(3), 10)
        assert await there.try_admit(other, 10) == (0.0, "")  # the first in the minute
        wait, why = await there.try_admit(other, 10)
        assert wait > 50 and why == "rate limit: at most 1 request a minute", why
        if listening is not None:
            listening.cancel()

    asyncio.run(go())


# -- four workers on one Postgres ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "ago", "tokens"),
    [
        (Rate(requests=2, per=10.0), [(5.0, 1), (1.0, 1)], 1),  # waits for the one 5 s ago
        (Rate(requests=2, per=10.0), [(12.0, 1), (1.0, 1)], 1),  # that one has left: goes
        (Rate(tokens=100, per=10.0), [(5.0, 40), (4.0, 40), (3.0, 10)], 10),  # fits: goes
        (Rate(tokens=100, per=10.0), [(5.0, 40), (4.0, 40), (3.0, 10)], 50),
        (Rate(tokens=100, per=10.0), [(5.0, 40), (4.0, 40), (3.0, 10)], 60),
        (Rate(tokens=100, per=10.0), [(5.0, 40), (4.0, 40), (3.0, 10)], 500),
        (Rate(requests=3, tokens=100, per=10.0), [(5.0, 40), (4.0, 40), (3.0, 10)], 5),
    ],
)
def test_the_admission_on_postgres_says_what_the_rule_says(
    postgres: str, rate: Rate, ago: list[tuple[float, int]], tokens: int
) -> None:
    """The server function (`tether_admit`, one round trip) against `rates.wait_for`: the
    same wait for the same attempts, and an attempt it admits is recorded."""
    import time

    rates = StoredRates(Ledger(postgres, connections=1))
    rates.set_now("e", rate)
    now = time.time()
    admitted = [(now - seconds, t) for seconds, t in ago]
    with rates.ledger.transaction() as run:
        rows = [{"at": at, "t": t} for at, t in admitted]
        run("INSERT INTO tether_rate_log VALUES ('e', :at, :t)", rows)
    expected = wait_for(rate, 0.0, admitted, now, tokens)
    wait, why = rates.admit_now("e", tokens)
    assert wait == pytest.approx(expected, abs=0.1)
    (standing,) = rates.rates_now()
    kept = len([a for a in ago if a[0] < rate.per + SLACK])
    assert standing.requests == kept + (wait == 0)
    assert why == ("" if wait == 0 else f"rate limit: {rate.said()}")
    rates.pause_now("e", 3.0)
    assert rates.admit_now("e", tokens)[0] == pytest.approx(3.0, abs=0.1)


def fleet(wire: WireServer, postgres: str, runs: int, tag: str) -> list[str]:
    """Queue `runs` runs against the mock, each a tool call and then an answer; their ids."""
    env = cli_env(OPENAI_API_KEY="sk-test")
    queued = tether(
        *("run", "--queue", "--tasks", "-", "--run-id", f"q-{tag}", "--store", postgres),
        *("--base-url", wire.url, "--model", "m", "--no-stream"),
        *("--tools-from", str(FIXTURES / "durable_tools.py")),
        stdin="".join(f"job {i}\n" for i in range(runs)),
        env=env,
    )
    assert queued.returncode == 0, queued.stderr
    return queued.stdout.split()


def workers_until_done(
    postgres: str, tmp_path: Path, tag: str, wire: WireServer
) -> dict[str, dict[str, Any]]:
    """Four workers on the store until every run has ended; the runs as listed."""
    env = cli_env(OPENAI_API_KEY="sk-test", NOTES_FILE=str(tmp_path / "notes"))
    workers = [
        warm.Popen(
            [
                *(*TETHER, "worker", "--store", postgres, "--executor-id", f"{name}-{tag}"),
                *("--tools-from", str(FIXTURES / "durable_tools.py"), "--allow-base-url", wire.url),
                *("--concurrency", "20", "--store-connections", "3"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        for name in "abcd"
    ]
    try:
        with store_runs(postgres) as stored:
            wait_until(lambda: not stored("queued", "running"), "every run to end", 180, 0.2)
            return stored()
    finally:
        for w in workers:
            w.kill()
            w.wait()


def two_turns(body: dict[str, Any]) -> dict[str, Any]:
    if tool_results(body) == 0:
        return {"calls": [("note", {"text": "x"})]}
    return {"text": "Noted."}


def test_four_workers_keep_one_endpoints_rate_on_postgres(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    """Fifteen runs of two calls on four workers, five requests in any two seconds for the
    endpoint and key: the mock never sees more, and every run ends done."""
    wire.rule = two_turns
    env = cli_env(OPENAI_API_KEY="sk-test")
    rate = ("--base-url", wire.url, "--requests", "5", "--per", "2", "--store", postgres)
    assert tether("limits", "rate", *rate, env=env).returncode == 0
    tag = uuid.uuid4().hex[:6]
    ids = fleet(wire, postgres, 15, tag)
    rows = workers_until_done(postgres, tmp_path, tag, wire)
    assert sorted(rows) == sorted(ids)
    assert {r["state"] for r in rows.values()} == {"done"}
    assert len(wire.arrived) == 30
    assert most_in_any_window(wire.arrived, 2.0) <= 5
    assert wire.arrived[-1] - wire.arrived[0] >= 5 * 2.0  # six windows' worth: it waited


@pytest.mark.parametrize("rated", [True, False], ids=["rated", "unrated"])
def test_one_429_pauses_the_endpoint_for_every_worker_on_postgres(
    wire: WireServer, tmp_path: Path, postgres: str, rated: bool
) -> None:
    """Sixty runs on four workers, with a rate too loose to bind or none; the server answers
    its 20th request with 429 and `Retry-After: 2`: no worker sends to that key for the two
    seconds after it (but the requests already on their way), then they all go on. (A rated
    endpoint's row is read with each attempt; an unrated one's pause reaches the other
    workers by a notification.)"""
    refused: list[float] = []

    def rule(body: dict[str, Any]) -> dict[str, Any]:
        if len(wire.requests) == 20:
            refused.append(wire.arrived[-1])
            return {"status": 429, "headers": {"Retry-After": "2"}}
        return two_turns(body)

    wire.rule = rule
    env = cli_env(OPENAI_API_KEY="sk-test")
    rate = ("--base-url", wire.url, "--requests", "100000", "--store", postgres)
    assert not rated or tether("limits", "rate", *rate, env=env).returncode == 0
    tag = uuid.uuid4().hex[:6]
    ids = fleet(wire, postgres, 60, tag)
    rows = workers_until_done(postgres, tmp_path, tag, wire)
    assert sorted(rows) == sorted(ids) and {r["state"] for r in rows.values()} == {"done"}
    (at,) = refused
    in_flight = 0.3  # admitted before the pause was recorded: already on their way
    during = [t for t in wire.arrived if at + in_flight <= t < at + 2.0]
    assert during == [], [round(t - at, 3) for t in during]
    assert sum(t >= at + 2.0 for t in wire.arrived) > 20  # then they went on


# -- every copy of the rule: memory, SQLite, Postgres -------------------------------------------


def rates_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[Any]:
    """Two views of one place rates are kept (two processes' on a store; memory has one)."""
    from tether.rates import MemoryRates

    if kind == "memory":
        memory = MemoryRates()
        return [memory, memory]
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    if kind == "postgres":
        store = request.getfixturevalue("postgres")
    return [StoredRates(Ledger(store, 1)), StoredRates(Ledger(store, 1))]


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_every_copy_of_the_rule_keeps_tokens_pauses_and_raised_rates(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same cases against each place rates are kept: a token rate holds (on a SQLite
    store it never took effect); a shorter pause asked later does not cut a longer one short
    (it replaced it); an attempt waiting for room goes once the rate is raised, not after
    its whole wait (it slept a minute)."""
    from tether import rates as rates_module
    from tether.rates import Gate

    monkeypatch.setattr(stored_rates, "REFRESH_S", 0.0)  # each view reads the table each time
    monkeypatch.setattr(rates_module, "LONGEST_NAP", 0.5)
    here, there = rates_of(kind, tmp_path, request)
    rated, paused, raised = "openai-chat a", "openai-chat b", "openai-chat c"

    async def go() -> None:
        await here.set_rate(rated, Rate(tokens=100, per=60))
        assert await here.try_admit(rated, 60) == (0.0, "")
        wait, why = await there.try_admit(rated, 60)
        assert wait > 50 and why == "rate limit: at most 100 tokens a minute"
        await here.pause(paused, 30.0)
        await there.pause(paused, 1.0)  # a shorter one, later: the longer holds
        for view in (here, there):
            wait, why = await view.try_admit(paused, 1)
            assert wait > 25 and "the server asked for no requests until" in why
        await here.set_rate(raised, Rate(requests=1, per=60))
        assert await here.try_admit(raised, 1) == (0.0, "")
        waiting = asyncio.create_task(Gate(there).through(raised, 1))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # a minute to wait
        await here.set_rate(raised, Rate(requests=100, per=60))
        await asyncio.wait_for(waiting, 10)  # within a nap, not the minute

    asyncio.run(go())


def test_an_attempts_tokens_are_its_body_and_the_reply_it_allows() -> None:
    """As OpenAI's own limiter counts a request: a token rate that left out the output limit
    let a call of 4,000 tokens out pass a rate of 1,000."""
    from tether.rates import attempt_tokens

    assert attempt_tokens(b"x" * 400, 4000) == 100 + 4000
    assert attempt_tokens(b"x" * 400, None) == 100


def test_a_servers_pause_is_capped() -> None:
    """A `Retry-After` of ten years paused the endpoint for every process of the store for
    ten years: a server's word holds for at most `LONGEST_PAUSE`."""
    from tether.rates import LONGEST_PAUSE, Gate, MemoryRates

    async def go() -> float:
        rates = MemoryRates()
        await Gate(rates).paused("openai-chat x", 10 * 365 * 86400.0)
        (standing,) = await rates.rates()
        return standing.paused_for

    assert 0 < asyncio.run(go()) <= LONGEST_PAUSE
