"""Against the real OpenAI API: run only with OPENAI_API_KEY set (`pytest -m live`)."""

from __future__ import annotations

import os

import pytest

from tether import Agent, OpenAIChatModel, tool

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not os.environ.get("OPENAI_API_KEY"), reason="OPENAI_API_KEY is not set"),
]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.mark.parametrize("stream", [True, False])
async def test_openai_chat_tool_round_trip(stream: bool) -> None:
    model = OpenAIChatModel(
        os.environ.get("TETHER_LIVE_MODEL", "gpt-4.1-mini"),
        api_key=os.environ["OPENAI_API_KEY"],
        stream=stream,
    )
    try:
        result = await Agent(model, [add]).run(
            "Use the add tool to add 2 and 40; reply with the sum."
        )
    finally:
        await model.aclose()
    assert result.outcome == "done" and "42" in result.answer
    assert result.usage.input_tokens > 0
