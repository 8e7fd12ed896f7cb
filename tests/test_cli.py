"""`tether run` and `tether ask` as a user runs them: real processes, real HTTP to a mock server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env, json_lines
from helpers import tether as run_tether
from wire_server import WireServer, tool_results

TOOLS = str(FIXTURES / "parallel_tools.py")


def three_by_three(body: dict[str, Any]) -> dict[str, Any]:
    """3 turns of 3 parallel calls, then the answer (turn = tool results so far // 3)."""
    turn = tool_results(body) // 3
    if turn < 3:
        return {"calls": [("slow_echo", {"text": f"t{turn}c{i}", "ms": 300}) for i in range(3)]}
    return {"text": "All nine echoes are back."}


# the CLI with both providers' keys set (to values no server would take)
tether = partial(run_tether, OPENAI_API_KEY="sk-test", ANTHROPIC_API_KEY="sk-ant-test")


def run_json(server: WireServer, *extra: str) -> subprocess.CompletedProcess[str]:
    """`tether run x --json` against `server` with the test tools loaded."""
    return tether("run", "x", "--base-url", server.url, "--tools-from", TOOLS, "--json", *extra)


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


PROVIDERS = ["openai-chat", "openai-responses", "anthropic"]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_three_turns_of_three_parallel_tools(
    wire: WireServer, tmp_path: Path, stream: bool, provider: str
) -> None:
    wire.rule = three_by_three
    log = tmp_path / "tools.log"
    args = ["run", "echo things", "--base-url", wire.url, "--tools-from", TOOLS, "--json"]
    args += ["--provider", provider]
    if not stream:
        args.append("--no-stream")
    p = tether(*args, TOOL_LOG=str(log))
    assert p.returncode == 0, p.stderr
    evs = events(p.stdout)

    # the contract: every event has type, run_id and seq, seq counts up from 0
    assert all({"type", "run_id", "seq"} <= e.keys() for e in evs)
    assert [e["seq"] for e in evs] == list(range(len(evs)))
    assert len({e["run_id"] for e in evs}) == 1
    types = [e["type"] for e in evs]
    assert types.count("model_response") == 4
    assert types.count("tool_call") == 9 and types.count("tool_result") == 9
    assert ("text_delta" in types) == stream
    call = next(e for e in evs if e["type"] == "tool_call")
    assert set(call) >= {"id", "name", "arguments"} and call["arguments"]["ms"] == 300
    result = next(e for e in evs if e["type"] == "tool_result")
    assert set(result) >= {"id", "name", "output", "is_error"}
    response = next(e for e in evs if e["type"] == "model_response")
    assert set(response) >= {"text", "tool_calls", "stop_reason", "usage"}
    assert set(response["usage"]) == {
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "reasoning_tokens",
    }
    final = evs[-1]
    assert final["type"] == "run_finished" and final["outcome"] == "done"
    assert final["answer"] == "All nine echoes are back."
    assert final["usage"]["input_tokens"] == 4 * 50 and final["steps"] == 4

    # each turn's three calls are announced before any of their results
    tool_events = [t for t in types if t in ("tool_call", "tool_result", "model_response")]
    turns = " ".join(tool_events).split("model_response")[1:4]
    assert [t.split() for t in turns] == [["tool_call"] * 3 + ["tool_result"] * 3] * 3

    # the tools visibly ran at the same time: in each turn the three intervals overlap
    rows = [line.split() for line in log.read_text().splitlines()]
    assert len(rows) == 9
    for turn in range(3):
        spans = [(float(s), float(e)) for name, s, e in rows if name.startswith(f"t{turn}")]
        assert max(s for s, _ in spans) < min(e for _, e in spans), spans

    # the model was sent every result, in call order (Chat: with content "" beside the calls)
    assert len(wire.requests) == 4
    last_body = wire.requests[-1]
    if provider == "openai-responses":
        items = last_body["input"]
        calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
        outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
        assert len(calls) == 9 and outputs == calls
        return
    if provider == "anthropic":
        blocks = [
            b for m in last_body["messages"] if isinstance(m["content"], list) for b in m["content"]
        ]
        uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        assert len(uses) == 9 and results == uses
        return
    last = last_body["messages"]
    assistant = [m for m in last if m["role"] == "assistant"]
    assert all(m["content"] == "" for m in assistant)
    tool_ids = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    call_ids = [tc["id"] for m in assistant for tc in m["tool_calls"]]
    assert tool_ids == call_ids


def test_human_output(wire: WireServer) -> None:
    wire.add(calls=[("slow_echo", {"text": "hi", "ms": 10})]).add(text="Done echoing.")
    p = tether("run", "echo", "--base-url", wire.url, "--tools-from", TOOLS)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "Done echoing."
    assert 'slow_echo({"text":"hi","ms":10})' in p.stderr and "echo: hi" in p.stderr
    assert "[done] 2 steps" in p.stderr


def test_failing_unknown_and_malformed_tools_do_not_end_the_run(wire: WireServer) -> None:
    wire.add(
        calls=[
            ("explode", {}),
            ("no_such_tool", {}),
            ("slow_echo", '{"text": '),
            ("slow_echo", {"text": 5}),
        ]
    )
    wire.add(text="I recovered.")
    p = tether("run", "x", "--base-url", wire.url, "--tools-from", TOOLS, "--json")
    assert p.returncode == 0, p.stderr
    results = [e for e in events(p.stdout) if e["type"] == "tool_result"]
    assert [r["is_error"] for r in results] == [True] * 4
    assert events(p.stdout)[-1]["answer"] == "I recovered."
    sent = [m for m in wire.requests[1]["messages"] if m["role"] == "tool"]
    assert "ValueError: kaboom" in sent[0]["content"]
    assert "Unknown tool" in sent[1]["content"]
    assert "not a JSON object" in sent[2]["content"]
    assert "valid string" in sent[3]["content"]


def test_tool_timeout_option(wire: WireServer) -> None:
    wire.add(calls=[("slow_echo", {"text": "zzz", "ms": 30_000})]).add(text="ok")
    p = run_json(wire, "--tool-timeout", "0.3")
    assert p.returncode == 0
    result = next(e for e in events(p.stdout) if e["type"] == "tool_result")
    assert result["is_error"] and "timed out after 0.3 s" in result["output"]


def test_max_steps_halts_with_status_3(wire: WireServer) -> None:
    wire.rule = three_by_three
    p = run_json(wire, "--max-steps", "2")
    assert p.returncode == 3, p.stderr
    final = events(p.stdout)[-1]
    assert final["outcome"] == "halted" and "max_steps" in final["reason"]
    assert len(wire.requests) == 2


def test_max_tokens_halts_with_status_3(wire: WireServer) -> None:
    wire.rule = three_by_three
    p = tether("run", "x", "--base-url", wire.url, "--tools-from", TOOLS, "--max-tokens", "150")
    assert p.returncode == 3
    assert "[halted] max_tokens" in p.stderr
    assert len(wire.requests) == 2  # 60 per call: a third would pass 150


def test_provider_error_fails_with_status_1(wire: WireServer) -> None:
    wire.add(status=401, type="invalid_api_key", message="Incorrect API key provided")
    p = tether("run", "x", "--base-url", wire.url, "--json")
    assert p.returncode == 1
    final = events(p.stdout)[-1]
    assert final["outcome"] == "failed"
    assert final["error"]["status"] == 401 and final["error"]["retryable"] is False
    assert "sk-test" not in p.stdout + p.stderr


def test_retries_are_visible_and_bounded_by_max_retries(wire: WireServer) -> None:
    for _ in range(2):
        wire.add(status=503, headers={"Retry-After": "0"})
    p = tether("run", "x", "--base-url", wire.url, "--json", "--max-retries", "1")
    assert p.returncode == 1
    evs = events(p.stdout)
    assert [e["type"] for e in evs].count("retry") == 1
    assert len(wire.requests) == 2


def test_missing_key_is_a_one_line_error(no_keys: None) -> None:
    p = warm.run(
        [*TETHER, "run", "hi", "--provider", "openai-chat"],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "OPENAI_API_KEY" in p.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["run"],
        ["run", "x", "--max-steps", "lots"],
        ["run", "x", "--tools", "rm_rf"],
        ["run", "x", "--tools-from", "/no/such/file.py"],
        ["run", "x", "--provider", "scripted"],
        ["runs", "--store", "memory"],
        ["run", "x", "--queue", "--store", "memory"],
        ["run", "x", "--store", "mysql://nope"],
    ],
)
def test_bad_usage_exits_2(args: list[str]) -> None:
    p = tether(*args)
    assert p.returncode == 2 and p.stderr.strip()
    assert "Traceback" not in p.stderr


def test_help_lists_every_option() -> None:
    p = tether("run", "--help")
    for option in [
        "--provider",
        "--model",
        "--base-url",
        "--tools",
        "--tools-from",
        "--workspace",
        "--system",
        "--max-steps",
        "--max-tokens",
        "--max-cost",
        "--timeout",
        "--max-retries",
        "--no-stream",
        "--json",
        "--store",
        "--run-id",
    ]:
        assert option in p.stdout, option
    assert "ask" in tether("--help").stdout


IGNORING_SIGINT = [
    sys.executable, "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]  # fmt: skip
"""Starts a program with SIGINT ignored, as a shell starts a background command (`cmd &`)."""


@pytest.mark.parametrize("started", ["plainly", "with SIGINT ignored"])
def test_ctrl_c_cancels_with_status_130(wire: WireServer, started: str) -> None:
    """However `tether` was started: a shell's background command (a CI job started with `&`)
    inherits SIGINT ignored, and Python then installs no handler of its own."""
    wire.add(calls=[("slow_echo", {"text": "long", "ms": 20000})])
    prefix = IGNORING_SIGINT if started != "plainly" else []
    proc = warm.Popen(
        [*prefix, *TETHER, "run", "x", "--base-url", wire.url, "--json", "--tools-from", TOOLS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(OPENAI_API_KEY="sk-test"),
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(json.loads(line))
        if lines[-1]["type"] == "tool_call":
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=10)
    assert proc.returncode == 130
    final = events(rest)[-1]
    assert final["type"] == "run_finished" and final["outcome"] == "cancelled"


def test_ask_keeps_the_conversation(wire: WireServer) -> None:
    wire.add(text="Nice to meet you, Ada.").add(text="You are Ada.")
    p = tether("ask", "--base-url", wire.url, stdin="I am Ada\nWho am I?\n")
    assert p.returncode == 0, p.stderr
    assert "Nice to meet you, Ada." in p.stdout and "You are Ada." in p.stdout
    second = wire.requests[1]["messages"]
    assert [m["content"] for m in second if m["role"] != "system"] == [
        "I am Ada",
        "Nice to meet you, Ada.",
        "Who am I?",
    ]


def test_scripted_provider_runs_the_example() -> None:
    root = Path(__file__).parent.parent
    p = tether(
        "run",
        "Weather?",
        "--provider",
        "scripted",
        "--script",
        str(root / "examples/weather_script.json"),
        "--tools-from",
        str(root / "examples/tools.py"),
    )
    assert p.returncode == 0, p.stderr
    assert "Lisbon is 17 °C" in p.stdout and "get_forecast" in p.stderr


def test_ask_ctrl_c_cancels_the_turn_and_keeps_the_session(wire: WireServer) -> None:
    wire.add(text="Let me wait.", calls=[("slow_echo", {"text": "long", "ms": 20000})])
    wire.add(text="Still here, and I remember the first question.")
    proc = warm.Popen(
        [*TETHER, "ask", "--base-url", wire.url, "--json", "--tools-from", TOOLS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(OPENAI_API_KEY="sk-test"),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("first question\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if json.loads(line)["type"] == "tool_call":
            break
    proc.send_signal(signal.SIGINT)
    for line in proc.stdout:
        event = json.loads(line)
        if event["type"] == "run_finished":
            assert event["outcome"] == "cancelled"
            break
    rest, err = proc.communicate("second question\n", timeout=20)
    assert "turn cancelled" in err
    final = events(rest)[-1]
    assert final["outcome"] == "done" and final["answer"].startswith("Still here")
    sent = wire.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[1]["content"] == "first question" and sent[3]["content"].startswith("Cancelled")


@pytest.mark.parametrize(
    ("approve", "approved", "reason"),
    [
        ("auto", True, "approved by policy"),
        ("deny", False, "denied by policy"),
        ("ask", False, "no one at a terminal"),
    ],
)
def test_approve_policy_for_unattended_runs(
    wire: WireServer, tmp_path: Path, approve: str, approved: bool, reason: str
) -> None:
    wire.add(calls=[("bash", {"command": "echo hi > proof.txt"})]).add(text="ok")
    p = tether(
        "run",
        "x",
        "--base-url",
        wire.url,
        "--json",
        "--tools",
        "bash",
        "--workspace",
        str(tmp_path),
        "--approve",
        approve,
        # unattended, a durable run waits for `tether approve`; one in memory cannot
        *(["--store", "memory"] if approve == "ask" else []),
    )
    assert p.returncode == 0, p.stderr
    evs = events(p.stdout)
    requested = next(e for e in evs if e["type"] == "approval_requested")
    assert requested["name"] == "bash" and requested["arguments"] == {
        "command": "echo hi > proof.txt"
    }
    decided = next(e for e in evs if e["type"] == "approval_decided")
    assert decided["approved"] is approved and reason in decided["reason"]
    assert (tmp_path / "proof.txt").exists() is approved
    result = next(e for e in evs if e["type"] == "tool_result")
    assert result["is_error"] is not approved


def test_ask_asks_inline_before_running_bash(wire: WireServer, tmp_path: Path) -> None:
    wire.add(calls=[("bash", {"command": "echo yes > a.txt"})]).add(text="made a")
    wire.add(calls=[("bash", {"command": "echo no > b.txt"})]).add(text="b was refused")
    p = tether(
        "ask",
        "--base-url",
        wire.url,
        "--tools",
        "bash",
        "--workspace",
        str(tmp_path),
        stdin="make a\ny\nmake b\nn\n",
    )
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("? allow bash(") == 2
    assert (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()
    assert "not approved: the user said no" in p.stderr


@pytest.mark.parametrize("yolo", [True, False])
def test_terminal_profile_asks_before_bash_unless_yolo(
    wire: WireServer, tmp_path: Path, yolo: bool
) -> None:
    wire.add(calls=[("bash", {"command": "echo done > made.txt"})]).add(text="ok")
    p = tether(
        "ask",
        "--base-url",
        wire.url,
        "--profile",
        "terminal",
        *(["--yolo"] if yolo else []),
        "--workspace",
        str(tmp_path),
        stdin="make a file\nn\n",  # the "n" refuses bash where it is asked
    )
    assert p.returncode == 0, p.stderr
    assert ("? allow bash(" in p.stderr) is not yolo
    assert (tmp_path / "made.txt").exists() is yolo
    first = wire.requests[0]
    system = first["messages"][0]
    assert system["role"] == "system" and "terminal agent" in system["content"]
    names = {t["function"]["name"] for t in first["tools"]}
    assert names == {"bash", "bash_job", "read_file", "write_file", "edit_file", "list_files"}


def test_data_dir_holds_the_default_store_too(wire: WireServer, tmp_path: Path) -> None:
    wire.add(text="Stored.")
    data = tmp_path / "data"
    p = tether("run", "hi", "--base-url", wire.url, "--data-dir", str(data), "--run-id", "dd-1")
    assert p.returncode == 0, p.stderr
    assert (data / "runs.sqlite").exists()
    listed = tether("runs", "--data-dir", str(data), "--json")
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == ["dd-1"]


def test_a_run_id_the_store_has_is_refused_and_the_run_kept(
    wire: WireServer, tmp_path: Path
) -> None:
    """The store refuses a second run under an id it has (as it records the run, with no read
    first): exit 2 with a one-line error, no request to the model, the first run unchanged."""
    wire.add(text="First answer.")
    data = tmp_path / "data"
    first = tether(
        "run", "first", "--base-url", wire.url, "--data-dir", str(data), "--run-id", "x-1"
    )
    assert first.returncode == 0, first.stderr
    again = tether(
        "run", "second", "--base-url", wire.url, "--data-dir", str(data), "--run-id", "x-1"
    )
    assert again.returncode == 2
    assert "the store has a run 'x-1' already" in again.stderr
    assert "Traceback" not in again.stderr
    assert len(wire.requests) == 1
    row = json.loads(tether("runs", "--data-dir", str(data), "--json").stdout)
    assert (row["id"], row["task"], row["answer"]) == ("x-1", "first", "First answer.")


def test_a_run_recorded_by_another_version_is_not_resumed_here(tmp_path: Path) -> None:
    """A run an older Tether recorded keeps its steps elsewhere: resuming it here could
    repeat what it completed, so `tether resume` refuses, saying why, and changes nothing."""
    import sqlite3

    path = tmp_path / "runs.sqlite"
    store = f"sqlite:///{path}"
    queued = tether("run", "a job", "--queue", "--store", store, "--run-id", "old-1")
    assert queued.returncode == 0, queued.stderr
    with sqlite3.connect(path) as db:
        db.execute("UPDATE workflow_status SET application_version = 'tether-3'")
    p = tether("resume", "old-1", "--store", store)
    assert p.returncode == 2, p.stderr
    assert "recorded by another version of Tether (tether-3" in p.stderr
    assert "Traceback" not in p.stderr
    row = json.loads(tether("runs", "--store", store, "--json").stdout)
    assert (row["id"], row["state"]) == ("old-1", "queued")


def test_runs_shows_what_each_run_was_asked_and_how_it_ended(
    wire: WireServer, tmp_path: Path
) -> None:
    wire.add(text="Stored.")
    data = tmp_path / "data"
    p = tether("run", "say hi", "--base-url", wire.url, "--data-dir", str(data), "--run-id", "r-1")
    assert p.returncode == 0, p.stderr
    row = json.loads(tether("runs", "--data-dir", str(data), "--json").stdout)
    assert (row["id"], row["state"], row["task"], row["steps"]) == ("r-1", "done", "say hi", 1)
    assert row["answer"] == "Stored." and row["ended_at"] >= row["started_at"] > 0
    assert row["agent"] == "tether" and len(row["version"]) == 12  # the definition's fingerprint
    line = tether("runs", "--data-dir", str(data)).stdout.strip().split("\t")
    version = f"tether@{row['version']}"
    assert line[0] == "r-1" and line[2:] == ["done", "1 step", "$0.0000", version, "say hi"]


def test_a_batch_of_tasks_is_queued_at_once_and_listed_by_state(tmp_path: Path) -> None:
    """`tether run --queue --tasks FILE` queues one run per line into a new store (no worker
    has run there yet) and prints their ids; `tether runs --state` lists them; bad input is a
    one-line error that queues nothing."""
    store = f"sqlite:///{tmp_path / 'queue.sqlite'}"
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("first job\n\nsecond job\nthird job\n")
    queue = ("run", "--queue", "--store", store, "--base-url", "http://127.0.0.1:9/v1")
    p = tether(*queue, "--tasks", str(tasks), "--run-id", "batch")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["batch-1", "batch-2", "batch-3"]
    rows = json_lines(tether("runs", "--store", store, "--json").stdout)
    assert [(r["id"], r["state"], r["task"]) for r in rows] == [
        ("batch-1", "queued", "first job"),
        ("batch-2", "queued", "second job"),
        ("batch-3", "queued", "third job"),
    ]
    assert all(r["queued_at"] > 0 and r["started_at"] is None for r in rows)
    assert len(tether("runs", "--store", store, "--state", "queued").stdout.splitlines()) == 3
    assert tether("runs", "--store", store, "--state", "done,failed").stdout == ""
    # the most recent N, and filters: read newest first, printed oldest first as above
    recent = json_lines(tether("runs", "--store", store, "--json", "--limit", "2").stdout)
    assert [r["id"] for r in recent] == ["batch-2", "batch-3"]
    found = tether("runs", "--store", store, "--search", "SECOND", "--state", "queued")
    assert [line.split("\t")[0] for line in found.stdout.splitlines()] == ["batch-2"]
    assert tether("runs", "--store", store, "--agent", "someone-else").stdout == ""
    agent = rows[0]["agent"]
    assert len(tether("runs", "--store", store, "--agent", agent).stdout.splitlines()) == 3
    from_stdin = tether(*queue, "--tasks", "-", stdin="a\nb\n")
    assert from_stdin.returncode == 0 and len(from_stdin.stdout.split()) == 2
    bad = {
        "again": tether(*queue, "--tasks", str(tasks), "--run-id", "batch"),
        "no --queue": tether("run", "--tasks", str(tasks), "--store", store),
        "both": tether(*queue, "a task", "--tasks", str(tasks)),
        "neither": tether(*queue),
        "empty": tether(*queue, "--tasks", "-", stdin="\n \n"),
        "missing": tether(*queue, "--tasks", str(tmp_path / "nope.txt")),
        "state": tether("runs", "--store", store, "--state", "sleeping"),
        "limit": tether("runs", "--store", store, "--limit", "0"),
        "filtered state": tether("runs", "--store", store, "--search", "x", "--state", "nap"),
    }
    for what, refused in bad.items():
        assert refused.returncode == 2, (what, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1, (what, refused.stderr)
        assert "Traceback" not in refused.stderr
    assert "batch-1" in bad["again"].stderr and "nothing queued" in bad["again"].stderr
    assert len(tether("runs", "--store", store).stdout.splitlines()) == 5  # nothing more


def test_version() -> None:
    import tether as package

    p = tether("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"tether {package.__version__}"


def test_stores_journals_and_logs_are_private(wire: WireServer, tmp_path: Path) -> None:
    """They hold transcripts: files 0600, in directories 0700 (when Tether creates them)."""
    wire.add(text="Kept.").add(text="Journaled.")
    data = tmp_path / "data"
    durable = tether("run", "hi", "--base-url", wire.url, "--data-dir", str(data))
    assert durable.returncode == 0, durable.stderr
    log = tmp_path / "run.log"
    memory = tether(
        "run", "hi", "--base-url", wire.url, "--data-dir", str(data), "--store", "memory",
        "--run-id", "private-1", "--log", str(log),
    )  # fmt: skip
    assert memory.returncode == 0, memory.stderr
    modes = {
        p.relative_to(tmp_path).as_posix(): p.stat().st_mode & 0o777
        for p in [data, *data.rglob("*"), log]
    }
    assert modes["data"] == 0o700 and modes["data/events"] == 0o700
    assert modes["data/runs.sqlite"] == 0o600 and modes["data/runs.sqlite-effects"] == 0o600
    assert modes["data/events/private-1.jsonl"] == 0o600 and modes["run.log"] == 0o600
    others = {name: mode for name, mode in modes.items() if mode & 0o077}
    assert others == {}


@pytest.mark.parametrize("stream", [True, False])
def test_escape_sequences_never_reach_the_terminal(wire: WireServer, stream: bool) -> None:
    """What a model or a tool writes cannot clear the screen, move the cursor or set a title."""
    wire.add(
        text="\x1b[2J\x1b]0;owned\x07Looking\x1b[31m.",
        calls=[("slow_echo", {"text": "\x1b[1Ax", "ms": 1})],
    )
    wire.add(text="All \x1b[8mclean\x1b[0m.")
    extra = [] if stream else ["--no-stream"]
    p = tether("run", "x", "--base-url", wire.url, "--tools-from", TOOLS, *extra)
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout and "\x1b" not in p.stderr and "\x07" not in p.stdout
    assert "Looking." in p.stdout and "All clean." in p.stdout
    assert "echo: x" in p.stderr


def test_the_approval_prompt_shows_the_whole_call(wire: WireServer, tmp_path: Path) -> None:
    command = "echo hi #" + "x" * 600 + "\ntouch pwned"  # a long comment, then the real work
    wire.add(calls=[("bash", {"command": command})]).add(text="Not run, then.")
    p = tether(
        "ask", "--base-url", wire.url, "--tools", "bash", "--workspace", str(tmp_path),
        "--store", "memory", stdin="go\nn\n",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    prompt = p.stderr[p.stderr.index("? allow bash(") :]
    assert "touch pwned" in prompt.split("[y/N]")[0]
    assert not (tmp_path / "pwned").exists()


def test_bash_gets_only_the_environment_the_user_names(wire: WireServer, tmp_path: Path) -> None:
    wire.add(calls=[("bash", {"command": "echo [$PROJECT] [$OPENAI_API_KEY] [$DB_PASS]"})])
    wire.add(text="Done.")
    p = tether(
        "run", "show the env", "--base-url", wire.url, "--tools", "bash", "--yolo",
        "--tool-env", "PROJECT", "--workspace", str(tmp_path), "--store", "memory", "--json",
        PROJECT="tether", DB_PASS="pw-1234567",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    result = next(e for e in events(p.stdout) if e["type"] == "tool_result")
    assert result["output"] == "exit status 0\n[tether] [] []\n"


@pytest.mark.parametrize(
    ("provider", "required", "named"),
    [
        ("openai-chat", "required", {"type": "function", "function": {"name": "slow_echo"}}),
        ("openai-responses", "required", {"type": "function", "name": "slow_echo"}),
        ("anthropic", {"type": "any"}, {"type": "tool", "name": "slow_echo"}),
    ],
)
@pytest.mark.parametrize("choice", ["required", "slow_echo"])
def test_tool_choice_holds_until_a_tool_was_called(
    wire: WireServer, provider: str, required: Any, named: Any, choice: str
) -> None:
    wire.add(calls=[("slow_echo", {"text": "hi", "ms": 1})]).add(text="Echoed.")
    p = run_json(wire, "--provider", provider, "--tool-choice", choice)
    assert p.returncode == 0, p.stderr
    first, second = wire.requests
    assert first["tool_choice"] == (required if choice == "required" else named)
    assert "tool_choice" not in second  # then the model decides, and can answer


def test_a_tool_choice_that_names_no_tool_is_a_clear_error(wire: WireServer) -> None:
    p = run_json(wire, "--tool-choice", "nonesuch")
    assert p.returncode == 2 and "--tool-choice: 'nonesuch' is none of" in p.stderr
    assert "slow_echo" in p.stderr and "Traceback" not in p.stderr and wire.requests == []


@pytest.mark.parametrize(
    ("model", "variable"),
    [("gpt-4.1", "OPENAI_API_KEY"), ("claude-sonnet-4-5", "ANTHROPIC_API_KEY")],
)
def test_a_named_model_without_its_key_is_one_line_never_the_offline_model(
    no_keys: None, model: str, variable: str
) -> None:
    """With no key, the offline model answers only when no model was named: a user who asked
    for gpt-4.1 must not get SmolLM2's answer with exit 0."""
    p = run_tether("run", "Which files are large?", "--model", model, "--store", "memory")
    assert p.returncode == 2, p.stdout
    line = p.stderr.strip()
    assert "\n" not in line and variable in line and "--provider local" in line
    assert p.stdout == ""  # nothing answered


def test_a_store_in_a_missing_folder_is_made_and_a_plain_path_is_a_sqlite_file(
    tmp_path: Path,
) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples"
    script, tools = str(examples / "weather_script.json"), str(examples / "tools.py")
    run = ("run", "weather?", "--provider", "scripted", "--script", script, "--tools-from", tools)
    deep = tmp_path / "a" / "b" / "runs.sqlite"
    p = tether(*run, "--store", f"sqlite:///{deep}", "--run-id", "deep-1")
    assert p.returncode == 0, p.stderr
    assert deep.exists() and (deep.parent.stat().st_mode & 0o777) == 0o700
    plain = tmp_path / "plain" / "runs.sqlite"
    p = tether(*run, "--store", str(plain), "--run-id", "plain-1")
    assert p.returncode == 0, p.stderr
    listed = tether("runs", "--store", str(plain), "--json")
    assert json_lines(listed.stdout)[0]["id"] == "plain-1"
    p = tether(*run, "--store", "ftp://example/runs")
    assert p.returncode == 2 and "\n" not in p.stderr.strip() and "Traceback" not in p.stderr
    # a command that only reads a store makes no folder: a store that is not there is said
    for reader in (("runs",), ("show", "deep-1"), ("cancel", "deep-1")):
        p = tether(*reader, "--store", str(tmp_path / "typo" / "runs.sqlite"))
        assert p.returncode == 2 and "no store at" in p.stderr
    assert not (tmp_path / "typo").exists()
    # but the default store, before the first run, has no runs yet: a newcomer's first look
    p = tether("runs", "--data-dir", str(tmp_path / "fresh"), env=cli_env(TETHER_STORE=""))
    assert (p.returncode, p.stdout) == (0, ""), p.stderr
    assert (
        p.stderr
        == f"no runs yet: the first tether run makes the store {tmp_path}/fresh/runs.sqlite\n"
    )


def test_a_reader_that_stops_reading_stops_the_output_not_the_run() -> None:
    """`tether run --json | head -n 1`: the pipe closes after the first event. The run goes on
    to its end, recorded as done, and the command exits 0 without a traceback (it hung on its
    way out with one, the durable run killed by the write into the closed pipe)."""
    examples = Path(__file__).resolve().parent.parent / "examples"
    argv = [*TETHER, "run", "weather?", "--provider", "scripted", "--json", "--run-id", "piped"]
    argv += ["--script", str(examples / "weather_script.json")]
    argv += ["--tools-from", str(examples / "tools.py")]
    p = warm.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    assert p.stdout is not None and p.stderr is not None
    first = json.loads(p.stdout.readline())
    p.stdout.close()  # as `head -n 1` does
    assert first["type"] == "run_started"
    assert p.wait(timeout=60) == 0
    assert "Traceback" not in p.stderr.read().decode()
    listed = json_lines(tether("runs", "--json").stdout)
    assert [(r["id"], r["state"]) for r in listed] == [("piped", "done")]


class Terminal:
    """`tether` on a terminal of its own (a pty that is its controlling terminal), so that
    Ctrl-C is what a user's is: the terminal's interrupt character, SIGINT to the foreground
    process group."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes tether
            os.execvpe(argv[0], argv, env)
        self.seen = b""

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        import select

        deadline = time.monotonic() + timeout
        while needle.encode() not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {needle!r} on the terminal; it shows:\n{self.seen.decode()}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    self.seen += os.read(self.fd, 4096)
                except OSError:  # the child is gone and the terminal with it
                    break
        assert needle.encode() in self.seen, self.seen.decode()

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def exit_status(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain()
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"still running after {timeout} s:\n{self.seen.decode()}")

    def drain(self) -> None:
        import select

        while select.select([self.fd], [], [], 0)[0]:
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.seen += chunk


def bash_script(tmp_path: Path) -> str:
    script = tmp_path / "bash.json"
    call = {"name": "bash", "arguments": {"command": "echo approved > proof.txt"}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "Done."}]))
    return str(script)


def test_ctrl_c_at_an_approval_prompt_cancels_the_run_at_once(tmp_path: Path) -> None:
    """It hung until Enter was pressed (a thread blocked reading the terminal held the exit)."""
    argv = [*TETHER, "run", "write the proof", "--tools", "bash", "--provider", "scripted"]
    argv += ["--script", bash_script(tmp_path), "--workspace", str(tmp_path)]
    term = Terminal(argv, cli_env())
    term.wait_for("? allow bash(")
    pressed = time.monotonic()
    term.type(b"\x03")  # Ctrl-C
    assert term.exit_status(timeout=10) == 130
    took = time.monotonic() - pressed
    assert not (tmp_path / "proof.txt").exists()  # the call was never approved
    print(f"Ctrl-C to exit: {took:.2f} s")


def test_ctrl_c_at_an_approval_prompt_in_ask_reads_nothing_after(tmp_path: Path) -> None:
    """In `tether ask` the turn is cancelled and the conversation goes on: the next line typed
    reaches the next `you>` prompt (a thread left reading swallowed it)."""
    argv = [*TETHER, "ask", "--tools", "bash", "--provider", "scripted", "--store", "memory"]
    argv += ["--script", bash_script(tmp_path), "--workspace", str(tmp_path)]
    term = Terminal(argv, cli_env())
    term.wait_for("you> ")
    term.type(b"write the proof\n")
    term.wait_for("? allow bash(")
    term.type(b"\x03")
    term.wait_for("[turn cancelled; the conversation goes on]\r\nyou> ")
    term.type(b"/exit\n")
    assert term.exit_status(timeout=10) == 130  # the last turn was cancelled
    assert not (tmp_path / "proof.txt").exists()


def test_the_state_commands_say_what_is_true(tmp_path: Path) -> None:
    """A durable run that waits for approval says so, with the commands that decide it; once
    its process is killed it is `interrupted`, with the command that resumes it (it showed
    `running on` the dead process for ever); approve, cancel and send say what they did, or
    exit 2 with one line on a run that cannot take it."""
    from helpers import Output

    store = str(tmp_path / "runs.sqlite")
    argv = [*TETHER, "run", "write the proof", "--tools", "bash", "--provider", "scripted"]
    argv += ["--script", bash_script(tmp_path), "--workspace", str(tmp_path), "--store", store]
    argv += ["--run-id", "w1"]
    proc = warm.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=cli_env(), text=True,
    )  # fmt: skip
    asked = Output(proc.stderr).wait_for("waits for approval")
    approval = asked.split("tether approve w1 ")[1].split()[0]
    listed = tether("runs", "--store", store)
    assert f"waiting for approval ({approval})" in listed.stdout
    shown = tether("show", "w1", "--store", store).stdout
    assert f"tether approve w1 {approval}" in shown.splitlines()[-1]

    proc.kill()
    proc.wait(30)
    listed = tether("runs", "--store", store)
    assert "interrupted: its process died (tether resume w1)" in listed.stdout
    [row] = json_lines(tether("runs", "--store", store, "--state", "interrupted", "--json").stdout)
    assert row["id"] == "w1"
    assert "tether resume w1" in tether("show", "w1", "--store", store).stdout.splitlines()[-1]

    approved = tether("approve", "w1", approval, "--store", store)
    assert approved.returncode == 0 and approved.stdout.strip() == f"approved: {approval} of run w1"
    resumed = tether("resume", "w1", "--store", store)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "proof.txt").read_text() == "approved\n"
    for refused in (
        tether("cancel", "w1", "--store", store),
        tether("send", "w1", "more", "--store", store),
        tether("approve", "w1", approval, "--store", store),
        tether("cancel", "no-such-run", "--store", store),
    ):
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert (
        "has ended (success): nothing to cancel" in tether("cancel", "w1", "--store", store).stderr
    )


def test_a_worker_runs_the_tools_of_its_own_machine(tmp_path: Path) -> None:
    """`tether worker --tools-from` takes the place of the tools file a run recorded when it was
    queued (another machine's path), says each run it starts and ends, and refuses a tools
    file that does not load before it takes any run."""
    from helpers import Output

    examples = Path(__file__).resolve().parent.parent / "examples"
    queued_here, worker_copy = tmp_path / "queuer", tmp_path / "worker"
    for folder, says in ((queued_here, "the queuer's copy"), (worker_copy, "the worker's copy")):
        folder.mkdir()
        source = (examples / "tools.py").read_text().replace('"3 °C, light snow"', repr(says))
        (folder / "tools.py").write_text(source)
    store = str(tmp_path / "jobs.sqlite")
    queued = tether(
        "run", "Weather in Oslo?", "--queue", "--store", store, "--run-id", "job",
        "--provider", "scripted", "--script", str(examples / "weather_script.json"),
        "--tools-from", str(queued_here / "tools.py"),
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    (queued_here / "tools.py").unlink()  # that machine's file is not here

    bad = tether("worker", "--store", store, "--tools-from", str(tmp_path / "none.py"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr

    worker = warm.Popen(
        [*TETHER, "worker", "--store", store, "--tools-from", str(worker_copy / "tools.py")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env(), text=True,
    )  # fmt: skip
    try:
        lines = Output(worker.stderr)
        lines.wait_for("run job started: Weather in Oslo?")
        assert "run job ended done" in lines.wait_for("run job ended")
    finally:
        worker.kill()
        worker.wait(30)
    shown = tether("show", "job", "--store", store).stdout
    assert "the worker's copy" in shown and "the queuer's copy" not in shown


def test_a_stores_rows_supply_no_code_and_no_endpoint_to_a_worker(
    wire: WireServer, tmp_path: Path
) -> None:
    """Whoever can write a store's rows (here: `tether run --queue`, as a rewritten record
    would) names tools files, MCP commands and a model endpoint; a worker not given them runs
    none of it: the tools file is not imported, the MCP command not started, the worker's key
    not sent, and each run fails saying what to give the worker. Given them, it runs them."""
    from helpers import Output, store_runs, wait_until

    marker = tmp_path / "imported"
    tools = tmp_path / "planted.py"
    tools.write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        'from tether import tool\n\n@tool\ndef noop() -> str:\n    """Nothing."""\n'
        "    return 'nothing'\n"
    )
    started = tmp_path / "started"
    store = str(tmp_path / "jobs.sqlite")
    env = cli_env(OPENAI_API_KEY="sk-worker-secret")
    wire.rule = lambda body: {"text": "Done."}
    queue = ("run", "--queue", "--store", store, "--base-url", wire.url)
    for run_id, extra in (
        ("code", ("--tools-from", str(tools))),
        ("server", ("--mcp", f"touch {started}")),
        ("endpoint", ()),
    ):
        queued = tether(*queue, f"task {run_id}", "--run-id", run_id, *extra, env=env)
        assert queued.returncode == 0, queued.stderr
    marker.unlink()  # the queuing process loaded its own file, as it checks what it queues
    worker = warm.Popen(
        [*TETHER, "worker", "--store", store, "--beat", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    try:
        with store_runs(f"sqlite:///{store}") as runs:
            wait_until(lambda: len(runs("failed")) == 3, "the three runs to be refused", 60, 0.1)
    finally:
        worker.kill()
        worker.wait(30)
    assert not marker.exists() and not started.exists() and wire.requests == []
    said = {
        r["id"]: r["reason"] for r in json_lines(tether("runs", "--store", store, "--json").stdout)
    }
    assert "names --tools-from" in said["code"] and "start it with --tools-from" in said["code"]
    assert "names --mcp" in said["server"]
    assert f"--allow-base-url {wire.url}" in said["endpoint"]
    queued = tether(*queue, "task again", "--run-id", "given", "--tools-from", str(tools), env=env)
    assert queued.returncode == 0, queued.stderr
    worker = warm.Popen(
        [*TETHER, "worker", "--store", store, "--tools-from", str(tools),
         "--allow-base-url", wire.url],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    try:
        assert "run given ended done" in Output(worker.stderr).wait_for("run given ended")
    finally:
        worker.kill()
        worker.wait(30)
    assert marker.read_text() == "ran" and len(wire.requests) == 1  # its own, given


def test_a_worker_takes_no_more_runs_than_its_concurrency(wire: WireServer, tmp_path: Path) -> None:
    """`tether worker --concurrency 2` with five runs queued and every model reply held: two
    run, three stay queued (for other workers); let go, all five end done."""
    import threading

    from helpers import store_runs, wait_until

    released = threading.Event()
    wire.rule = lambda body: {"text": "Done.", "gate": released}
    store = str(tmp_path / "jobs.sqlite")
    queued = run_tether(
        "run", "--queue", "--tasks", "-", "--store", store, "--base-url", wire.url,
        "--tools", "none", stdin="".join(f"job {i}\n" for i in range(5)), OPENAI_API_KEY="sk-q",
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    worker = warm.Popen(
        [*TETHER, "worker", "--store", store, "--concurrency", "2", "--allow-base-url", wire.url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=cli_env(OPENAI_API_KEY="sk-q"),
    )  # fmt: skip
    try:
        with store_runs(f"sqlite:///{store}") as runs:
            wait_until(lambda: len(wire.requests) >= 2, "two runs to ask the model", 30, 0.05)
            assert (len(runs("running")), len(runs("queued"))) == (2, 3)
            assert len(wire.requests) == 2
            released.set()
            wait_until(lambda: len(runs("done")) == 5, "every run to end done", 60, 0.1)
    finally:
        released.set()
        worker.kill()
        worker.wait(30)


def sleepers(seconds: str) -> list[int]:
    """The pids of `sleep SECONDS` processes on this machine."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "cmdline").read_bytes() == f"sleep\0{seconds}\0".encode()
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_cancels_the_run_and_its_processes(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Both ended `tether run` at once and left the bash call's processes running (here one
    in the background and one in the foreground); now they stop it as Ctrl-C does."""
    from helpers import wait_until

    seconds = f"{300 + int(sig)}.{os.getpid()}"  # a command line of this test's own
    script = tmp_path / "sleep.json"
    call = {"name": "bash", "arguments": {"command": f"sleep {seconds} & sleep {seconds}"}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "Done."}]))
    argv = [*TETHER, "run", "sleep", "--tools", "bash", "--yolo", "--provider", "scripted"]
    argv += ["--script", str(script), "--workspace", str(tmp_path), "--json"]
    proc = warm.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    assert proc.stdout is not None
    try:
        wait_until(lambda: len(sleepers(seconds)) == 2, "both sleeps to start", 30)
        proc.send_signal(sig)
        assert proc.wait(30) == 130
    finally:
        proc.kill()
    last = json.loads(proc.stdout.read().splitlines()[-1])
    assert last["type"] == "run_finished" and last["outcome"] == "cancelled"
    wait_until(lambda: not sleepers(seconds), "the call's processes to end", 10)


def test_no_escape_sequence_or_bidi_control_reaches_the_terminal(tmp_path: Path) -> None:
    """A tool's output in `tether show`, a provider's error message at the end of a run, and
    a call's arguments at an approval prompt: escape sequences and bidi controls (which show
    text in another order than it runs) never reach the terminal as they are."""
    evil = "\x1b[2J\x1b]0;owned\x07\u202eexe.txt"
    script = tmp_path / "evil.json"
    call = {"name": "bash", "arguments": {"command": f"printf '%s' '{evil}'"}}
    error = {"error": {"status": 400, "message": f"bad request {evil}"}}
    script.write_text(json.dumps([{"tool_calls": [call]}, error]))
    store = str(tmp_path / "runs.sqlite")
    argv = ["run", "x", "--tools", "bash", "--yolo", "--provider", "scripted", "--script"]
    ran = tether(
        *argv, str(script), "--store", store, "--run-id", "e1", "--workspace", str(tmp_path)
    )
    assert ran.returncode == 1 and "bad request" in ran.stderr
    shown = tether("show", "e1", "--store", store)
    assert "exe.txt" in shown.stdout
    for out in (ran.stderr, ran.stdout, shown.stdout):
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    # a task is anyone's text: `tether runs` shows it without escapes, C1 controls too
    odd = tether(*argv[:1], f"tidy {evil} \x9b2J\x9d0;t\x9c up", *argv[2:], str(script),
                 "--store", store, "--run-id", "e2", "--workspace", str(tmp_path))  # fmt: skip
    assert odd.returncode == 1
    listed = tether("runs", "--store", store).stdout
    assert "tidy" in listed and "up" in listed
    for control in ("\x1b", "\u202e", "\x07", "\x9b", "\x9d", "\x9c"):
        assert control not in listed, repr(listed)

    # at the prompt the control is spelled out, so the person sees what would run
    call["arguments"]["command"] = "echo \u202eexe.txt"
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "Done."}]))
    term = Terminal([*TETHER, *argv[:4], "--provider", "scripted", "--script", str(script),
                     "--store", "memory", "--workspace", str(tmp_path)], cli_env())  # fmt: skip
    term.wait_for("? [y/N]")
    assert b"\\u202eexe.txt" in term.seen and "\u202e".encode() not in term.seen
    term.type(b"n\n")
    assert term.exit_status(timeout=30) == 0


def test_a_store_password_on_the_command_line_leaves_it(postgres: str) -> None:
    """`--store postgresql://user:PASSWORD@...` put the password in `/proc/PID/cmdline` for
    every user of the machine, for as long as a worker runs; the command takes it out at once
    (into the Postgres client's `PGPASSWORD`) and still reaches its store."""
    from helpers import Output

    with_password = postgres.replace("postgres@", "postgres:s3cret-pw@", 1)
    assert "s3cret-pw" in with_password
    worker = warm.Popen(
        [*TETHER, "worker", "--store", with_password],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env(), text=True,
    )  # fmt: skip
    try:
        Output(worker.stderr).wait_for("executes runs built from their recorded options")
        shown = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
    finally:
        worker.kill()
        worker.wait(30)
    assert b"worker" in shown and b"127.0.0.1" in shown
    assert b"s3cret-pw" not in shown


def test_a_usage_mistake_and_a_missing_database_are_one_line_each(postgres: str) -> None:
    """A wrong `--provider` printed 22 lines of usage above the one that mattered; a Postgres
    database that does not exist exited 1 as an outage would. Each is one line, exit 2,
    saying what to do."""
    wrong = tether("run", "hi", "--provider", "nope")
    assert (wrong.returncode, wrong.stderr.count("\n")) == (2, 1), wrong.stderr
    assert "invalid choice: 'nope'" in wrong.stderr and "see tether run --help" in wrong.stderr
    missing = postgres.rsplit("/", 1)[0] + "/tether_no_such_database"
    script = str(Path(__file__).parent.parent / "examples" / "weather_script.json")
    for command in (("runs",), ("run", "hi", "--provider", "scripted", "--script", script)):
        p = tether(*command, "--store", missing)
        assert (p.returncode, p.stderr.count("\n")) == (2, 1), p.stderr
        assert "the database tether_no_such_database does not exist" in p.stderr
        assert "createdb tether_no_such_database" in p.stderr


def test_every_run_option_is_a_flag_with_its_fields_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`RunOptions` declares each option once (type, default, help) and the CLI's flags are
    made from it: a command with no flags builds the options' own defaults, a flag sets the
    field of its name as its type, and a field added without a flag fails here."""
    import dataclasses

    from tether.cli.parser import build_parser
    from tether.options import RunOptions

    monkeypatch.delenv("TETHER_PROVIDER", raising=False)
    parser = build_parser()
    for command in (["run", "hi"], ["serve"]):
        assert RunOptions.from_namespace(parser.parse_args(command)) == RunOptions()
    flagless = [f.name for f in dataclasses.fields(RunOptions) if "flag" not in f.metadata]
    assert flagless == ["only"]  # the page's checkboxes
    given = RunOptions.from_namespace(
        parser.parse_args(
            ["run", "hi", "--max-cost", "0.5", "--mcp", "a", "--mcp", "b", "--no-sandbox",
             "--yolo", "--max-steps", "3", "--sandbox-net"]
        )
    )  # fmt: skip
    assert (given.max_cost, given.mcp, given.sandbox, given.approve) == (
        0.5,
        ["a", "b"],
        False,
        "auto",
    )
    assert (given.max_steps, given.sandbox_net, given.check) == (3, True, None)
    monkeypatch.setenv("TETHER_PROVIDER", "anthropic")
    assert (
        RunOptions.from_namespace(build_parser().parse_args(["run", "hi"])).provider == "anthropic"
    )
