"""The agents a runtime finds by name: those registered with it (and the agents their tools run
as children), and those its factory builds from a run's recorded options, each built once per
name and options, so the runs that share options share a model client and its HTTP pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from .agent import Agent
from .errors import ConfigError

Factory = Callable[[str, dict[str, Any]], Awaitable[Agent]]
"""Builds an agent from its name and a run's options (`Runtime(factory=...)`)."""


class Agents:
    """A runtime's agents: `registered` by name, and those `factory` built, until `aclose`."""

    def __init__(self, factory: Factory | None = None) -> None:
        self.registered: dict[str, Agent] = {}
        self.factory = factory
        self.built: dict[str, asyncio.Future[Agent]] = {}  # by name and options

    def named(self, agent: str | Agent) -> str:
        """The name a run is started by: the agent's own, registering it if it is an Agent."""
        if isinstance(agent, Agent):
            self.register(agent)
            return agent.name
        return agent

    def register(self, agent: Agent) -> None:
        """Find `agent` by its name here, and the agents its tools run as children."""
        old = self.registered.get(agent.name)
        if old is agent:
            return
        if old is not None:
            raise ConfigError(f"two agents are named {agent.name!r}")
        self.registered[agent.name] = agent
        for t in agent.toolbox.tools.values():
            if isinstance(t.agent, Agent):
                self.register(t.agent)

    def versions(self) -> dict[str, str]:
        """The version of each agent registered here, by name."""
        return {name: agent.effective_version for name, agent in self.registered.items()}

    async def agent_for(self, name: str, options: dict[str, Any] | None = None) -> Agent:
        """The agent `name`, or the one the factory builds from `options` (built once per
        name and options: runs with the same options share its HTTP pool)."""
        if options is None:
            agent = self.registered.get(name)
            if agent is None:
                known = ", ".join(sorted(self.registered)) or "none"
                raise ConfigError(f"no agent named {name!r} is registered here (known: {known})")
            return agent
        if self.factory is None:
            raise ConfigError(
                f"agent {name!r} is built from options, and this runtime has no factory"
            )
        key = name + "\n" + orjson.dumps(options, option=orjson.OPT_SORT_KEYS).decode()
        found = self.built.get(key)
        if found is None:
            found = self.built[key] = asyncio.get_running_loop().create_future()
            try:
                found.set_result(await self.factory(name, options))
            except BaseException as e:
                del self.built[key]
                found.set_exception(e)
                found.exception()  # retrieved: the caller gets it below
        return await asyncio.shield(found)

    async def aclose(self) -> None:
        """Close the models of the agents built here (their HTTP pools, a local server)."""
        for future in self.built.values():
            if future.done() and future.exception() is None:
                await future.result().model.aclose()
        self.built.clear()
