"""LangGraph driver for the benchmark rig (`bench/rig`): its prebuilt ReAct agent
(`langgraph.prebuilt.create_react_agent`) over `langchain_openai.ChatOpenAI`, the durable peer
most teams use when given a checkpointer.

    python bench/rig/bench.py --add $PWD/bench/langgraph_driver.py:chat:1 --opt saver=sqlite

opts:
  saver=none|sqlite|postgres   no checkpointer (in memory, nothing kept: the default); the
                               SQLite saver (`AsyncSqliteSaver`, one aiosqlite connection, as
                               its docs show); the Postgres saver (`AsyncPostgresSaver` over a
                               psycopg pool of 20, as its docs advise for a server)
  store=PATH|URL               the SQLite file or the Postgres database (default: a new file)
  durability=async|sync        LangGraph's default, `async`, writes a step's checkpoint while
                               the next step runs (a crash may lose it); `sync` waits for it
                               before going on, as a durable run of Tether or DBOS does

Each run is a thread of its own (`thread_id`), so a saver keeps one checkpoint per super-step
and the writes of each node (the model's reply, the tools' results) of every run.
"""

from __future__ import annotations

import tempfile
import uuid
from typing import Any

NAME = "langgraph"
PROTOCOLS = {"chat"}


async def saver_for(ctx: Any) -> tuple[Any, Any]:
    """The checkpointer the opts ask for, and how to close it."""
    kind = ctx.opts.get("saver", "none")
    if kind == "none":
        return None, None
    if kind == "sqlite":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        path = ctx.opts.get("store") or f"{tempfile.mkdtemp()}/langgraph.sqlite"
        conn = await aiosqlite.connect(path)
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        return saver, conn.close
    if kind == "postgres":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        pool = AsyncConnectionPool(
            ctx.opts["store"],
            max_size=20,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=False,
        )
        await pool.open()
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        return saver, pool.close
    raise ValueError(f"saver={kind}: use none, sqlite or postgres")


async def setup(ctx: Any) -> Any:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    async def sleep_tool(ms: int) -> str:
        """Sleep for ms milliseconds."""
        result: str = await ctx.tool(ms)
        return result

    model = ChatOpenAI(
        model=ctx.model,
        base_url=ctx.base_url,
        api_key=ctx.api_key,
        streaming=bool(ctx.stream),
        timeout=600,
        max_retries=0,
    )
    saver, close = await saver_for(ctx)
    durability = ctx.opts.get("durability", "async")
    agent = create_react_agent(
        model, [sleep_tool], prompt="You are a benchmark agent.", checkpointer=saver
    )

    async def run_one(i: int) -> str:
        config = {"configurable": {"thread_id": f"run-{i}-{uuid.uuid4().hex[:8]}"}}
        given = {"messages": [("user", ctx.prompt)]}
        out = await agent.ainvoke(given, config, durability=durability)
        return str(out["messages"][-1].content)

    async def aclose() -> None:
        if close is not None:
            await close()

    return run_one, aclose
