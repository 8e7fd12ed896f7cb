"""Transcripts (tether show: text, events, ATIF) and secrets: a planted key is searched for in
every output Tether writes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import tether as run_tether
from wire_server import WireServer

KEY = "sk-planted-0123456789abcdefXYZ"
TOKEN = "tok-planted-9876543210"


def tether(*args: str, data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI with a planted key and token, keeping its runs in `data`."""
    return run_tether(
        *args, OPENAI_API_KEY=KEY, MY_SERVICE_TOKEN=TOKEN, XDG_DATA_HOME=str(data), **env
    )


@pytest.fixture
def finished_run(wire: WireServer, tmp_path: Path) -> tuple[str, Path]:
    wire.add(text="Looking.", calls=[("bash", {"command": "echo hello"})])
    wire.add(text="It said hello.")
    p = tether(
        "run",
        "say hello",
        "--base-url",
        wire.url,
        "--tools",
        "bash",
        "--approve",
        "auto",
        "--run-id",
        "run-show-1",
        "--workspace",
        str(tmp_path),
        data=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    return "run-show-1", tmp_path


def test_show_prints_the_transcript(finished_run: tuple[str, Path]) -> None:
    run_id, data = finished_run
    p = tether("show", run_id, data=data)
    assert p.returncode == 0
    assert p.stdout.splitlines() == [
        "user: say hello",
        "assistant: Looking.",
        '  → bash({"command":"echo hello"})',
        "  ← exit status 0",
        "hello",
        "assistant: It said hello.",
        "[done]",
    ]


def test_show_json_is_the_event_stream(finished_run: tuple[str, Path]) -> None:
    run_id, data = finished_run
    events = [
        json.loads(line) for line in tether("show", run_id, "--json", data=data).stdout.splitlines()
    ]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"


def test_show_atif_trajectory(finished_run: tuple[str, Path]) -> None:
    run_id, data = finished_run
    t: dict[str, Any] = json.loads(tether("show", run_id, "--atif", data=data).stdout)
    assert t["schema_version"] == "ATIF-v1.4" and t["session_id"] == run_id
    assert t["agent"]["name"] == "tether" and t["agent"]["model_name"] == "gpt-4.1-mini"
    steps = t["steps"]
    assert [s["step_id"] for s in steps] == [1, 2, 3]
    assert [s["source"] for s in steps] == ["user", "agent", "agent"]
    call = steps[1]["tool_calls"][0]
    assert call["function_name"] == "bash" and call["arguments"] == {"command": "echo hello"}
    assert steps[1]["observation"]["results"] == [
        {"source_call_id": call["tool_call_id"], "content": "exit status 0\nhello\n"}
    ]
    assert steps[1]["metrics"]["prompt_tokens"] == 50
    assert t["final_metrics"]["total_prompt_tokens"] == 100
    assert t["final_metrics"]["total_steps"] == 3


def test_show_unknown_run_is_a_clear_error(tmp_path: Path) -> None:
    p = tether("show", "nope", data=tmp_path)
    assert p.returncode == 2 and "no run nope" in p.stderr


def test_a_planted_secret_reaches_no_output(wire: WireServer, tmp_path: Path) -> None:
    leak = "echo $OPENAI_API_KEY; echo $MY_SERVICE_TOKEN; echo Bearer $OPENAI_API_KEY"
    wire.add(calls=[("bash", {"command": leak})])
    wire.add(
        status=401,
        type="invalid_api_key",
        message=f"Incorrect API key provided: {KEY}. Authorization: Bearer {KEY}",
    )
    log = tmp_path / "tether.log"
    runs = [
        tether(
            "run",
            "leak it",
            "--base-url",
            wire.url,
            "--tools",
            "bash",
            "--tool-env",  # passed on purpose: redaction still keeps them out of the output
            "OPENAI_API_KEY",
            "--tool-env",
            "MY_SERVICE_TOKEN",
            "--approve",
            "auto",
            "--json",
            "--run-id",
            "leaky",
            "--log",
            str(log),
            "--otel",
            "--workspace",
            str(tmp_path),
            data=tmp_path,
        ),
    ]
    wire.add(calls=[("bash", {"command": leak})]).add(text="done")
    runs.append(
        tether(
            "run",
            "leak it again",
            "--base-url",
            wire.url,
            "--tools",
            "bash",
            "--tool-env",  # passed on purpose: redaction still keeps them out of the output
            "OPENAI_API_KEY",
            "--tool-env",
            "MY_SERVICE_TOKEN",
            "--approve",
            "auto",
            "--workspace",
            str(tmp_path),
            data=tmp_path,
        )
    )
    assert runs[0].returncode == 1 and runs[1].returncode == 0
    shows = [tether("show", "leaky", *form, data=tmp_path) for form in ([], ["--json"], ["--atif"])]
    outputs = {
        "stdout --json": runs[0].stdout,
        "stderr (with spans)": runs[0].stderr,
        "stdout": runs[1].stdout,
        "stderr": runs[1].stderr,
        "log": log.read_text(),
        **{f"show {i}": s.stdout for i, s in enumerate(shows)},
        **{f"journal {p.name}": p.read_text() for p in (tmp_path / "tether/events").iterdir()},
    }
    for name, text in outputs.items():
        assert KEY not in text, f"the planted key is in {name}"
        assert TOKEN not in text, f"the planted token is in {name}"
        assert KEY[:20] not in text, f"part of the planted key is in {name}"
    # the tool really ran and the error really came back, with the secrets replaced
    result = next(
        json.loads(line) for line in runs[0].stdout.splitlines() if '"tool_result"' in line
    )
    assert result["output"].count("[redacted]") == 3
    assert "Incorrect API key provided: [redacted]" in runs[0].stdout
    assert '"name": "invoke_agent tether"' in runs[0].stderr
    assert len(wire.headers) == 4 and wire.headers[0]["Authorization"] == f"Bearer {KEY}"


def test_secrets_are_found_by_their_shape_too(wire: WireServer, tmp_path: Path) -> None:
    """Keys that are in no environment variable of Tether's (a file's, another service's) are
    found by their shape: `sk-...`, `Bearer ...`, `x-api-key: ...`, and kept out of the events,
    the store, and what goes back to the model."""
    secrets = ["sk-proj-Zq81LmNo0pQrStUvWxYz12", "eyJhbGciOi.J9fakeToken77", "ant-3c9f0d1e2b4a5968"]
    config = f"{secrets[0]}\nAuthorization: Bearer {secrets[1]}\nx-api-key: {secrets[2]}\n"
    (tmp_path / "config.txt").write_text(config)
    wire.add(calls=[("bash", {"command": "cat config.txt"})]).add(text="Read it.")
    p = tether(
        *("run", "read the config", "--base-url", wire.url, "--tools", "bash", "--json"),
        *("--approve", "auto", "--workspace", str(tmp_path), "--run-id", "shapes"),
        data=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    shown = tether("show", "shapes", "--json", data=tmp_path).stdout
    sent = json.dumps(wire.requests[1])  # the tool result, as the model gets it
    for where, text in {"events": p.stdout, "store": shown, "model": sent}.items():
        for secret in secrets:
            assert secret not in text, f"{secret} reached the {where}"
    assert sent.count("[redacted]") == 3  # the output went back, with the keys replaced
