"""Agents that call agents: a child's answer as the parent's tool result, one budget for the
tree (the over-shoot case: exactly the root's limit of requests reach the model server), one
cancel, and events that say where they come from. Over real HTTP to the wire mock."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pydantic
import pytest

import warm
from helpers import FIXTURES, Output, cli_env, json_lines, tether, until, wait_until, within
from tether import (
    Agent,
    Budget,
    HTTPSettings,
    OpenAIChatModel,
    RunContext,
    Runtime,
    run_child,
    tool,
)
from tether.approvals import approve_all
from tether.events import Event
from tether.messages import Usage
from tether.runtime import check_run_id
from tether.tree import Allowance, child_run_id
from wire_server import WireServer, tool_results

NO_LIMITS = Budget()
SETTINGS = HTTPSettings(max_retries=1, backoff_base=0.01, backoff_max=0.02, read_timeout=30)


@tool
def note(text: str) -> str:
    """Write a note down."""
    return "noted"


@pytest.fixture
async def chat(wire: WireServer) -> AsyncIterator[OpenAIChatModel]:
    """One client for every agent of a test's tree, closed after it."""
    client = OpenAIChatModel("mock", api_key="sk-k", base_url=wire.url, settings=SETTINGS)
    yield client
    await client.aclose()


def system_of(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"]) if body["messages"][0]["role"] == "system" else ""


def tree_rule(children: int, child_reply: Callable[[], dict[str, Any]] | None = None) -> Any:
    """The lead hands `children` tasks to researchers at once, then sums up; a researcher
    notes something down (a second model call), then answers."""

    def rule(body: dict[str, Any]) -> dict[str, Any]:
        done = tool_results(body)
        if "LEAD" in system_of(body):
            if done == 0:
                return {"calls": [("researcher", {"task": f"topic {i}"}) for i in range(children)]}
            return {"text": "the lead's summary"}
        if done == 0:
            return child_reply() if child_reply else {"calls": [("note", {"text": "seen"})]}
        return {"text": "found it"}

    return rule


def agents(
    chat: OpenAIChatModel, lead_budget: Budget = NO_LIMITS, child_budget: Budget = NO_LIMITS
) -> tuple[Agent, Agent]:
    researcher = Agent(chat, [note], system="RESEARCHER", name="researcher", budget=child_budget)
    lead = Agent(
        chat,
        [researcher.as_tool(description="Research one topic.")],
        system="LEAD",
        name="lead",
        budget=lead_budget,
    )
    return lead, researcher


async def test_a_child_answers_as_the_parents_tool_result_and_its_events_say_whose(
    wire: WireServer,
    chat: OpenAIChatModel,
) -> None:
    wire.rule = tree_rule(2)
    lead, _ = agents(chat)
    events: list[Event] = []
    async with Runtime(agents=[lead]) as rt:
        run = await rt.start("lead", "Look into two topics.", run_id="root", sinks=[events.append])
        result = await within(run.wait(), "the tree to answer")
        assert result is not None and result.outcome == "done", result
        assert result.answer == "the lead's summary"
        results = [p for m in result.messages if m.role == "tool" for p in m.parts]
        assert [(r.output, r.is_error) for r in results] == [("found it", False)] * 2
        children = ["root.call_1_0", "root.call_1_1"]
        for child in children:  # runs of the runtime, found by id
            handle = rt.get(child)
            assert handle.status == "done"
            assert "topic" in handle.transcript[0].text
    by_run: dict[str, list[Event]] = {}
    for e in events:  # the root's sinks saw the whole tree
        by_run.setdefault(e.run_id, []).append(e)
    assert set(by_run) == {"root", *children}
    for child in children:
        seen = by_run[child]
        assert [e.seq for e in seen] == list(range(len(seen)))
        assert all(e.data["parent_run_id"] == "root" for e in seen)
        assert all(e.data["root_run_id"] == "root" for e in seen)
        assert seen[-1].type == "run_finished" and seen[-1].data["outcome"] == "done"
    assert not any("parent_run_id" in e.data for e in by_run["root"])


@pytest.mark.parametrize("where", ["runtime", "agent.run"])
async def test_eight_parallel_children_under_a_root_limit_of_nine_calls_make_nine_requests(
    wire: WireServer, chat: OpenAIChatModel, where: str
) -> None:
    """pydantic-ai-harness#696: with a limit of 9 and 8 parallel children the tree made 16.
    Here each child wants 2 calls; the root's first call and 8 children's first calls are
    the 9, every child's second call and the root's second are refused."""
    wire.rule = tree_rule(8)
    lead, _ = agents(chat, lead_budget=Budget(max_steps=9))
    if where == "runtime":
        async with Runtime(agents=[lead]) as rt:
            run = await rt.start("lead", "Look into eight topics.", run_id="root")
            result = await within(run.wait(), "the tree to halt")
            child_outcomes = [rt.get(f"root.call_1_{i}").status for i in range(8)]
    else:
        result = await within(lead.run("Look into eight topics.", run_id="root"), "the halt")
        child_outcomes = ["halted"] * 8  # inside the calls: their results say it (below)
    assert len(wire.requests) == 9
    assert result is not None and result.outcome == "halted"
    assert "max_steps" in result.reason and "the limit is 9" in result.reason
    assert child_outcomes == ["halted"] * 8
    results = [p for m in result.messages if m.role == "tool" for p in m.parts]
    assert len(results) == 8 and all(r.is_error for r in results)
    assert all("ended halted: max_steps" in r.output for r in results)


async def test_a_child_with_a_tighter_budget_halts_and_its_parent_goes_on(
    wire: WireServer,
    chat: OpenAIChatModel,
) -> None:
    wire.rule = tree_rule(1)
    lead, _ = agents(chat, child_budget=Budget(max_steps=1))
    async with Runtime(agents=[lead]) as rt:
        run = await rt.start("lead", "Look into one topic.", run_id="root")
        result = await within(run.wait(), "the lead to answer")
    assert result is not None and result.outcome == "done"
    (child_result,) = [p for m in result.messages if m.role == "tool" for p in m.parts]
    assert child_result.is_error
    assert "researcher (run root.call_1_0) ended halted: max_steps" in child_result.output
    assert len(wire.requests) == 3  # lead, the child's one call, lead


async def test_cancelling_the_root_cancels_every_child_inside_its_model_stream(
    wire: WireServer,
    chat: OpenAIChatModel,
) -> None:
    wire.rule = tree_rule(5, lambda: {"text": "never sent whole", "fault": "stall"})
    lead, _ = agents(chat)
    async with Runtime(agents=[lead]) as rt:
        run = await rt.start("lead", "Look into five topics.", run_id="root")
        await until(lambda: len(wire.requests) == 6, "five children to be streaming")
        children = [rt.get(f"root.call_1_{i}") for i in range(5)]
        assert rt.cancel("root")
        result = await within(run.wait(), "the root to end")
        assert result is not None and result.outcome == "cancelled"
        # the root's cancel ends when its children have ended
        assert [c.status for c in children] == ["cancelled"] * 5
    await until(lambda: wire.closed_streams == 5, "the children's streams to be closed", 5)


async def test_cancelling_one_child_gives_its_parent_an_error_result_and_the_parent_goes_on(
    wire: WireServer,
    chat: OpenAIChatModel,
) -> None:
    def child_reply() -> dict[str, Any]:
        return {"text": "never sent whole", "fault": "stall"}

    wire.rule = tree_rule(1, child_reply)
    lead, _ = agents(chat)
    async with Runtime(agents=[lead]) as rt:
        run = await rt.start("lead", "Look into one topic.", run_id="root")
        await until(lambda: len(wire.requests) == 2, "the child to be streaming")
        assert rt.cancel("root.call_1_0")
        result = await within(run.wait(), "the lead to answer")
    assert result is not None and result.outcome == "done"
    (child_result,) = [p for m in result.messages if m.role == "tool" for p in m.parts]
    assert child_result.is_error and "ended cancelled" in child_result.output


class Finding(pydantic.BaseModel):
    topic: str
    confidence: float


async def test_a_childs_typed_output_is_its_parents_tool_result(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    found = {"topic": "tides", "confidence": 0.5}
    wire.rule = tree_rule(1, lambda: {"text": orjson.dumps(found).decode()})
    researcher = Agent(chat, [], system="RESEARCHER", name="researcher")
    researcher.output_type = Finding
    researcher.__post_init__()
    lead = Agent(chat, [researcher.as_tool()], system="LEAD", name="lead")
    result = await within(lead.run("One topic.", run_id="root"), "the lead to answer")
    (child_result,) = [p for m in result.messages if m.role == "tool" for p in m.parts]
    assert not child_result.is_error
    assert orjson.loads(child_result.output) == found


async def test_a_cancel_of_a_tree_run_inside_one_call_ends_the_children_too(
    wire: WireServer,
    chat: OpenAIChatModel,
) -> None:
    """Without a runtime (`Agent.run`), children run inside their calls and a cancel of the
    root reaches them as any cancel reaches a tool."""
    wire.rule = tree_rule(3, lambda: {"text": "never sent whole", "fault": "stall"})
    lead, _ = agents(chat)
    events: list[Event] = []
    task = asyncio.ensure_future(lead.run("Three topics.", run_id="root", sinks=[events.append]))
    await until(lambda: len(wire.requests) == 4, "three children to be streaming")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task, "the root to end")
    ended = {e.run_id: e.data["outcome"] for e in events if e.type == "run_finished"}
    assert ended == {"root": "cancelled", **{f"root.call_1_{i}": "cancelled" for i in range(3)}}
    await until(lambda: wire.closed_streams == 3, "the children's streams to be closed", 5)


async def test_tokens_a_child_spends_count_against_its_roots_limit(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    """Each reply uses 60 tokens (50 in, 10 out). The lead's own 60 leave it room under its
    limit of 150, but with its child's two calls the tree has used 180: its next is refused."""
    wire.rule = tree_rule(1)
    lead, _ = agents(chat, lead_budget=Budget(max_tokens=150))
    result = await within(lead.run("One topic.", run_id="root"), "the tree to halt")
    assert len(wire.requests) == 3
    assert result.outcome == "halted"
    assert result.reason == (
        "max_tokens: 180 used by run root and the runs it started, the limit is 150"
    )
    assert result.usage.total_tokens == 60  # the run's own usage stays its own


EXAMPLE = [sys.executable, str(Path(__file__).parent.parent / "examples" / "research_tree.py")]


def test_the_example_tree_answers_offline_from_every_researcher() -> None:
    done = warm.run(
        [*EXAMPLE, "How do tides work?"], capture_output=True, text=True, env=cli_env(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    answer = done.stdout.strip().splitlines()[-1]
    assert "two bulges" in answer and "12 h 25 min" in answer and "spring tides" in answer


@pytest.mark.parametrize("limit", [9, 5])
def test_the_example_tree_on_a_store_keeps_to_the_roots_limit(
    wire: WireServer, tmp_path: Path, limit: int
) -> None:
    """Durable, over a real model server: 3 researchers of 2 calls each and the lead's 2 make
    8 calls, under 9; under 5 exactly 5 requests reach the server and the tree halts (exit 3).
    The researchers' first replies wait until all three have asked, so which of them the
    budget serves does not depend on how fast one finishes before the others start: all
    three get their first call (4 in all), and one its second."""
    first_asked: list[str] = []
    all_asked = threading.Event()

    def rule(body: dict[str, Any]) -> dict[str, Any]:
        done = tool_results(body)
        if "You are the lead" in system_of(body):
            if done == 0:
                return {"calls": [("researcher", {"task": s}) for s in ("gravity", "sun", "moon")]}
            return {"text": "the lead's answer"}
        if done == 0:
            first_asked.append("asked")
            if len(first_asked) == 3:
                all_asked.set()
            return {"calls": [("look_up", {"subject": "sun"})], "gate": all_asked}
        return {"text": "found"}

    wire.rule = rule
    store = f"sqlite:///{tmp_path / 'tree.sqlite'}"
    env = cli_env(OPENAI_API_KEY="sk-tree", OPENAI_BASE_URL=wire.url)
    done = warm.run(
        [*EXAMPLE, "Tides?", "--store", store, "--json", "--max-steps", str(limit)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    events = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ended = {e["run_id"]: e for e in events if e["type"] == "run_finished"}
    root = next(e for e in ended.values() if "parent_run_id" not in e)
    children = [e for e in ended.values() if e.get("root_run_id") == root["run_id"]]
    assert len(children) == 3
    if limit == 9:
        assert done.returncode == 0 and root["outcome"] == "done", done.stderr
        assert len(wire.requests) == 8
        assert [c["outcome"] for c in children] == ["done"] * 3
    else:
        assert done.returncode == 3 and root["outcome"] == "halted", done.stderr
        assert len(wire.requests) == 5
        assert "the limit is 5" in root["reason"]
        assert sorted(c["outcome"] for c in children) == ["done", "halted", "halted"]


@tool(approval="always")
def publish(text: str) -> str:
    """Publish a finding (needs a person's approval)."""
    return "published"


@pytest.mark.parametrize("policy", ["approve_all", "ask"])
async def test_a_childs_approvals_reach_whoever_watches_the_root(
    wire: WireServer, chat: OpenAIChatModel, policy: str
) -> None:
    wire.rule = tree_rule(1, lambda: {"calls": [("publish", {"text": "tides"})]})
    researcher = Agent(chat, [publish], system="RESEARCHER", name="researcher")
    lead = Agent(chat, [researcher.as_tool()], system="LEAD", name="lead")
    events: list[Event] = []
    async with Runtime(agents=[lead]) as rt:
        approver = approve_all if policy == "approve_all" else None
        run = await rt.start(
            "lead", "One topic.", run_id="root", sinks=[events.append], approver=approver
        )
        if policy == "ask":
            asked = await until(
                lambda: [e for e in events if e.type == "approval_requested"], "the child to ask"
            )
            assert asked[0].run_id == "root.call_1_0" and asked[0].data["root_run_id"] == "root"
            rt.approve(asked[0].run_id, asked[0].data["approval_id"])
        result = await within(run.wait(), "the lead to answer")
    assert result is not None and result.outcome == "done"
    published = [e for e in events if e.type == "tool_result" and e.data["name"] == "publish"]
    assert [(e.run_id, e.data["output"]) for e in published] == [("root.call_1_0", "published")]


def fixture_tree_rule(body: dict[str, Any]) -> dict[str, Any]:
    """The model of tests/fixtures/tree.py: the lead hands alpha and beta to researchers,
    each of which writes its topic down, then says it did."""
    done = tool_results(body)
    task = str(body["messages"][1]["content"])
    if system_of(body) == "LEAD":
        if done == 0:
            return {"calls": [("researcher", {"task": t}) for t in ("alpha", "beta")]}
        return {"text": "the lead's answer"}
    return {"calls": [("write", {"topic": task})]} if done == 0 else {"text": f"did {task}"}


def tree_after_a_crash(wire: WireServer, store: str, tmp_path: Path) -> None:
    """Killed while one child (beta) is inside a tool call and the other (alpha) has ended:
    after the resume alpha is not run again, beta's finished model call is not repeated and
    its interrupted call is reported as of unknown outcome, and the lead answers."""

    wire.rule = fixture_tree_rule
    program = [sys.executable, str(FIXTURES / "tree.py"), store]
    env = cli_env(OPENAI_BASE_URL=wire.url, TREE_DIR=str(tmp_path))
    first = warm.Popen(
        [*program, "start", "t-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, "HOLD_TOPIC": "beta"},
    )
    assert first.stdout is not None
    held = alpha_ended = False
    for line in first.stdout:
        event = orjson.loads(line)
        held = held or event["type"] == "write_started"
        alpha_ended = alpha_ended or (
            event["type"] == "run_finished" and event.get("parent_run_id") == "t-1"
        )
        if held and alpha_ended:
            first.send_signal(signal.SIGKILL)
            break
    first.wait()
    assert first.returncode == -signal.SIGKILL
    assert len(wire.requests) == 4  # the lead's first, alpha's two, beta's first

    again = warm.run(
        [*program, "resume", "t-1"], capture_output=True, text=True, env=env, timeout=120
    )
    assert again.returncode == 0, again.stderr
    events = [orjson.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    end = [e for e in events if e["type"] == "run_finished" and e["run_id"] == "t-1"]
    assert end and end[-1]["outcome"] == "done" and end[-1]["answer"] == "the lead's answer"
    by_task = collections.Counter(str(b["messages"][1]["content"]) for b in wire.requests)
    assert by_task == {"Research alpha and beta": 2, "alpha": 2, "beta": 2}
    assert (tmp_path / "writes.txt").read_text().split() == ["alpha"]
    beta_last = next(b for b in wire.requests[4:] if str(b["messages"][1]["content"]) == "beta")
    beta_results = [m["content"] for m in beta_last["messages"] if m["role"] == "tool"]
    assert len(beta_results) == 1 and beta_results[0].startswith("Outcome unknown")
    lead_last = wire.requests[-1]["messages"]
    assert [m["content"] for m in lead_last if m["role"] == "tool"] == ["did alpha", "did beta"]


def test_a_durable_tree_resumes_without_rerunning_a_finished_child_on_sqlite(
    wire: WireServer, tmp_path: Path
) -> None:
    tree_after_a_crash(wire, f"sqlite:///{tmp_path}/runs.sqlite", tmp_path)


def test_a_durable_tree_resumes_without_rerunning_a_finished_child_on_postgres(
    wire: WireServer, tmp_path: Path, postgres: str
) -> None:
    tree_after_a_crash(wire, postgres, tmp_path)


TREE_TOOLS = '''
from tether import Agent, ScriptedModel, reply, tool


@tool
def look_up(subject: str) -> str:
    """Look a subject up."""
    return f"notes on {subject}"


def turn(request):
    if any(m.role == "tool" for m in request.messages):
        return reply("the researcher found it")
    return reply(tool_calls=[("look_up", {"subject": request.messages[0].text})])


research = Agent(ScriptedModel([turn] * 8), [look_up], name="researcher").as_tool(
    name="research", description="Research a subject."
)
'''


@pytest.mark.parametrize("store", [False, True], ids=["journal", "store"])
def test_tether_run_shows_a_tree_and_tether_show_nests_it(tmp_path: Path, store: bool) -> None:
    """A tree from the command line (`--tools-from` a file with an agent as a tool): `--json`
    carries the child's events, and `tether show` prints the child inside its parent."""
    (tmp_path / "tree_tools.py").write_text(TREE_TOOLS)
    script = [{"tool_calls": [{"name": "research", "arguments": {"task": "tides"}}]}]
    (tmp_path / "lead.json").write_text(orjson.dumps([*script, {"text": "the lead"}]).decode())
    where = ["--store", f"sqlite:///{tmp_path / 'runs.sqlite'}"] if store else []
    data = ["--data-dir", str(tmp_path / "data")]
    ran = tether(
        "run", "Tides?", "--provider", "scripted", "--script", str(tmp_path / "lead.json"),
        "--tools-from", str(tmp_path / "tree_tools.py"), "--run-id", "lead-1", "--json",
        *where, *data,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    events = json_lines(ran.stdout)
    child = [e for e in events if e.get("parent_run_id") == "lead-1"]
    assert {e["run_id"] for e in child} == {"lead-1.call_1"}
    assert child[-1]["type"] == "run_finished" and child[-1]["outcome"] == "done"
    shown = tether("show", "lead-1", *where, *data)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    start = lines.index("    [lead-1.call_1]")
    assert lines[start - 1].startswith("  → research(")
    assert lines[start + 1 : start + 3] == [
        "    user: tides",
        '      → look_up({"subject":"tides"})',
    ]
    assert "    assistant: the researcher found it" in lines
    assert lines[lines.index("    [done]") + 1] == "  ← the researcher found it"


def test_an_allowance_refuses_at_each_limit_and_reserves_all_or_nothing() -> None:
    root = Allowance("root", max_calls=3, max_tokens=100, max_cost_usd=0.5)
    child = Allowance("root.c", max_calls=1, parent=root)
    assert child.reserve() == "" and (root.calls, child.calls) == (1, 1)
    refused = child.reserve()
    assert (
        refused
        == "max_steps: 1 model calls made by run root.c and the runs it started, the limit is 1"
    )
    assert (root.calls, child.calls) == (1, 1)  # refused: nothing reserved anywhere
    child.charge(Usage(input_tokens=60, output_tokens=39), 0.49)
    assert (root.tokens, child.tokens) == (99, 99)
    assert root.refusal() == ""  # one token and one cent under
    child.charge(Usage(output_tokens=1), 0.0)
    assert root.refusal() == (
        "max_tokens: 100 used by run root and the runs it started, the limit is 100"
    )
    root.tokens = 0
    assert root.refusal() == ""
    child.charge(Usage(), 0.01)
    assert root.refusal() == (
        "max_cost: $0.5000 spent by run root and the runs it started, the limit is $0.5"
    )


def test_a_child_run_id_is_a_valid_run_id_however_long_its_parents() -> None:
    assert child_run_id("lead-1", "call_7", "x") == "lead-1.call_7"
    assert child_run_id("lead-1", "toolu/01 a", "x") == "lead-1.toolu-01-a"
    assert child_run_id("lead-1", None, "f00d") == "lead-1.f00d"
    long = child_run_id("p" * 121, "call_12", "x")  # 129 characters in all
    assert long == "p" * 120 + ".call_12" and check_run_id(long) == long
    edge = "-" + "p" * 119  # 128 in all with ".call_12": kept whole, its first "-" too
    assert child_run_id(edge, "call_12", "x") == edge + ".call_12"
    deep = "a." * 70
    assert check_run_id(child_run_id(deep.rstrip("."), "c", "x")).endswith(".c")


async def test_a_tool_of_ones_own_starts_named_children_through_its_context(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    researcher = Agent(chat, [note], system="RESEARCHER", name="researcher")

    @tool
    async def compare(first: str, second: str, ctx: RunContext) -> str:
        """Research two topics side by side."""
        answers = await asyncio.gather(
            run_child(researcher, first, ctx, name="first"),
            run_child(researcher, second, ctx, name="second"),
        )
        return " | ".join(answers)

    def rule(body: dict[str, Any]) -> dict[str, Any]:
        if "LEAD" in system_of(body):
            if tool_results(body) == 0:
                return {"calls": [("compare", {"first": "tides", "second": "waves"}, "c1")]}
            return {"text": "compared"}
        return tree_rule(0)(body)

    wire.rule = rule
    lead = Agent(chat, [compare], system="LEAD", name="lead", budget=Budget(max_steps=9))
    async with Runtime(agents=[lead, researcher]) as rt:
        run = await rt.start("lead", "Compare tides and waves.", run_id="root")
        result = await within(run.wait(), "the lead to answer")
        assert result is not None and result.outcome == "done"
        (compared,) = [p for m in result.messages if m.role == "tool" for p in m.parts]
        assert compared.output == "found it | found it"
        for name, topic in (("first", "tides"), ("second", "waves")):
            child = rt.get(f"root.c1.{name}")
            assert child.status == "done" and child.transcript[0].text == topic
    assert len(wire.requests) == 6  # the lead's 2, each child's 2


def test_a_durable_childs_approval_waits_across_a_crash(wire: WireServer, tmp_path: Path) -> None:
    """Both children wait for approval when the process is killed; approved in the store
    while nothing runs (`tether approve CHILD_ID ...`), the resumed tree does each write once
    and repeats no model call."""

    wire.rule = fixture_tree_rule
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    program = [sys.executable, str(FIXTURES / "tree.py"), store]
    env = cli_env(OPENAI_BASE_URL=wire.url, TREE_DIR=str(tmp_path), TREE_APPROVAL="1")
    first = warm.Popen(
        [*program, "start", "t-2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    out = Output(first.stdout)  # read in a thread: a run that never asks fails the wait

    def both_asked() -> dict[str, str]:
        events = [orjson.loads(line) for line in list(out.lines)]
        asked = [e for e in events if e["type"] == "approval_requested"]
        assert all(e["root_run_id"] == "t-2" for e in asked)
        return {e["run_id"]: e["approval_id"] for e in asked} if len(asked) == 2 else {}

    try:
        asked = wait_until(both_asked, "both children to ask for approval", 60)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    assert len(wire.requests) == 3 and not (tmp_path / "writes.txt").exists()
    for child, approval in asked.items():
        approved = tether("approve", "--store", store, child, approval, env=env)
        assert approved.returncode == 0, approved.stderr
    again = warm.run(
        [*program, "resume", "t-2"], capture_output=True, text=True, env=env, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert sorted((tmp_path / "writes.txt").read_text().split()) == ["alpha", "beta"]
    by_task = collections.Counter(str(b["messages"][1]["content"]) for b in wire.requests)
    assert by_task == {"Research alpha and beta": 2, "alpha": 2, "beta": 2}


def test_calls_made_side_by_side_hold_their_expected_tokens_until_charged() -> None:
    """A tool's model calls on the run's behalf (an MCP server's sampling) may be in flight
    together: each holds what it is expected to use, so together they cannot pass a token
    limit that each alone would fit under; a charged or failed one lets go of its hold."""
    root = Allowance("root", max_tokens=500)
    child = Allowance("child", parent=root)
    assert child.reserve(300) == ""
    assert "max_tokens" in root.reserve(300)  # 300 held by the child's call: no room
    child.release(300)
    child.charge(Usage(input_tokens=100, output_tokens=50), 0.0)
    assert root.reserve(300) == "" and root.held == 300 and child.held == 0
