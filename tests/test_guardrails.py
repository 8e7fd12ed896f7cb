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

from helpers import FIXTURES, cli_env, until, within
from tether import Agent, Guardrail, HTTPSettings, OpenAIChatModel, Runtime, tool
from tether.events import Event
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
    """Killed inside a tool call after the input guardrail passed: the resumed run neither
    asks the guardrail again nor repeats the model call, and the output guardrail is asked
    once, on the answer."""
    wire.add(calls=[("hold", {})]).add(text="Done.")
    store = f"sqlite:///{tmp_path}/runs.sqlite"
    program = [sys.executable, str(FIXTURES / "guarded.py"), store]
    env = cli_env(OPENAI_BASE_URL=wire.url, GUARD_DIR=str(tmp_path))
    first = subprocess.Popen(
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
    again = subprocess.run(
        [*program, "resume", "g-1"], capture_output=True, text=True, env=env, timeout=120
    )
    assert again.returncode == 0, again.stderr
    asked = collections.Counter((tmp_path / "asked.txt").read_text().split())
    assert asked == {"input": 1, "output": 1}
    assert len(wire.requests) == 2
