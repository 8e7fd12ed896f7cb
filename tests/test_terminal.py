"""The terminal profile's habits, shown with scripted models and the wire mock: the model is
asked once to check its work before its answer is taken (and may use tools to do so); the
check is said as a user message, costs no answer when the budget has no room for it, and is
off outside the profile unless asked for. bash keeps a shell session (directory, variables)
from call to call."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import json_lines, running, tether
from tether import Agent, Budget, RunContext, tool
from tether.events import Event
from tether.providers.scripted import ScriptedModel, reply
from tether.terminal import TERMINAL_CHECK
from tether.tools.bash import session_tools
from wire_server import WireServer


@tool
def run_tests() -> str:
    """Run the project's tests."""
    return "3 passed"


async def test_the_model_checks_its_work_once_before_its_answer_is_taken() -> None:
    model = ScriptedModel(
        [
            reply("Fixed the bug."),
            reply(tool_calls=[("run_tests", {})]),
            reply("Fixed the bug; the 3 tests pass."),
        ]
    )
    agent = Agent(model, [run_tests], check="Check your work, then answer again.")
    events: list[Event] = []
    result = await agent.run("Fix the bug.", sinks=[events.append])

    assert result.outcome == "done" and result.answer == "Fixed the bug; the 3 tests pass."
    assert len(model.requests) == 3  # asked once: the second answer is taken
    asked = model.requests[1].messages
    assert asked[-2].text == "Fixed the bug." and asked[-1].role == "user"
    assert asked[-1].text == "Check your work, then answer again."
    said = [e.data for e in events if e.type == "user_message"]
    assert said == [{"text": "Check your work, then answer again.", "by": "check"}]
    assert result.steps == 3  # the check's calls count against the budget


async def test_with_no_room_in_the_budget_the_answer_is_taken_unchecked() -> None:
    model = ScriptedModel([reply("Done.")])
    agent = Agent(model, check=TERMINAL_CHECK, budget=Budget(max_steps=1))
    result = await agent.run("Do it.")
    assert result.outcome == "done" and result.answer == "Done."
    assert len(model.requests) == 1


async def test_no_check_unless_asked() -> None:
    model = ScriptedModel([reply("Done.")])
    result = await Agent(model).run("Do it.")
    assert result.outcome == "done" and len(model.requests) == 1


def requests_ending(wire: WireServer) -> list[str]:
    """The last message of each request the model server received."""
    return [str(body["messages"][-1]["content"]) for body in wire.requests]


@pytest.mark.parametrize(
    ("flags", "checked"),
    [(["--profile", "terminal"], True), (["--profile", "terminal", "--no-check"], False)],
    ids=["terminal", "no-check"],
)
def test_the_terminal_profile_checks_before_it_answers(
    wire: WireServer, tmp_path: Path, flags: list[str], checked: bool
) -> None:
    wire.add(text="Made it.").add(text="Made it, and checked.")
    p = tether(
        *("run", "Make a file.", "--base-url", wire.url, "--json", "--yolo", *flags),
        *("--workspace", str(tmp_path), "--store", "memory"),
        OPENAI_API_KEY="sk-t",
    )
    assert p.returncode == 0, p.stderr
    end = json_lines(p.stdout)[-1]
    if checked:
        assert requests_ending(wire) == ["Make a file.", TERMINAL_CHECK]
        assert end["answer"] == "Made it, and checked."
    else:
        assert requests_ending(wire) == ["Make a file."]
        assert end["answer"] == "Made it."


def test_check_is_asked_for_outside_the_profile_too(wire: WireServer) -> None:
    wire.add(text="One.").add(text="One, checked.")
    p = tether(
        *("run", "Count.", "--base-url", wire.url, "--json", "--tools", "none", "--check"),
        OPENAI_API_KEY="sk-t",
    )
    assert p.returncode == 0, p.stderr
    events: list[dict[str, Any]] = json_lines(p.stdout)
    said = [e for e in events if e["type"] == "user_message"]
    assert [e["text"] for e in said] == [TERMINAL_CHECK] and said[0]["by"] == "check"
    assert events[-1]["answer"] == "One, checked."
    assert json.dumps(wire.requests[1]).count("Before you finish") == 1


async def test_a_terminal_session_carries_its_directory_and_variables(tmp_path: Path) -> None:
    """As in a terminal: `cd` and variables set in one call hold in the next; a fresh
    session starts again from the workspace, with none."""
    (tmp_path / "build").mkdir()
    model = ScriptedModel(
        [
            reply(tool_calls=[("bash", {"command": "cd build && export MODE=fast; N=$'1\\n2'"})]),
            reply(tool_calls=[("bash", {"command": 'pwd; echo "$MODE"; echo "$N"'})]),
            reply(tool_calls=[("bash", {"command": "pwd; echo [$MODE]", "fresh": True})]),
            reply("Done."),
        ]
    )
    tools = session_tools()
    tools[0].approval = "never"
    result = await Agent(model, tools).run("Build.", context=RunContext(workspace=tmp_path))
    assert result.outcome == "done"
    outputs = [r.output for m in result.messages for r in m.tool_results]
    assert outputs == [
        "exit status 0\n",
        f"exit status 0\n{tmp_path / 'build'}\nfast\n1\n2\n",
        f"exit status 0\n{tmp_path}\n[]\n",
    ]


def test_the_cli_terminal_profile_keeps_a_session_and_plain_bash_does_not(
    wire: WireServer, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    for flags in (["--profile", "terminal", "--no-check"], ["--tools", "bash"]):
        wire.add(calls=[("bash", {"command": "cd src; X=7"})])
        wire.add(calls=[("bash", {"command": "echo $PWD:$X"})]).add(text="ok")
        p = tether(
            *("run", "Look.", "--base-url", wire.url, "--json", "--yolo", *flags),
            *("--workspace", str(tmp_path), "--store", "memory"),
            OPENAI_API_KEY="sk-t",
        )
        assert p.returncode == 0, p.stderr
        outputs = [e["output"] for e in json_lines(p.stdout) if e["type"] == "tool_result"]
        carried = flags[0] == "--profile"
        expected = f"{tmp_path / 'src'}:7" if carried else f"{tmp_path}:"
        assert outputs[1] == f"exit status 0\n{expected}\n", flags


WAITS_FOR_GO = "echo began; until [ -f go ]; do sleep 0.05; done; echo finished; exit 3"


async def test_a_command_that_outlasts_its_wait_goes_on_as_a_job(tmp_path: Path) -> None:
    """It is polled while it runs, seen to end with its status and output once it may
    finish, and a second one is stopped; one left running ends with the run."""
    go = tmp_path / "go"
    mark = f"tether-job-{tmp_path.name}"

    def let_it_finish(request: Any) -> Any:
        go.write_text("")  # the job may end now; the next poll waits for it
        return reply(tool_calls=[("bash_job", {"job": 1, "wait": 30})])

    model = ScriptedModel(
        [
            reply(tool_calls=[("bash", {"command": WAITS_FOR_GO, "wait": 0.2})]),
            reply(tool_calls=[("bash_job", {"job": 1})]),
            let_it_finish,
            reply(tool_calls=[("bash", {"command": f"exec -a {mark}-a sleep 300", "wait": 0})]),
            reply(tool_calls=[("bash_job", {"job": 2, "stop": True})]),
            reply(tool_calls=[("bash", {"command": f"exec -a {mark}-b sleep 300", "wait": 0})]),
            reply("Done."),
        ]
    )  # fmt: skip
    tools = session_tools()
    tools[0].approval = "never"
    result = await Agent(model, tools).run("Work.", context=RunContext(workspace=tmp_path))
    assert result.outcome == "done"
    outputs = [r.output for m in result.messages for r in m.tool_results]
    assert outputs[0].startswith("job 1 still running\nbegan\n")
    assert "bash_job(1) shows its output" in outputs[0]
    assert outputs[1] == "job 1 still running\nbegan\n"
    assert outputs[2] == "job 1 ended: exit status 3\nbegan\nfinished\n"
    assert outputs[3].startswith("job 2 still running")
    assert outputs[4] == "job 2 stopped\n" and not running(f"{mark}-a")
    assert outputs[5].startswith("job 3 still running")
    assert not running(f"{mark}-b")  # the run's end stopped it


DURABLE_JOB = """
import asyncio, json, os, sys, time
from pathlib import Path
from tether import Agent, RunContext, Runtime
from tether.providers.scripted import ScriptedModel, reply
from tether.tools.bash import session_tools

def running(mark):  # a process named so, but this one (whose arguments name it)
    found = False
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                found = found or mark.encode() in p.joinpath("cmdline").read_bytes()
            except OSError:
                pass
    return found

async def main(folder, mark):
    model = ScriptedModel([
        reply(tool_calls=[("bash", {"command": f"exec -a {mark} sleep 300", "wait": 0})]),
        reply("Done."),
    ])
    tools = session_tools()
    tools[0].approval = "never"
    async with Runtime(f"sqlite:///{folder}/runs.sqlite", [Agent(model, tools, name="t")]) as rt:
        run = await rt.start("t", "Work.", context=RunContext(workspace=Path(folder)))
        result = await run.wait()
        started = [r.output.split("\\n")[0] for m in result.messages for r in m.tool_results]
        deadline = time.monotonic() + 10  # the job ends with the run, not with the Runtime
        while running(mark) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        print(json.dumps({"answer": result.answer, "started": started, "left": running(mark)}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_a_durable_run_s_end_stops_the_jobs_it_left_running(tmp_path: Path) -> None:
    """On a store a run's tools live in the process that executes it, as in memory: the job a
    run left running ends with the run, not with the process (a worker serves runs for days).
    In a program of its own: a process has one store."""
    import sys

    import warm

    mark = f"tether-durable-job-{tmp_path.name}"
    try:
        done = warm.run(
            [sys.executable, "-c", DURABLE_JOB, str(tmp_path), mark],
            capture_output=True, text=True, timeout=60, env=warm.cli_env(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.splitlines()[-1])
        assert seen["answer"] == "Done." and seen["started"] == ["job 1 still running"]
        assert seen["left"] is False
    finally:
        subprocess.run(["pkill", "-KILL", "-f", mark], check=False)


async def test_polling_an_unknown_job_says_which_there_are(tmp_path: Path) -> None:
    model = ScriptedModel([reply(tool_calls=[("bash_job", {"job": 9})]), reply("ok")])
    result = await Agent(model, session_tools()).run("x", context=RunContext(workspace=tmp_path))
    (r,) = [r for m in result.messages for r in m.tool_results]
    assert r.output == "no job 9 in this session (jobs: none)"


async def test_each_run_numbers_its_own_jobs(tmp_path: Path) -> None:
    tools = session_tools()
    tools[0].approval = "never"
    said = []
    for _ in range(2):
        model = ScriptedModel(
            [reply(tool_calls=[("bash", {"command": "sleep 300", "wait": 0})]), reply("ok")]
        )
        result = await Agent(model, tools).run("x", context=RunContext(workspace=tmp_path))
        said += [r.output.split("\n")[0] for m in result.messages for r in m.tool_results]
    assert said == ["job 1 still running", "job 1 still running"]


async def test_a_forged_session_state_sets_variables_at_most(tmp_path: Path) -> None:
    """A command can read its call's session marker (it is in its shell's command line). It
    prints the marker with a state of its own, then kills its shell so the real state never
    comes: the next call restores that state. The forged state's code must not run there;
    its plain variables may be set (a command may set those in the session anyway), but not
    those that change how bash or every program runs."""
    planted = tmp_path / "planted"
    forged_state = (
        f"{tmp_path}\n"
        f"declare -- X=1; touch {planted}\n"
        f'declare -- Y="$(touch {planted})"\n'
        'declare -x KEPT="plain data"\n'
        f'declare -x LD_PRELOAD="{tmp_path}/evil.so"\n'
        f'declare -x BASH_ENV="{tmp_path}/evil.sh"\n'
        f'declare -- PROMPT_COMMAND="touch {planted}"\n'
        'declare -- IFS="/"\n'
        f'declare -x PATH="{tmp_path}/bin:/usr/bin:/bin"\n'
    )
    (tmp_path / "evil.sh").write_text(f"touch {planted}\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "base64").write_text(f"#!/bin/sh\ntouch {planted}\n")
    (tmp_path / "bin" / "base64").chmod(0o755)
    encoded = base64.b64encode(forged_state.encode()).decode()
    forge = (
        "mark=$(tr '\\0' '\\n' < /proc/$$/cmdline | grep -o '__tether_session_[0-9a-f]*__' "
        f"| head -n 1); printf '\\n%s\\n%s\\n' \"$mark\" {encoded}; kill -9 $$"
    )
    model = ScriptedModel(
        [
            reply(tool_calls=[("bash", {"command": forge})]),
            reply(tool_calls=[("bash", {"command": 'echo "[$X] [$KEPT] [$LD_PRELOAD$BASH_ENV]"'})]),
            reply("Done."),
        ]
    )
    tools = session_tools()
    tools[0].approval = "never"
    result = await Agent(model, tools).run("x", context=RunContext(workspace=tmp_path))
    outputs = [r.output for m in result.messages for r in m.tool_results]
    # the forged state was taken as data only, and never what changes how bash runs: no
    # LD_*, BASH_ENV, PROMPT_COMMAND or IFS; its PATH is carried, but the session's own lines
    # do not look there (its base64 never ran)
    assert "[] [plain data] []" in outputs[1], outputs
    assert not planted.exists()
