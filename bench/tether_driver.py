"""Tether driver for the benchmark rig (bench/rig, a copy of the shared rig).

    python bench/rig/bench.py --add $PWD/bench/tether_driver.py:chat:1

Each run is a run of a `Runtime` in memory (its own task, mailbox and event log), as in
production; `--opt runtime=0` calls the bare Agent loop instead; `--opt store=URL` makes the
Runtime durable on that store (sqlite:///PATH or postgresql://...): each model reply and each
tool call recorded as it completes. `--opt max_model_calls=N` (0: no bound) and
`--opt keep_finished=N` set the Runtime's bounds (its defaults otherwise: 256 and 10,000).
"""

from __future__ import annotations

from typing import Any

from tether import Agent, HTTPSettings, Model, Runtime, tool
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
    if ctx.opts.get("wrap", "1") == "1":

        @tool
        async def sleep_tool(ms: int) -> str:
            """Sleep for ms milliseconds."""
            result: str = await ctx.tool(ms)
            return result

    else:  # the rig's function itself, as the bare loop calls it
        sleep_tool = tool(name="sleep_tool", description="Sleep for ms milliseconds.")(ctx.tool)

    model = make_model(ctx)
    agent = Agent(model, [sleep_tool], system="You are a benchmark agent.", name="bench")

    store = ctx.opts.get("store")
    runtime = None
    if ctx.opts.get("runtime", "1") == "1":
        bounds: dict[str, Any] = {  # --opt max_model_calls=0: no bound; keep_finished=0
            k: int(ctx.opts[k]) or None if k == "max_model_calls" else int(ctx.opts[k])
            for k in ("max_model_calls", "keep_finished")
            if k in ctx.opts
        }
        runtime = (
            Runtime(store, [agent], take_over=False, **bounds)
            if store
            else Runtime(agents=[agent], **bounds)
        )
    if runtime is not None:
        await runtime.open()

    async def run_one(i: int) -> str:
        if runtime is None:
            result = await agent.run(ctx.prompt)
        else:
            run = await runtime.start("bench", ctx.prompt)
            finished = await run.wait()
            assert finished is not None
            result = finished
        if result.outcome != "done":
            raise RuntimeError(f"run {i} {result.outcome}: {result.reason}")
        return result.answer

    async def close() -> None:
        if runtime is not None:
            await runtime.close()
        await model.aclose()

    return run_one, close
