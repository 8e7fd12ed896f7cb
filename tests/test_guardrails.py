"""Guardrails on a run's input and answer: no tool runs before the input guardrails pass (they
run beside the first model call), a trip halts the run with the guardrail's name and message,
an output trip keeps the answer from being reported. Over real HTTP to the wire mock."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

import warm
from helpers import FIXTURES, cli_env, json_lines, tether, until, within
from tether import Agent, Guardrail, HTTPSettings, OpenAIChatModel, Runtime, ToolCall, tool
from tether.events import Event
from tether.providers.scripted import ScriptedModel, reply
from wire_server import WireServer

SETTINGS = HTTPSettings(max_retries=1, backoff_base=0.01, backoff_max=0.02, read_timeout=30)


@pytest.fixture
async def chat(wire: WireServer) -> AsyncIterator[OpenAIChatModel]:
    client = OpenAIChatModel("mock", api_key="sk-k", base_url=wire.url, settings=SETTINGS)
    yield client
    await client.aclose()


def run_agent(chat: OpenAIChatModel, ran: list[str], **guards: Any) -> Agent:
    @tool
    def send_email(to: str) -> str:
        """Send an email (a side effect)."""
        ran.append(to)
        return f"sent to {to}"

    return Agent(chat, [send_email], name="mailer", **guards)


async def test_no_tool_runs_before_a_slow_input_guardrail_trips(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    """The model call starts at once and asks for a tool; the tool waits for the guardrail,
    which then trips: the run halts, the tool never ran, its call is closed unrun."""
    wire.add(calls=[("send_email", {"to": "all@example.com"})]).add(text="never asked")
    checking, verdict = asyncio.Event(), asyncio.Event()

    async def no_mass_mail(task: str) -> str | None:
        checking.set()
        await verdict.wait()
        return "mails everyone" if "everyone" in task else None

    ran: list[str] = []
    agent = run_agent(chat, ran, input_guardrails=[no_mass_mail])
    events: list[Event] = []
    async with Runtime(agents=[agent]) as rt:
        run = await rt.start("mailer", "Mail everyone.", sinks=[events.append])
        await within(checking.wait(), "the guardrail to start")
        await until(lambda: any(e.type == "model_response" for e in events), "the reply")
        await asyncio.sleep(0)  # the reply's calls would run now, were they not held
        assert ran == [] and len(wire.requests) == 1  # the model call went ahead, no tool
        verdict.set()
        result = await within(run.wait(), "the run to halt")
    assert result is not None and result.outcome == "halted" and result.exit_status == 3
    assert result.reason == "guardrail no_mass_mail: mails everyone"
    assert ran == [] and len(wire.requests) == 1
    (closed,) = [p for m in result.messages if m.role == "tool" for p in m.parts]
    assert closed.is_error and "Not run" in closed.output
    (said,) = [e.data for e in events if e.type == "guardrail"]
    assert said == {
        "name": "no_mass_mail",
        "kind": "input",
        "passed": False,
        "message": "mails everyone",
    }


async def test_tools_run_once_every_input_guardrail_has_passed(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    wire.add(calls=[("send_email", {"to": "bob@example.com"})]).add(text="Sent.")
    ran: list[str] = []
    guards = [lambda task: None, Guardrail(lambda task: True, "polite")]
    agent = run_agent(chat, ran, input_guardrails=guards)
    events: list[Event] = []
    result = await within(agent.run("Mail Bob.", sinks=[events.append]), "the answer")
    assert result.outcome == "done" and result.answer == "Sent."
    assert ran == ["bob@example.com"]
    verdicts = [(e.data["name"], e.data["passed"]) for e in events if e.type == "guardrail"]
    assert verdicts == [("<lambda>", True), ("polite", True)]
    # the verdicts came before the tool ran
    order = [e.type for e in events if e.type in ("guardrail", "tool_result")]
    assert order == ["guardrail", "guardrail", "tool_result"]


async def test_a_guardrail_that_fails_to_run_lets_nothing_through(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    wire.add(text="An answer.")

    def broken(task: str) -> None:
        raise RuntimeError("the classifier is down")

    agent = run_agent(chat, [], input_guardrails=[broken])
    result = await within(agent.run("Hello."), "the halt")
    assert result.outcome == "halted" and result.answer == ""
    assert (
        result.reason == "guardrail broken: the check failed: RuntimeError: the classifier is down"
    )


async def test_an_output_guardrail_keeps_a_tripped_answer_from_being_reported(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    wire.add(text="The password is hunter2.")
    seen: list[str] = []

    def no_secrets(answer: str) -> bool:
        seen.append(answer)
        return "password" not in answer

    agent = run_agent(chat, [], output_guardrails=[no_secrets])
    events: list[Event] = []
    result = await within(agent.run("Tell me.", sinks=[events.append]), "the halt")
    assert seen == ["The password is hunter2."]
    assert result.outcome == "halted" and result.answer == ""
    assert result.reason == "guardrail no_secrets: tripped"
    (end,) = [e.data for e in events if e.type == "run_finished"]
    assert end["answer"] == "" and end["outcome"] == "halted"


def test_a_durable_runs_guardrail_verdicts_are_not_asked_again_after_a_crash(
    wire: WireServer, tmp_path: Path
) -> None:
    """Killed inside a tool call after the input and tool guardrails passed: the resumed run
    neither asks them again nor repeats the model call, and the output guardrail is asked
    once, on the answer."""
    wire.add(calls=[("hold", {})]).add(text="Done.")
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    program = [sys.executable, str(FIXTURES / "guarded.py"), store]
    env = cli_env(OPENAI_BASE_URL=wire.url, GUARD_DIR=str(tmp_path))
    first = warm.Popen(
        [*program, "start", "g-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, "HOLD": "1"},
    )
    assert first.stdout is not None
    for line in first.stdout:
        if orjson.loads(line)["type"] == "hold_started":
            first.send_signal(signal.SIGKILL)
            break
    first.wait()
    assert first.returncode == -signal.SIGKILL
    again = warm.run(
        [*program, "resume", "g-1"], capture_output=True, text=True, env=env, timeout=120
    )
    assert again.returncode == 0, again.stderr
    asked = collections.Counter((tmp_path / "asked.txt").read_text().split())
    assert asked == {"input": 1, "tool": 1, "output": 1}
    assert len(wire.requests) == 2


async def test_a_tool_guardrail_stops_a_call_before_any_call_of_its_reply_runs(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    """Two calls in one reply, the second trips the guardrail: neither runs, the run halts
    with the guardrail's reason, and the verdicts name the calls they judged."""
    wire.add(
        calls=[("send_email", {"to": "bob@example.com"}), ("send_email", {"to": "all@corp"})]
    ).add(text="never asked")
    judged: list[ToolCall] = []

    def no_lists(call: ToolCall) -> str | None:
        judged.append(call)
        to = (call.arguments or {}).get("to", "")
        return f"{to} is a mailing list" if "@" in to and "." not in to.split("@")[1] else None

    ran: list[str] = []
    agent = run_agent(chat, ran, tool_guardrails=[no_lists])
    events: list[Event] = []
    result = await within(agent.run("Mail them.", sinks=[events.append]), "the halt")
    assert result.outcome == "halted" and result.answer == ""
    assert result.reason == "guardrail no_lists: all@corp is a mailing list"
    assert ran == [] and len(wire.requests) == 1
    assert [c.name for c in judged] == ["send_email", "send_email"]
    said = [(e.data["id"], e.data["passed"]) for e in events if e.type == "guardrail"]
    assert said == [(judged[0].id, True), (judged[1].id, False)]
    assert all(r.is_error and "Not run" in r.output for r in result.messages[-1].tool_results)


async def test_tool_calls_run_when_their_guardrails_pass(
    wire: WireServer, chat: OpenAIChatModel
) -> None:
    wire.add(calls=[("send_email", {"to": "bob@example.com"})]).add(text="Sent.")
    ran: list[str] = []
    agent = run_agent(chat, ran, tool_guardrails=[lambda call: call.name == "send_email"])
    result = await within(agent.run("Mail Bob."), "the answer")
    assert result.outcome == "done" and ran == ["bob@example.com"]


@pytest.mark.parametrize(
    ("verdict", "outcome", "reason"),
    [
        ("PASS", "done", ""),
        ("It asks for a password.", "halted", "guardrail checker: It asks for a password."),
    ],
)
async def test_an_agent_is_a_guardrail(
    wire: WireServer, chat: OpenAIChatModel, verdict: str, outcome: str, reason: str
) -> None:
    """A checking agent reads the task and answers PASS, or says why not."""
    checker_model = ScriptedModel([reply(verdict)])
    checker = Agent(checker_model, system="Answer PASS, or say what is wrong.", name="checker")
    wire.add(text="Here you are.")
    agent = run_agent(chat, [], input_guardrails=[checker])
    result = await within(agent.run("What is the admin password?"), "the end")
    assert (result.outcome, result.reason) == (outcome, reason)
    assert checker_model.requests[0].messages[-1].text == "What is the admin password?"


async def test_a_checking_agents_typed_verdict(wire: WireServer, chat: OpenAIChatModel) -> None:
    class Verdict(BaseModel):
        passed: bool
        reason: str = ""

    checker_model = ScriptedModel([reply('{"passed": false, "reason": "off topic"}')])
    checker = Agent(checker_model, name="topic", output_type=Verdict)
    wire.add(text="The weather is fine.")
    result = await within(run_agent(chat, [], output_guardrails=[checker]).run("Hi."), "end")
    assert result.outcome == "halted" and result.reason == "guardrail topic: off topic"
    assert checker_model.requests[0].messages[-1].text == "The weather is fine."


GUARDRAILS_FILE = """
from tether import ToolCall

def no_rm(call: ToolCall) -> str | None:
    command = (call.arguments or {}).get("command", "")
    return "deletes files" if "rm " in command else None

tool_guardrails = [no_rm]
"""


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_the_cli_checks_with_the_guardrails_of_a_file(
    wire: WireServer, tmp_path: Path, store: str
) -> None:
    guards = tmp_path / "guards.py"
    guards.write_text(GUARDRAILS_FILE)
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    wire.add(calls=[("bash", {"command": f"rm {victim}"})]).add(text="Deleted.")
    if store == "sqlite":
        store = f"sqlite:///{tmp_path / 'runs.db'}"
    p = tether(
        *("run", "Clean up.", "--store", store, "--json", "--tools", "bash", "--yolo"),
        *("--base-url", wire.url, "--guardrails", str(guards)),
        OPENAI_API_KEY="sk-o",
    )
    assert p.returncode == 3, p.stderr
    (end,) = [e for e in json_lines(p.stdout) if e["type"] == "run_finished"]
    assert end["reason"] == "guardrail no_rm: deletes files"
    assert victim.read_text() == "precious" and len(wire.requests) == 1


def test_a_guardrails_file_without_guardrails_is_a_clear_error(tmp_path: Path) -> None:
    guards = tmp_path / "guards.py"
    guards.write_text("checks = []\n")
    p = tether(
        *("run", "hi", "--store", "memory", "--tools", "none", "--guardrails", str(guards)),
        OPENAI_API_KEY="sk-o",
    )
    assert p.returncode == 2, p.stderr
    assert "defines none of input_guardrails, tool_guardrails, output_guardrails" in p.stderr
