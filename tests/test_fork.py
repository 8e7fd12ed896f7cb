"""Forks (#38 item 4): a new run from another run's conversation as it stood after step K, with
a new message or a tool result replaced; nothing of the prefix runs again, the original is
untouched, the fork names its origin; in memory and on a store (SQLite, in a process of its
own: one store per process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import cli_env, json_lines, program_output
from tether import Agent, ConfigError, Runtime, ScriptedModel, reply, tool
from tether.events import Event
from tether.messages import Message, ToolResult


def counting_agent(done: list[int], version: str | None = None) -> Agent:
    """An agent whose tool records each time it really runs; its model adds 1 then 2, then
    answers with the total it read."""

    @tool
    def add(n: int) -> str:
        """Add n."""
        done.append(n)
        return f"added {n}"

    script = [
        reply(tool_calls=[("add", {"n": 1})]),
        reply(tool_calls=[("add", {"n": 2})]),
        reply("the total is 3"),
        reply("a second answer"),
    ]
    return Agent(ScriptedModel(script), [add], name="adder", version=version)


def results_seen(messages: list[Message]) -> list[str]:
    return [p.output for m in messages for p in m.parts if isinstance(p, ToolResult)]


async def test_a_fork_goes_on_from_its_step_and_runs_nothing_of_the_prefix_again() -> None:
    done: list[int] = []
    agent = counting_agent(done)
    events: list[Event] = []
    async with Runtime(agents=[agent]) as rt:
        original = await rt.start("adder", "add things")
        first = await original.wait()
        assert first is not None and first.answer == "the total is 3" and done == [1, 2]
        before = list(original.transcript)

        fork = await rt.fork(original.id, at=1, sinks=[events.append])
        result = await fork.wait()
    assert result is not None and result.answer == "the total is 3"
    assert done == [1, 2, 2]  # the fork ran step 2's call only: step 1's result was read
    assert results_seen(fork.transcript) == ["added 1", "added 2"]
    assert original.transcript == before  # the original is untouched
    started = next(e for e in events if e.type == "run_started")
    assert started.data["forked_from"] == original.id and started.data["at"] == 1
    assert started.data["task"] is None  # no new message: it went on from the tool result


async def test_a_fork_may_replace_a_tool_result_or_add_a_message() -> None:
    done: list[int] = []
    agent = counting_agent(done)
    async with Runtime(agents=[agent]) as rt:
        original = await rt.start("adder", "add things")
        await original.wait()
        call_id = next(
            p.call_id for m in original.transcript for p in m.parts if isinstance(p, ToolResult)
        )
        replaced = await rt.fork(original.id, at=2, results={call_id: "added 100"})
        await replaced.wait()
        asked = await rt.fork(original.id, at=3, message="and then?", fork_id="asked-again")
        answer = await asked.wait()
    assert results_seen(replaced.transcript)[:2] == ["added 100", "added 2"]
    assert done == [1, 2]  # neither fork ran a tool: both went on from after the tools
    assert asked.id == "asked-again" and answer is not None
    assert answer.answer == "a second answer"
    assert [m.text for m in asked.transcript if m.role == "user"][-1] == "and then?"


async def test_a_fork_that_cannot_be_made_is_refused_and_nothing_starts() -> None:
    done: list[int] = []
    async with Runtime(agents=[counting_agent(done)]) as rt:
        original = await rt.start("adder", "add things")
        await original.wait()
        with pytest.raises(ConfigError, match="has steps 0 to 3; there is no step 4"):
            await rt.fork(original.id, at=4)
        with pytest.raises(ConfigError, match="stood with the model's answer after step 3"):
            await rt.fork(original.id, at=3)
        with pytest.raises(ConfigError, match="no tool result with the call id nope"):
            await rt.fork(original.id, at=1, results={"nope": "x"})
        runs = len(rt.backend.runs)
    # an agent of another version: the prefix would go on under another definition
    async with Runtime(agents=[counting_agent(done, version="2")]) as other:
        copied = await other.start("adder", "add things")
        await copied.wait()
    assert runs == 1 and done == [1, 2, 1, 2]
    async with Runtime(agents=[counting_agent([], version="1")]) as rt:
        v1 = await rt.start("adder", "add things")
        await v1.wait()
        rt.agents["adder"] = counting_agent([], version="2")
        with pytest.raises(ConfigError, match="recorded by version 1 of adder; this runtime has"):
            await rt.fork(v1.id, at=1)


FORK_ON_A_STORE = """
import asyncio, json, sys
from tether import Agent, Runtime, ScriptedModel, reply, tool
from tether.messages import ToolResult

done = []

@tool
def add(n: int) -> str:
    \"\"\"Add n.\"\"\"
    done.append(n)
    return f"added {n}"

async def main(store):
    script = [reply(tool_calls=[("add", {"n": 1})]), reply(tool_calls=[("add", {"n": 2})]),
              reply("the total is 3")]
    agent = Agent(ScriptedModel(script), [add], name="adder")
    async with Runtime(store, [agent]) as rt:
        original = await rt.start("adder", "add things", run_id="orig")
        await original.wait()
        fork = await rt.fork("orig", at=1, fork_id="forked")
        result = await fork.wait()
        again = rt.get("forked")
        return {
            "done": done, "output": result.answer,
            "results": [p.output for m in again.transcript for p in m.parts
                        if isinstance(p, ToolResult)],
            "original": [p.output for m in rt.get("orig").transcript for p in m.parts
                         if isinstance(p, ToolResult)],
        }

print(json.dumps(asyncio.run(main(sys.argv[1]))))
"""


def test_a_fork_on_a_store_is_a_durable_run_that_names_its_origin(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    seen = program_output(FORK_ON_A_STORE, store)
    assert seen["done"] == [1, 2, 2] and seen["output"] == "the total is 3"
    assert seen["results"] == ["added 1", "added 2"] and seen["original"] == seen["results"]
    shown = warm.run(
        [sys.executable, "-m", "tether", "show", "forked", "--store", store, "--json"],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    started = next(
        e for e in map(json.loads, shown.stdout.splitlines()) if e["type"] == "run_started"
    )
    assert started["forked_from"] == "orig" and started["at"] == 1


def test_tether_fork_goes_on_from_a_step_of_a_stored_run(tmp_path: Path) -> None:
    """`tether fork RUN --at STEP`: the fork runs the calls after the step only (bash appends
    to a file: step 1's line is not written again), as the run decided approvals (--yolo);
    bad input is a one-line error, exit 2, and starts nothing."""
    from helpers import tether

    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo one >> log"}}]},
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo two >> log"}}]},
                {"text": "done"},
            ]
        )
    )
    store = str(tmp_path / "runs.sqlite")
    common = ["--store", store]
    ran = tether(
        "run", "go", "--provider", "scripted", "--script", str(script), "--tools", "bash",
        "--yolo", "--no-sandbox", "--workspace", str(tmp_path), "--run-id", "r1", *common,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    forked = tether("fork", "r1", "--at", "1", "--run-id", "f1", *common)
    assert forked.returncode == 0, forked.stderr
    assert "run f1: a fork of r1 at step 1" in forked.stderr
    assert "waits for approval" not in forked.stderr  # the run's policy (--yolo) decided it
    assert (tmp_path / "log").read_text() == "one\ntwo\ntwo\n"
    for args, said in [
        (["--at", "7"], "run r1 has steps 0 to 3; there is no step 7 to fork at"),
        (["--at", "3"], "stood with the model's answer after step 3: give a message"),
        (["--at", "1", "--result", "x"], "--result 'x': write it CALL_ID=TEXT"),
        (["--at", "1", "--run-id", "r1"], "the store has a run 'r1' already"),
    ]:
        refused = tether("fork", "r1", *args, *common)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    listed = tether("runs", "--json", *common)
    assert sorted(r["id"] for r in json_lines(listed.stdout)) == ["f1", "r1"]


async def test_a_fork_in_memory_keeps_its_runs_account_and_a_replaced_failure_is_a_result() -> None:
    """A fork spends from the account its run spent from, inside its limits (in memory it was
    dropped, and the fork spent outside them); a failed call's result replaced in the fork
    reaches the model as a plain result, not as the failure it replaced."""
    from tether import Limits, RunContext
    from tether.messages import Usage

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        raise RuntimeError("the network is down")

    used = Usage(input_tokens=40, output_tokens=10)
    script = [
        reply(tool_calls=[("fetch", {"url": "http://example.test"})], usage=used),
        reply("could not fetch it", usage=used),
    ]
    seen: list[list[Message]] = []
    model = ScriptedModel(script)
    respond = model.respond

    async def watched(request: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(list(request.messages))
        return await respond(request, *args, **kwargs)

    model.respond = watched  # type: ignore[method-assign]
    agent = Agent(model, [fetch], name="fetcher")
    async with Runtime(agents=[agent]) as rt:
        await rt.set_limits("acme", Limits(tokens_total=120))
        original = await rt.start("fetcher", "fetch it", context=RunContext(account_id="acme"))
        first = await original.wait()
        assert first is not None and first.answer == "could not fetch it", first
        call_id = next(
            p.call_id for m in original.transcript for p in m.parts if isinstance(p, ToolResult)
        )
        spent = (await rt.account("acme")).spent["total"].tokens
        fork = await rt.fork(original.id, at=1, results={call_id: "hello"})
        result = await fork.wait()
        after = (await rt.account("acme")).spent["total"].tokens
    assert spent == 100 and after == 150  # the fork's call counted against acme
    assert result is not None and result.outcome == "done"
    given = [p for p in seen[-1][-1].parts if isinstance(p, ToolResult)]
    assert [(r.output, r.is_error) for r in given] == [("hello", False)]
