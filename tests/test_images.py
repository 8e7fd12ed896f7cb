"""Images: in the task and in tool results, each protocol gets them in its own form (checked
field by field in the request bodies a local server receives); events and transcripts name them
without their bytes; a durable store keeps each once, by its hash, and a run resumed after a
crash sends them again whole; a model that cannot read images says so."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers import CLIENTS, FIXTURES, cli_env, json_lines, png, tether, wait_until, wire_model
from tether import (
    Agent,
    ImagePart,
    Runtime,
    tool,
)
from wire_server import WireServer

RED, BLUE = png((200, 30, 30)), png((30, 30, 200))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def model(protocol: str, wire: WireServer) -> Any:
    return wire_model(protocol, wire.url)


async def run(agent: Agent, task: str, images: list[ImagePart]) -> tuple[Any, list[Any]]:
    events: list[Any] = []
    async with Runtime(None, [agent]) as rt:
        handle = await rt.start(agent.name, task, images=images, sinks=[events.append])
        result = await handle.wait()
    await agent.model.aclose()
    return result, events


@pytest.mark.parametrize("protocol", list(CLIENTS))
async def test_a_task_image_in_each_protocols_own_form(wire: WireServer, protocol: str) -> None:
    wire.add(text="A red square.")
    result, events = await run(
        Agent(model(protocol, wire)), "What is in this?", [ImagePart.of(RED)]
    )

    assert result.outcome == "done" and result.answer == "A red square."
    body = wire.requests[0]
    url = f"data:image/png;base64,{b64(RED)}"
    if protocol == "chat":
        assert body["messages"][-1] == {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What is in this?"},
            ],
        }
    elif protocol == "responses":
        assert body["input"][-1] == {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": url, "detail": "auto"},
                {"type": "input_text", "text": "What is in this?"},
            ],
        }
    else:
        assert body["messages"][-1] == {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)},
                },
                {"type": "text", "text": "What is in this?"},
            ],
        }
    (started,) = [e.data for e in events if e.type == "run_started"]
    sha = hashlib.sha256(RED).hexdigest()
    assert started["images"] == [{"media_type": "image/png", "sha256": sha, "bytes": len(RED)}]
    assert b64(RED) not in json.dumps([e.data for e in events])  # named, never inlined


@tool
def snapshot() -> list[object]:
    """Take a snapshot of the screen."""
    return ["the screen right now", ImagePart.of(BLUE)]


@pytest.mark.parametrize("protocol", list(CLIENTS))
async def test_a_tool_shows_the_model_an_image(wire: WireServer, protocol: str) -> None:
    wire.add(text="", calls=[("snapshot", {})]).add(text="The screen is blue.")
    result, events = await run(Agent(model(protocol, wire), [snapshot]), "Look at the screen.", [])

    assert result.outcome == "done" and result.answer == "The screen is blue."
    body = wire.requests[1]
    url = f"data:image/png;base64,{b64(BLUE)}"
    if protocol == "chat":
        tool_message, shown = body["messages"][-2:]
        assert tool_message["role"] == "tool" and tool_message["content"] == "the screen right now"
        call_id = tool_message["tool_call_id"]
        assert shown == {  # a tool message holds text only: the image follows it
            "role": "user",
            "content": [
                {"type": "text", "text": f"The images returned by snapshot ({call_id}):"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    elif protocol == "responses":
        output = body["input"][-1]
        assert output["type"] == "function_call_output"
        assert output["output"] == [
            {"type": "input_text", "text": "the screen right now"},
            {"type": "input_image", "image_url": url, "detail": "auto"},
        ]
    else:
        (block,) = body["messages"][-1]["content"]
        assert block["type"] == "tool_result"
        assert block["content"] == [
            {"type": "text", "text": "the screen right now"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": b64(BLUE)},
            },
        ]
    (shown_event,) = [e.data for e in events if e.type == "tool_result"]
    assert shown_event["output"] == "the screen right now"
    assert shown_event["images"] == [
        {"media_type": "image/png", "sha256": hashlib.sha256(BLUE).hexdigest(), "bytes": len(BLUE)}
    ]


def test_an_image_is_read_from_its_bytes_not_its_name(tmp_path: Path) -> None:
    jpeg = tmp_path / "photo.png"  # a JPEG, whatever the name says
    jpeg.write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 20)
    assert ImagePart.load(jpeg).media_type == "image/jpeg"
    webp = b"RIFF\x10\x00\x00\x00WEBPVP8 "
    assert ImagePart.of(webp).media_type == "image/webp"
    notes = tmp_path / "notes.png"
    notes.write_text("not a picture")
    with pytest.raises(ValueError, match=r"notes\.png: not a PNG, JPEG, GIF or WebP image"):
        ImagePart.load(notes)


def stored_bytes(path: Path) -> int:
    """How many bytes the values in every table of a SQLite file add up to."""
    db = sqlite3.connect(path)
    total = 0
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        for row in db.execute(f'SELECT * FROM "{table}"'):
            total += sum(len(v) for v in row if isinstance(v, (bytes, str)))
    db.close()
    return total


def test_the_cli_sends_an_image_and_the_store_keeps_it_once(
    wire: WireServer, tmp_path: Path
) -> None:
    """`--image` with the task; the tool returns the same picture, twice over two calls: the
    store holds its bytes once, and DBOS's records none of them (a picture of 150 KB that
    does not compress, against records of a few KB)."""
    picture = tmp_path / "screen.png"
    noise = b"\x89PNG\r\n\x1a\n" + os.urandom(150_000)
    picture.write_bytes(noise)
    wire.add(text="", calls=[("snapshot", {})]).add(text="", calls=[("snapshot", {})])
    wire.add(text="It is the same blue screen.")
    db = tmp_path / "runs.db"
    p = tether(
        *("run", "Is the screen still like this?", "--image", str(picture), "--json"),
        *("--store", f"sqlite:///{db}", "--base-url", wire.url, "--tools", "none"),
        *("--tools-from", str(FIXTURES / "image_tools.py"), "--run-id", "pic"),
        env=cli_env(OPENAI_API_KEY="sk-o", SNAPSHOT_FILE=str(picture)),
    )
    assert p.returncode == 0, p.stderr
    url = f"data:image/png;base64,{b64(noise)}"
    assert wire.requests[0]["messages"][-1]["content"][0] == {
        "type": "image_url",
        "image_url": {"url": url},
    }
    assert json.dumps(wire.requests[2]).count(url) == 3  # the task's and each call's

    assert stored_bytes(db) < 50_000  # no copy in DBOS's records
    assert 150_000 < stored_bytes(Path(f"{db}-effects")) < 200_000  # one copy beside them
    (started,) = [e for e in json_lines(p.stdout) if e["type"] == "run_started"]
    assert started["images"][0]["sha256"] == hashlib.sha256(noise).hexdigest()
    assert len(p.stdout) < 20_000  # the events name the picture, without its bytes

    shown = tether("show", "pic", "--store", f"sqlite:///{db}", env=cli_env())
    assert shown.returncode == 0, shown.stderr
    sha = hashlib.sha256(noise).hexdigest()[:12]
    assert shown.stdout.count(f"[image image/png, sha256 {sha}]") == 3, shown.stdout


@pytest.mark.parametrize(
    ("content", "says"),
    [(None, "No such file"), ("not a picture", "not a PNG, JPEG, GIF or WebP image")],
)
def test_a_bad_image_is_a_clear_error(
    tmp_path: Path, data_home: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "photo.png"
    if content is not None:
        path.write_text(content)
    p = tether(
        *("run", "What is in this?", "--image", str(path), "--tools", "none"),
        OPENAI_API_KEY="sk-o",
    )
    assert p.returncode == 2, p.stderr
    assert f"--image {path}" in p.stderr and says in p.stderr and "Traceback" not in p.stderr
    assert not [p for p in data_home.rglob("*") if p.is_file()]  # no run was recorded


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_run_resumed_after_a_crash_sends_its_images_whole(
    wire: WireServer, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Killed once the tool has shown its picture: the resumed run reads both images back
    from the store (its records hold only their names) and sends them in full."""
    from test_durable import kill_at

    task_picture, screen = tmp_path / "before.png", tmp_path / "screen.png"
    task_picture.write_bytes(RED)
    screen.write_bytes(BLUE)
    # the second reply is held, so the killed run cannot have recorded it (its request may
    # have gone out before the kill landed): the resumed run asks again
    held = threading.Event()
    answer = "It was red; now it is blue."
    wire.add(text="", calls=[("snapshot", {})]).add(text=answer, gate=held).add(text=answer)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    if kind == "postgres":
        store = request.getfixturevalue("postgres")
    env = cli_env(OPENAI_API_KEY="sk-o", SNAPSHOT_FILE=str(screen))
    kill_at(
        env,
        "tool_result",
        *("run", "Has the screen changed since this?", "--image", str(task_picture)),
        *("--store", store, "--base-url", wire.url, "--tools", "none", "--run-id", "pic"),
        *("--tools-from", str(FIXTURES / "image_tools.py")),
    )
    wait_until(wire.idle, "the killed run's connections to close")
    before = len(wire.requests)
    assert before in (1, 2)
    held.set()
    p = tether("resume", "pic", "--store", store, env=env)
    assert p.returncode == 0, p.stderr
    assert answer in p.stdout
    assert len(wire.requests) == before + 1
    after = json.dumps(wire.requests[-1])
    for image in (RED, BLUE):
        assert f"data:image/png;base64,{b64(image)}" in after
