"""MCP both ways, with real processes built with the mcp SDK: a run that uses an MCP server's
tool (stdio and streamable HTTP), and an MCP client that uses Tether's tools and agent."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env, free_port, wait_until
from wire_server import WireServer

pytest.importorskip("mcp", reason="needs the mcp extra")

from tether.tools.mcp import MCPApproval

SERVER = f"{sys.executable} {FIXTURES / 'mcp_server.py'}"
RESERVE_UNASKED = ("--mcp-approve", "reserve=never")
"""`reserve` changes the stock, and its server does not mark it read-only, so its calls wait for
approval; where a test is about its question, not its approval, it is run without."""


def run_with_mcp(wire: WireServer, mcp: str, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    p = warm.run(
        [
            *TETHER,
            "run",
            "how many apples and plums?",
            "--base-url",
            wire.url,
            "--json",
            "--tools",
            "none",
            "--mcp",
            mcp,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(OPENAI_API_KEY="k"),
    )
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()]


def test_a_run_uses_an_mcp_servers_tools_over_stdio(wire: WireServer) -> None:
    wire.add(calls=[("stock", {"item": "apples"}), ("stock", {"item": "plums"})])
    wire.add(text="12 apples; plums are unknown.")
    status, events = run_with_mcp(wire, SERVER)
    assert status == 0
    results = {e["id"]: e for e in events if e["type"] == "tool_result"}
    calls = [e for e in events if e["type"] == "tool_call"]
    apples, plums = (results[c["id"]] for c in calls)
    assert (apples["output"], apples["is_error"]) == ("12 apples in stock", False)
    assert plums["is_error"] and "stock" in plums["output"]  # the server's error result
    tools = {t["function"]["name"]: t["function"] for t in wire.requests[0]["tools"]}
    assert set(tools) == {
        "stock", "slow", "chart", "reserve", "subscribe", "summarize", "ramble"
    }  # fmt: skip
    assert tools["stock"]["parameters"]["required"] == ["item"]


def serving(fixture: str, *args: str) -> Iterator[str]:
    """An MCP server of the fixtures over streamable HTTP on a free port (its first
    arguments before the port's), its URL once it listens; stopped after."""
    port = free_port()
    argv = [sys.executable, str(FIXTURES / fixture), *args, str(port)]
    proc = warm.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return False
        return True

    wait_until(listening, "the MCP server to listen", 30, 0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def http_server() -> Iterator[str]:
    yield from serving("mcp_server.py", "http")


def test_a_run_uses_an_mcp_server_over_streamable_http(wire: WireServer, http_server: str) -> None:
    wire.add(calls=[("stock", {"item": "pears"})]).add(text="No pears.")
    status, events = run_with_mcp(wire, http_server)
    assert status == 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == "0 pears in stock"


@pytest.fixture
def sse_server() -> Iterator[str]:
    """`mcp_http_raw.py`: a handshake-era server, every answer a server-sent event."""
    yield from serving("mcp_http_raw.py")


@pytest.fixture
def forgetful_server() -> Iterator[str]:
    yield from serving("mcp_http_raw.py", "forget")


def test_a_result_over_a_mebibyte_comes_over_http(wire: WireServer, sse_server: str) -> None:
    """The SDK reads a server's event stream an event at most 1 MiB long: a 1.5 MB result (a
    file read, a page fetched) failed the call. It reaches the model, kept as any long result
    is."""
    wire.add(calls=[("dump", {"size": 1_500_000})]).add(text="Long.")
    status, events = run_with_mcp(wire, sse_server)
    assert status == 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert not result["is_error"], result["output"][:300]
    out = result["output"]
    assert out.startswith("Axxx") and out.endswith("xxxZ")
    assert "1300002 characters of the result cut" in out


def test_a_server_that_forgot_the_session_gets_a_new_one(
    wire: WireServer, forgetful_server: str
) -> None:
    """A remote server that restarted answers our session id with 404 ("Session not found"):
    as the spec says, the client starts a new session, and the run's later calls work (they
    failed, each, for the rest of the run)."""
    wire.add(calls=[("stock", {"item": "apples"})])
    wire.add(calls=[("stock", {"item": "pears"})])
    wire.add(calls=[("stock", {"item": "plums"})]).add(text="Done.")
    status, events = run_with_mcp(wire, forgetful_server)
    assert status == 0
    results = [(e["output"], e["is_error"]) for e in events if e["type"] == "tool_result"]
    assert results == [
        ("12 apples in stock (session 1)", False),
        ("12 pears in stock (session 2)", False),
        ("12 plums in stock (session 3)", False),
    ]


def test_an_unreachable_mcp_server_is_a_clear_error(wire: WireServer) -> None:
    p = warm.run(
        [*TETHER, "run", "x", "--base-url", wire.url, "--mcp", "http://127.0.0.1:9/mcp"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(OPENAI_API_KEY="k"),
    )
    assert p.returncode == 2 and "cannot reach the server" in p.stderr
    assert "http://127.0.0.1:9/mcp" in p.stderr  # which server
    assert "All connection attempts failed" in p.stderr, p.stderr  # and why (no TaskGroup)
    assert "Traceback" not in p.stderr


async def test_an_mcp_client_uses_tethers_tools_and_agent(tmp_path: Path, wire: WireServer) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    (tmp_path / "notes.txt").write_text("remember the milk")
    wire.add(calls=[("read_file", {"path": "notes.txt"})]).add(text="The note says: milk.")
    env = cli_env(OPENAI_API_KEY="k")
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "tether",
            "mcp-serve",
            "--base-url",
            wire.url,
            "--tools",
            "read_file,list_files",
            "--workspace",
            str(tmp_path),
        ],
        env=env,
    )
    async with Client(params) as client:
        listed = await client.list_tools()
        names = {t.name for t in listed.tools}
        assert {"list_files", "read_file", "run_agent", "start_run", "decide_call"} <= names
        hints = {t.name: t.annotations for t in listed.tools}
        assert hints["read_file"].read_only_hint and not hints["run_agent"].read_only_hint
        read = await client.call_tool("read_file", {"path": "notes.txt"})
        assert read.content[0].text == "remember the milk" and not read.is_error
        outside = await client.call_tool("read_file", {"path": "../../etc/passwd"})
        assert outside.is_error and "outside the workspace" in outside.content[0].text
        answer = await client.call_tool("run_agent", {"task": "What does my note say?"})
        assert not answer.is_error and answer.content[0].text == "The note says: milk."
    assert wire.requests[1]["messages"][-1]["content"] == "remember the milk"


async def test_mcp_serves_a_halted_agent_run_as_an_error_not_an_answer(
    tmp_path: Path, wire: WireServer
) -> None:
    """`run_agent` of a run that a budget halted: the caller learns it halted and why, as an
    error result; its partial answer went back as a success."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    (tmp_path / "notes.txt").write_text("remember the milk")
    wire.add(text="Let me look.", calls=[("read_file", {"path": "notes.txt"})])
    wire.add(text="The note says: milk.")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tether", "mcp-serve", "--base-url", wire.url, "--tools", "read_file",
              "--workspace", str(tmp_path), "--max-steps", "1"],
        env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip
    async with Client(params) as client:
        answer = await client.call_tool("run_agent", {"task": "What does my note say?"})
    assert answer.is_error, answer
    assert "the agent run halted: max_steps" in answer.content[0].text
    assert len(wire.requests) == 1


async def test_mcp_serve_keeps_its_runs_in_the_store_it_is_given(
    tmp_path: Path, wire: WireServer
) -> None:
    """`tether mcp-serve --store URL` ran `run_agent`'s runs in memory all the same: now they
    are kept in the store, listed by `tether runs` and shown by `tether show`."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from helpers import tether

    store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    wire.add(text="Kept.")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tether", "mcp-serve", "--base-url", wire.url, "--tools", "none",
              "--workspace", str(tmp_path), "--store", store],
        env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip
    async with Client(params) as client:
        answer = await client.call_tool("run_agent", {"task": "Keep this."})
    assert not answer.is_error and answer.content[0].text == "Kept."
    listed = tether("runs", "--store", store, "--json", env=cli_env()).stdout.splitlines()
    assert [(json.loads(r)["task"], json.loads(r)["state"]) for r in listed] == [
        ("Keep this.", "done")
    ]


def mcp_serve_http(tmp_path: Path, wire: WireServer, *extra: str) -> tuple[Any, str]:
    """`tether mcp-serve --http --port 0 ...` started; the process and the address it printed."""
    proc = warm.Popen(
        [*TETHER, "mcp-serve", "--http", "--port", "0", "--base-url", wire.url,
         "--tools", "read_file", "--workspace", str(tmp_path), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("tether mcp-serve: http://"):
            return proc, line.split()[2].rstrip(";")
    raise AssertionError(f"mcp-serve did not start: {proc.wait(10)}")


async def test_mcp_serve_over_http_needs_its_token(tmp_path: Path, wire: WireServer) -> None:
    """Tools and run_agent over streamable HTTP with the printed token; without it, 401; with
    a Host header that is not this machine's (DNS rebinding), refused."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    (tmp_path / "notes.txt").write_text("remember the milk")
    wire.add(text="The agent was here.")
    proc, url = mcp_serve_http(tmp_path, wire, "--token", "s3cret")
    try:
        headers = {"Authorization": "Bearer s3cret"}
        http = create_mcp_http_client(headers=headers)
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            assert {"read_file", "run_agent", "start_run"} <= set(names)
            read = await client.call_tool("read_file", {"path": "notes.txt"})
            assert read.content[0].text == "remember the milk"
            answer = await client.call_tool("run_agent", {"task": "Say hello."})
            assert answer.content[0].text == "The agent was here."
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        accept = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient() as plain:
            refused = await plain.post(url, json=ping, headers=accept)
            assert refused.status_code == 401
            wrong = await plain.post(
                url, json=ping, headers={**accept, "Authorization": "Bearer x"}
            )
            assert wrong.status_code == 401
            rebound = await plain.post(
                url, json=ping, headers={**accept, **headers, "Host": "evil.example"}
            )
            assert rebound.status_code == 421
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_durable_run_uses_an_mcp_servers_tools(wire: WireServer, tmp_path: Path) -> None:
    """The worker of a durable run (here the CLI process) reopens the servers from the run's
    options; the tool result is recorded like any other."""
    pytest.importorskip("dbos", reason="needs the durable extra")
    wire.add(calls=[("stock", {"item": "apples"})]).add(text="12 apples.")
    status, events = run_with_mcp(wire, SERVER, "--store", f"sqlite:///{tmp_path}/runs.sqlite")
    assert status == 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert (result["output"], result["is_error"]) == ("12 apples in stock", False)
    assert events[-1]["type"] == "run_finished" and events[-1]["answer"] == "12 apples."


def test_a_tool_name_clash_is_a_clear_error_and_stops_the_server(
    wire: WireServer, tmp_path: Path
) -> None:
    server = tmp_path / "clashing_mcp_server.py"  # a name no other process has
    server.write_text((FIXTURES / "mcp_server.py").read_text())
    mine = tmp_path / "my_tools.py"
    mine.write_text(
        "from tether import tool\n\n\n@tool\ndef stock(item: str) -> str:\n"
        '    """Mine."""\n    return item\n'
    )
    mcp = f"{sys.executable} {server}"
    p = warm.run(
        [*TETHER, "run", "x", "--base-url", wire.url, "--tools-from", str(mine), "--mcp", mcp],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(OPENAI_API_KEY="sk-test"),
    )
    assert p.returncode == 2, p.stderr
    assert "two tools are named 'stock'" in p.stderr and "Traceback" not in p.stderr
    assert f"--mcp-prefix '{mcp}=PREFIX'" in p.stderr  # how to mend it
    left = [
        d.name
        for d in Path("/proc").iterdir()
        if d.name.isdigit() and str(server) in read_cmdline(d)
    ]
    assert left == []
    assert wire.requests == []


def read_cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_mcp_tools_obey_the_tool_timeout(wire: WireServer) -> None:
    wire.add(calls=[("slow", {"seconds": 30})]).add(text="It was too slow.")
    started = time.monotonic()
    status, events = run_with_mcp(wire, SERVER, "--tool-timeout", "1")
    assert status == 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] and "timed out after 1 s" in result["output"], result
    assert time.monotonic() - started < 25  # not the tool's 30 s


def test_images_and_resources_in_mcp_results_reach_the_model(wire: WireServer) -> None:
    """The chart's text and its resource as text; its image as an image, as Chat takes one
    from a tool (a user message after the tool message)."""
    wire.add(calls=[("chart", {"item": "apples"})]).add(text="Here is the chart.")
    status, events = run_with_mcp(wire, SERVER)
    assert status == 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == "stock of apples\n[resource stock://apples]\napples,12"
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 1000
    (image,) = result["images"]
    assert image == {
        "media_type": "image/png",
        "sha256": hashlib.sha256(png).hexdigest(),
        "bytes": 1008,
    }
    shown = wire.requests[1]["messages"][-1]
    assert shown["role"] == "user"
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert shown["content"][1] == {"type": "image_url", "image_url": {"url": url}}


RAW = str(FIXTURES / "mcp_raw.py")


def run_tether(*args: str) -> subprocess.CompletedProcess[str]:
    return warm.run([*TETHER, *args], capture_output=True, text=True, timeout=120, env=cli_env())


def test_an_image_only_result_reaches_the_model_once_as_an_image(tmp_path: Path) -> None:
    """A tool whose result is one image, with the structured copy of it that some servers add
    (server-everything's): the model is shown the image once, no text copy of it (the copy
    went too, 200 k characters of base64)."""
    script = tmp_path / "picture.json"
    script.write_text(json.dumps([{"tool_calls": [{"name": "picture", "arguments": {}}]},
                                  {"text": "ok"}]))  # fmt: skip
    p = run_tether(
        "run", "x", "--provider", "scripted", "--script", str(script), "--store", "memory",
        "--mcp", f"{sys.executable} {RAW} picture", "--json", "--mcp-approve", "never",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    result = next(e for e in map(json.loads, p.stdout.splitlines()) if e["type"] == "tool_result")
    assert len(result["output"]) < 1_000 and len(result.get("images", [])) == 1, result


def answer_script(tmp_path: Path) -> str:
    script = tmp_path / "answer.json"
    script.write_text(json.dumps([{"text": "ok"}]))
    return str(script)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("hang", "did not list its tools within 2 s"),
        ("bad-schema", "tool 'broken' has an invalid input schema"),
    ],
)
def test_a_server_that_never_lists_or_lists_a_bad_schema_is_one_line(
    mode: str, said: str, tmp_path: Path
) -> None:
    """One that never answered its tool list hung `tether run` for ever; a bad schema was a
    traceback."""
    p = run_tether(
        "run", "x", "--provider", "scripted", "--script", answer_script(tmp_path),
        "--store", "memory",
        "--mcp", f"{sys.executable} {RAW} {mode}", "--connect-timeout", "2",
    )  # fmt: skip
    assert p.returncode == 2 and said in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr


def test_a_huge_result_reaches_the_model_as_its_head_and_tail(tmp_path: Path) -> None:
    script = tmp_path / "dump.json"
    call = {"name": "dump", "arguments": {}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "ok"}]))
    p = run_tether(
        "run", "x", "--provider", "scripted", "--script", str(script), "--store", "memory",
        "--mcp", f"{sys.executable} {RAW} huge", "--json", "--mcp-approve", "dump=never",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    result = next(e for e in map(json.loads, p.stdout.splitlines()) if e["type"] == "tool_result")
    out = result["output"]
    assert out.startswith("Axxx") and out.endswith("xxxZ") and len(out) < 300_000
    assert "4800000 characters of the result cut" in out


# -- a server's questions (elicitation) and progress --------------------------------------------


def questions_run(wire: WireServer, mcp: str, call: str, *extra: str) -> list[dict[str, Any]]:
    arguments = {"item": "apples"} if call == "reserve" else {}
    wire.add(calls=[(call, arguments)]).add(text="Done.")
    status, events = run_with_mcp(wire, mcp, *extra)
    assert status == 0
    return events


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_approve_auto_answers_a_question_with_its_defaults_and_progress_is_shown(
    wire: WireServer, transport: str, request: pytest.FixtureRequest
) -> None:
    mcp = SERVER if transport == "stdio" else request.getfixturevalue("http_server")
    events = questions_run(wire, mcp, "reserve", "--approve", "auto")
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == "reserved 2 apples"
    call_id = result["id"]
    asked = next(e for e in events if e["type"] == "question_asked")
    assert asked["message"] == "How many apples should be reserved?"
    assert asked["id"] == call_id and asked["asker"] == mcp
    assert set(asked["schema"]["properties"]) == {"quantity", "express"}
    answered = next(e for e in events if e["type"] == "question_answered")
    assert (answered["question_id"], answered["action"]) == (asked["question_id"], "accept")
    progress = [e for e in events if e["type"] == "tool_progress"]
    assert [(p["id"], p["progress"], p["total"], p["message"]) for p in progress] == [
        (call_id, 1, 2, "checking the stock"),
        (call_id, 2, 2, "done"),
    ]
    types = [e["type"] for e in events]  # in the order they happened, within the call
    assert types.index("tool_call") < types.index("question_asked")
    assert types.index("question_answered") < types.index("tool_progress")
    assert types.index("tool_progress") < types.index("tool_result")


def test_a_value_only_a_person_knows_is_never_made_up(wire: WireServer) -> None:
    """--approve auto declines a question with a field that has no default."""
    events = questions_run(wire, SERVER, "subscribe", "--approve", "auto")
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == "not subscribed: the user chose decline"
    answered = next(e for e in events if e["type"] == "question_answered")
    assert answered["action"] == "decline" and "no default" in answered["reason"]


def test_with_no_one_to_ask_a_question_is_declined_at_once(wire: WireServer) -> None:
    """--approve ask with no terminal (stdin is not one here) and a run in memory, which no
    one elsewhere can answer: declined, never left hanging."""
    events = questions_run(wire, SERVER, "reserve", "--store", "memory", *RESERVE_UNASKED)
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == "no reservation: the user chose decline"


def test_a_durable_runs_question_waits_for_tether_answer_across_a_kill(
    wire: WireServer, tmp_path: Path
) -> None:
    """No terminal, a store: the question waits, as an approval does, and the run says how to
    answer it. Killed while it waits; `tether answer` keeps the answer in the store (checked
    against the question, once); the resumed run makes the call again (the server says it is
    idempotent) and its question, asked again, is answered from the store at once."""
    from helpers import Output, tether

    store = f"sqlite:///{tmp_path}/runs.sqlite"
    wire.add(calls=[("reserve", {"item": "apples"})]).add(text="Reserved.")
    proc = warm.Popen(
        [*TETHER, "run", "reserve apples", "--base-url", wire.url, "--json", "--tools", "none",
         "--mcp", SERVER, "--store", store, "--run-id", "q-1", *RESERVE_UNASKED],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip
    try:
        said = Output(proc.stderr).wait_for("waits for an answer")
        out = Output(proc.stdout)
        asked = json.loads(out.wait_for('"question_asked"'))
    finally:
        proc.kill()
        proc.wait()
    question = asked["question_id"]
    assert f"tether answer q-1 {question} JSON" in said
    listed = tether("runs", "--store", store).stdout
    assert (
        f"interrupted: its process died (tether resume q-1); waits for an answer ({question})"
        in listed
    )
    shown = tether("show", "q-1", "--store", store).stdout
    assert f"[waiting for an answer ({question})] tether answer q-1 {question} JSON" in shown
    answer = ("answer", "q-1", question)
    bad = tether(*answer, '{"quantity": "many"}', "--store", store)
    assert bad.returncode == 2 and "does not fit" in bad.stderr, bad.stderr
    given = tether(*answer, '{"quantity": 3, "express": true}', "--store", store)
    assert given.returncode == 0 and given.stdout.strip() == f"answered: {question} of run q-1"
    again = tether(*answer, "--decline", "--store", store)
    assert again.returncode == 2 and "answered already" in again.stderr
    resumed = tether("resume", "q-1", "--store", store, "--json", env=cli_env(OPENAI_API_KEY="k"))
    assert resumed.returncode == 0, resumed.stderr
    events = [json.loads(line) for line in resumed.stdout.splitlines()]
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == "reserved 3 apples by express"
    (asked_again,) = [e for e in events if e["type"] == "question_asked"]
    assert asked_again["question_id"] == question  # the same question, answered from the store
    (answered,) = [e for e in events if e["type"] == "question_answered"]
    assert answered["action"] == "accept"
    assert events[-1]["answer"] == "Reserved." and len(wire.requests) == 2


async def test_the_terminal_asks_each_field_and_checks_what_is_typed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A typo is asked again; an empty line takes the default; the answer fits the schema."""
    import io

    from tether.cli.common import TerminalAsker
    from tether.questions import Question

    schema = {
        "type": "object",
        "properties": {
            "quantity": {"type": "integer", "default": 2},
            "express": {"type": "boolean", "default": False},
            "note": {"type": "string"},
        },
        "required": ["note"],
    }
    question = Question("How many apples?", schema, "inventory")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\nfive\n5\n\nleave at the door\n"))
    err = io.StringIO()
    answer = await TerminalAsker(err)(question)
    assert (answer.action, answer.content) == (
        "accept",
        {"quantity": 5, "express": False, "note": "leave at the door"},
    )
    shown = err.getvalue()
    assert "inventory asks: How many apples?" in shown
    assert "invalid literal" in shown  # "five" was asked again

    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    declined = await TerminalAsker(io.StringIO())(question)
    assert declined.action == "decline" and declined.content is None

    # a required field left empty does not fit: asked again, all of it
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n\n\n\n\n\nnow\n"))
    err = io.StringIO()
    answer = await TerminalAsker(err)(question)
    assert answer.content == {"quantity": 2, "express": False, "note": "now"}
    assert "that does not fit: the answer: 'note' is a required property" in err.getvalue()


# -- a server's sampling: the run's model, on the run's budget ----------------------------------


@pytest.mark.parametrize("store", ["durable", "memory"])
def test_a_servers_sampling_is_answered_by_the_runs_model_and_counted(
    wire: WireServer, store: str
) -> None:
    """In memory and on a store (where the usage is recorded with the call's result)."""
    wire.add(calls=[("summarize", {"text": "apples are red and sweet"})])
    wire.add(text="Apples: red, sweet fruit.", usage={"prompt": 30, "completion": 7})
    wire.add(text="Done.")
    extra = ("--store", "memory") if store == "memory" else ()
    status, events = run_with_mcp(wire, SERVER, "--max-steps", "3", *extra)
    assert status == 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == "summary: Apples: red, sweet fruit."
    assert result["usage"]["input_tokens"] == 30 and result["usage"]["output_tokens"] == 7
    sampled = next(e for e in events if e["type"] == "sampled")
    assert (sampled["id"], sampled["asker"]) == (result["id"], SERVER)
    assert sampled["text"] == "Apples: red, sweet fruit."
    # the server's request reached the run's model as it was sent, with its output limit
    asked = wire.requests[1]
    assert asked["messages"][-1]["content"] == "Summarize in five words: apples are red and sweet"
    assert asked.get("max_completion_tokens", asked.get("max_tokens")) == 50
    # the run's usage counts the three model calls; steps count the run's own two
    finished = events[-1]
    assert finished["type"] == "run_finished"
    assert finished["usage"]["input_tokens"] == 50 + 30 + 50
    assert finished["steps"] == 2


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_a_servers_sampling_in_a_loop_stops_at_the_runs_token_limit(
    wire: WireServer, store: str, tmp_path: Path
) -> None:
    """Thirty sampling requests in one tool call, each a model call of the run: checked
    against the run's --max-tokens before it is made (it spent 60,006 tokens against 600)."""
    wire.add(calls=[("ramble", {})], usage={"prompt": 50, "completion": 10})
    for _ in range(30):
        wire.add(text="words", usage={"prompt": 100, "completion": 100})
    wire.add(text="Done.")
    where = "memory" if store == "memory" else f"sqlite:///{tmp_path / 'runs.db'}"
    status, events = run_with_mcp(wire, SERVER, "--max-tokens", "600", "--store", where)
    result = next(e for e in events if e["type"] == "tool_result")
    sampled = [e for e in events if e["type"] == "sampled"]
    assert result["is_error"] and "over the run's budget: max_tokens" in result["output"]
    assert 1 <= len(sampled) <= 4 and len(wire.requests) == 1 + len(sampled)  # no more sent
    finished = events[-1]
    assert (status, finished["outcome"]) == (3, "halted")
    used = finished["usage"]["input_tokens"] + finished["usage"]["output_tokens"]
    assert used <= 600 + 200  # at most the one call whose estimate was under its use


def test_a_servers_sampling_in_a_loop_stops_at_the_accounts_limit(
    wire: WireServer, tmp_path: Path
) -> None:
    """The same against an account's token limit, on a store: each request is reserved
    against the account and counted in its ledger (it recorded 12 of 60,012 tokens)."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    env = cli_env(OPENAI_API_KEY="k")
    limits = warm.run(
        [*TETHER, "limits", "set", "acme", "--tokens-total", "600", "--store", store],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert limits.returncode == 0, limits.stderr
    wire.add(calls=[("ramble", {})], usage={"prompt": 50, "completion": 10})
    for _ in range(30):
        wire.add(text="words", usage={"prompt": 100, "completion": 100})
    wire.add(text="Done.")
    status, events = run_with_mcp(wire, SERVER, "--account", "acme", "--store", store)
    result = next(e for e in events if e["type"] == "tool_result")
    sampled = [e for e in events if e["type"] == "sampled"]
    assert result["is_error"], result
    assert "over the run's budget: account budget: acme has used" in result["output"]
    assert 1 <= len(sampled) <= 4 and len(wire.requests) == 1 + len(sampled)
    shown = warm.run(
        [*TETHER, "limits", "acme", "--store", store, "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    standing = json.loads(shown.stdout)
    counted = standing["spent"]["total"]["tokens"]
    assert counted == 60 + 200 * len(sampled)  # every call the run made, sampled ones too
    assert standing["held"]["total"]["tokens"] == 0
    assert status == 3


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_an_mcp_tool_that_changes_things_follows_the_runs_approval_policy(
    wire: WireServer, store: str, tmp_path: Path
) -> None:
    """MCP tools were built with approval "never": server-filesystem's `write_file`, marked
    destructive, ran under `--approve deny`. Now a tool its server does not mark read-only
    (`reserve`) waits for approval as bash does, denied here; a read-only one (`stock`) runs;
    `--mcp-approve` says otherwise per tool, or for all."""
    where = "memory" if store == "memory" else f"sqlite:///{tmp_path / 'runs.db'}"

    def reserved(*extra: str) -> dict[str, dict[str, Any]]:
        wire.add(calls=[("stock", {"item": "apples"}), ("reserve", {"item": "apples"})])
        wire.add(text="Done.")
        status, events = run_with_mcp(wire, SERVER, "--store", where, *extra)
        assert status == 0
        return {e["name"]: e for e in events if e["type"] == "tool_result"}

    denied = reserved("--approve", "deny")
    assert not denied["stock"]["is_error"]  # read-only: not asked
    assert denied["reserve"]["is_error"] and "not approved" in denied["reserve"]["output"]
    assert "reserved" not in denied["reserve"]["output"]
    unasked = reserved("--approve", "deny", "--mcp-approve", "reserve=never")
    assert unasked["reserve"]["output"].startswith("no reservation")  # ran: declined question
    server_wide = reserved("--approve", "deny", "--mcp-approve", f"{SERVER}#reserve=never")
    assert not server_wide["reserve"]["output"].startswith("The call was not approved")
    everything = reserved("--approve", "deny", "--mcp-approve", "always")
    assert all(r["is_error"] for r in everything.values())
    script = answer_script(tmp_path)
    bad = run_tether("run", "x", "--mcp", SERVER, "--mcp-approve", "sometimes", "--provider",
                     "scripted", "--script", script, "--store", "memory")  # fmt: skip
    assert bad.returncode == 2 and "--mcp-approve 'sometimes'" in bad.stderr


def test_mcp_sampling_off_refuses_the_server(wire: WireServer) -> None:
    wire.add(calls=[("summarize", {"text": "apples"})]).add(text="No summary.")
    status, events = run_with_mcp(wire, SERVER, "--mcp-sampling", "off")
    assert status == 0
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] and "usage" not in result
    assert len(wire.requests) == 2  # the run's own calls, nothing sampled
    assert not any(e["type"] == "sampled" for e in events)


async def test_a_program_answers_a_question_and_a_cancelled_call_takes_its_question_along() -> None:
    """`Runtime.asked` lists what a run waits on, `Runtime.answer` answers it (an answer that
    does not fit is refused, the question still waits); a run cancelled while its question
    waits leaves none behind."""
    from helpers import until, within
    from tether import Agent, QuestionError, Runtime, ScriptedModel, reply

    async with Runtime() as rt:
        tools = await rt.mcp_tools([SERVER], approval=MCPApproval(tools={"reserve": "never"}))
        runs = []
        for item in ("pears", "plums"):
            script = [reply(tool_calls=[("reserve", {"item": item})]), reply("Done.")]
            agent = Agent(ScriptedModel(script), tools, name=f"shop-{item}")
            runs.append(await rt.start(agent, f"Reserve {item}."))
            await until(lambda: rt.asked(runs[-1].id), "the server's question", 30)
            if item == "pears":  # one run at a time: a question names the one run calling
                (question,) = rt.asked(runs[0].id)
                assert question.message == "How many pears should be reserved?"
                with pytest.raises(QuestionError, match="quantity"):
                    await rt.answer(runs[0].id, question.id, {"quantity": "many"})
                await rt.answer(runs[0].id, question.id, {"quantity": 4})
                done = await within(runs[0].wait(), "the answered run")
                assert done is not None
                assert done.messages[-2].tool_results[0].output == "reserved 4 pears"
        assert rt.cancel(runs[1].id)
        ended = await within(runs[1].wait(), "the cancelled run")
        assert ended is not None and ended.outcome == "cancelled"
        await until(lambda: not rt.asked(runs[1].id), "the cancelled call's question to go", 10)
        with pytest.raises(QuestionError):
            await rt.answer(runs[1].id, question.id.replace("_1", "_9"), {"quantity": 1})


async def test_a_runtime_closed_while_mcp_servers_connect_tells_whoever_waits() -> None:
    """A runtime closed while an MCP server is still connecting (a page shut down as a run
    starts) ends the wait for its tools with an error, instead of leaving the caller (the
    page's request, and so the page's shutdown) waiting for ever."""
    import asyncio

    from tether import Runtime
    from tether.errors import RunError

    silent = f"{sys.executable} -c 'import time; time.sleep(120)'"  # never answers
    rt = Runtime()
    await rt.open()
    waiting = asyncio.create_task(rt.mcp_tools([silent], connect_timeout=60))
    while rt.mcp is None or not rt.mcp.held:  # the runtime has taken the servers on
        await asyncio.sleep(0)
    await rt.close()
    with pytest.raises(RunError, match="closed before the MCP servers' tools were listed"):
        await asyncio.wait_for(waiting, 30)


def test_an_mcp_image_is_what_its_bytes_are_not_what_the_server_says() -> None:
    """A server's `mimeType` is its word: an image is shown with the type its bytes have, and
    a block whose bytes are no PNG, JPEG, GIF or WebP (an SVG, HTML called image/png) is left
    out, said so, instead of reaching the model and the page as the server named it."""
    from types import SimpleNamespace

    from tether.tools.mcp import block_image, block_text

    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 100
    svg = b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>"

    def block(data: bytes, mime: str) -> SimpleNamespace:
        return SimpleNamespace(type="image", data=base64.b64encode(data).decode(), mimeType=mime)

    shown = block_image(block(png, "text/html"))
    assert shown is not None and shown.media_type == "image/png"
    assert block_image(block(svg, "image/png")) is None
    assert block_text(block(svg, "image/png")).startswith("[left out: an image")


def test_a_question_with_calls_of_several_runs_in_flight_names_no_run() -> None:
    """The SDK hands a server's question to its own task, with nothing that names the call:
    with calls of two runs in flight it must not go to the first run's person (who could then
    answer another run's question, its secrets in it); with one run's calls, to that run."""
    from tether.questions import decline_all
    from tether.tools.mcp import Server
    from tether.tools.tool import RunContext

    server = Server("srv", decline_all)
    server.calling = {1: RunContext(run_id="a", call_id="c1"), 2: RunContext(run_id="a")}
    found = server.asking_run()
    assert found is not None and found.run_id == "a"
    server.calling[3] = RunContext(run_id="b", call_id="c9")
    assert server.asking_run() is None


async def test_a_cancelled_run_agent_call_cancels_its_run(tmp_path: Path, wire: WireServer) -> None:
    """An MCP client that cancels its `run_agent` call: the run is cancelled with it, its bash
    call's processes killed (it went on: its bash made a file 11 s after the cancel)."""
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from helpers import until

    wire.add(calls=[("bash", {"command": "touch started; sleep 3; touch late"})])
    wire.add(text="Done.")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tether", "mcp-serve", "--base-url", wire.url, "--tools", "bash",
              "--workspace", str(tmp_path), "--approve", "auto", "--no-sandbox"],
        env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip
    async with Client(params) as client:
        call = asyncio.create_task(client.call_tool("run_agent", {"task": "Take your time."}))
        await until(lambda: (tmp_path / "started").exists(), "the run's bash to start", 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(4.5)  # past the command's own 3 s: had it gone on, it made `late`
        assert not (tmp_path / "late").exists()


async def test_a_question_waits_for_its_person_past_the_tool_timeout() -> None:
    """A server's question is a person's time, as an approval is: the call's time limit stops
    while the question waits (it was cut off after the tool's time-out, 60 s by default), and
    runs again after: a call that takes too long on its own is still stopped."""
    import asyncio

    from tether import Agent, ScriptedModel, reply
    from tether.questions import Answer, Question
    from tether.tools.mcp import mcp_tools

    async def slow_person(question: Question) -> Answer:
        await asyncio.sleep(2.5)  # longer than the tool's time limit
        return Answer("accept", content={"quantity": 3})

    script = [
        reply(tool_calls=[("reserve", {"item": "pears"})]),
        reply(tool_calls=[("slow", {"seconds": 5})]),
        reply("Done."),
    ]
    async with mcp_tools([SERVER], tool_timeout=1.5, approval="never", asker=slow_person) as tools:
        result = await Agent(ScriptedModel(script), tools).run("Reserve pears.")
    reserved, slow = (m.tool_results[0] for m in result.messages if m.tool_results)
    assert (reserved.output, reserved.is_error) == ("reserved 3 pears", False)
    assert slow.is_error and "timed out after 1.5 s" in slow.output


def test_two_servers_tools_of_one_name_are_told_apart_by_a_prefix(
    wire: WireServer, http_server: str
) -> None:
    """Two servers with a tool of one name: an error that says how to mend it, and with
    `--mcp-prefix` both are offered, each calling its own server (the clash could only be
    mended by dropping a server)."""
    status, _ = run_with_mcp(wire, SERVER, "--mcp", http_server)
    assert status == 2 and wire.requests == []
    wire.add(calls=[("stock", {"item": "apples"}), ("web_stock", {"item": "pears"})])
    wire.add(text="Done.")
    p = warm.run(
        [*TETHER, "run", "x", "--base-url", wire.url, "--json", "--tools", "none",
         "--mcp", SERVER, "--mcp", http_server, "--mcp-prefix", f"{http_server}=web",
         "--mcp-tools", "stock", "--mcp-tools", "inventory#sum*", "--mcp-skip", "summarize"],
        capture_output=True, text=True, timeout=60, env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    offered = [t["function"]["name"] for t in wire.requests[0]["tools"]]
    assert offered == ["stock", "web_stock"]  # summarize matched, then skipped
    events = [json.loads(line) for line in p.stdout.splitlines()]
    results = {e["name"]: e["output"] for e in events if e["type"] == "tool_result"}
    assert results == {"stock": "12 apples in stock", "web_stock": "0 pears in stock"}


def test_a_bad_name_rule_is_one_line(tmp_path: Path) -> None:
    p = run_tether(
        "run", "x", "--provider", "scripted", "--script", answer_script(tmp_path),
        "--store", "memory", "--mcp", SERVER, "--mcp-prefix", "web",
    )  # fmt: skip
    assert p.returncode == 2 and "--mcp-prefix 'web': give SERVER=PREFIX" in p.stderr


async def test_a_tool_that_needs_mcp_tasks_is_not_offered() -> None:
    """Tether calls tools without MCP tasks: a tool whose server says it needs them
    (`taskSupport: required`) would fail every call, so the model is not offered it."""
    from tether.tools.mcp import MCPNames, mcp_tools

    async with mcp_tools([f"{sys.executable} {RAW} huge"]) as tools:
        assert [t.name for t in tools] == ["dump"]
    names = MCPNames(prefixes={"raw": "big"})  # the server by the name it gives itself
    async with mcp_tools([f"{sys.executable} {RAW} huge"], names=names) as tools:
        assert [t.name for t in tools] == ["big_dump"]


async def test_an_mcp_client_supervises_runs_as_the_page_does(
    tmp_path: Path, wire: WireServer
) -> None:
    """`tether mcp-serve`'s supervisor tools: a run started returns at once; its bash call
    waits for approval (under `--approve ask`), which `run_status` shows and `decide_call`
    gives; `run_events` pages through what it did; `list_runs` lists it done; a question of
    a run that is not there is an error result that says so."""
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    wire.add(calls=[("bash", {"command": "echo hello > said.txt"})]).add(text="Said it.")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tether", "mcp-serve", "--base-url", wire.url, "--tools", "bash",
              "--workspace", str(tmp_path), "--no-sandbox"],
        env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip

    async def call(client: Any, name: str, **arguments: Any) -> Any:
        result = await client.call_tool(name, arguments)
        assert not result.is_error, result.content[0].text
        return json.loads(result.content[0].text)

    async with Client(params) as client:
        run_id = (await call(client, "start_run", task="Say hello."))["run_id"]
        waiting: list[dict[str, Any]] = []

        async def approval_shown() -> bool:
            waiting[:] = (await call(client, "run_status", run_id=run_id))["approvals"]
            return bool(waiting)

        for _ in range(300):
            if await approval_shown():
                break
            await asyncio.sleep(0.1)
        (approval,) = waiting
        assert approval["name"] == "bash" and not (tmp_path / "said.txt").exists()
        await call(client, "decide_call", run_id=run_id, approval_id=approval["approval_id"],
                   approve=True, args_hash=approval["args_hash"])  # fmt: skip
        seen: list[dict[str, Any]] = []
        after = 0
        while not seen or seen[-1]["type"] != "run_finished":
            page = await call(client, "run_events", run_id=run_id, after=after, wait=5)
            seen += page["events"]
            after = page["next"]
        types = [e["type"] for e in seen]
        assert types.index("approval_decided") < types.index("tool_result")
        assert seen[-1]["answer"] == "Said it." and (tmp_path / "said.txt").exists()
        listed = await call(client, "list_runs", state="done")
        assert [(r["id"], r["status"]) for r in listed] == [(run_id, "done")]
        gone = await client.call_tool("cancel_run", {"run_id": "nope"})
        assert gone.is_error and "no run 'nope'" in gone.content[0].text
