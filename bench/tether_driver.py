"""Tether driver for the shared benchmark rig (../shared/bench): one Agent, runs in parallel.

python ../shared/bench/bench.py --add $PWD/bench/tether_driver.py:chat:1
"""

from __future__ import annotations

from typing import Any

from tether import Agent, HTTPSettings, Model, tool
from tether.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

NAME = "tether"
PROTOCOLS = {"chat", "responses", "anthropic"}


def make_model(ctx: Any) -> Model:
    settings = HTTPSettings(
        max_connections=int(ctx.opts.get("max_connections", 0)), read_timeout=600
    )
    if ctx.protocol == "anthropic":
        return AnthropicModel(
            ctx.model,
            api_key=ctx.api_key,
            base_url=ctx.anthropic_base_url,
            stream=bool(ctx.stream),
            settings=settings,
        )
    cls = OpenAIChatModel if ctx.protocol == "chat" else OpenAIResponsesModel
    return cls(
        ctx.model,
        api_key=ctx.api_key,
        base_url=ctx.base_url,
        stream=bool(ctx.stream),
        settings=settings,
    )


async def setup(ctx: Any) -> Any:
    @tool
    async def sleep_tool(ms: int) -> str:
        """Sleep for ms milliseconds."""
        result: str = await ctx.tool(ms)
        return result

    model = make_model(ctx)
    agent = Agent(model, [sleep_tool], system="You are a benchmark agent.")

    async def run_one(i: int) -> str:
        result = await agent.run(ctx.prompt)
        if result.outcome != "done":
            raise RuntimeError(f"run {i} {result.outcome}: {result.reason}")
        return result.answer

    return run_one, model.aclose
