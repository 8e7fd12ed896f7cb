"""Tether as a Harbor agent, for Terminal-Bench and any Harbor task set (`tether-runtime[harbor]`).

    harbor run -d terminal-bench@2.0 --agent tether.harbor.agent:TetherAgent \\
        --model anthropic/claude-sonnet-4-5
    harbor run --path examples/terminal-tasks --env tether.harbor.sandbox:SandboxEnvironment \\
        --agent tether.harbor.agent:TetherAgent --model scripted \\
        --ak script=examples/terminal-tasks/scripted.json

An external agent: the loop runs in Harbor's process and reaches the task's environment through
`exec` and its upload and download calls (see `tools.py`). `--model provider/name` picks the
client: `anthropic/...`, `openai/...` (Responses; `--ak api=openai-chat` for Chat Completions),
any other provider name with `--ak base_url=...` (a compatible server), `local` (the offline
model) or `scripted` with `--ak script=FILE`. Other kwargs: `max_steps`, `max_cost`,
`context_window`, `check` (`false`: no check of the work before the answer).

Harbor cancels `run()` when the task's time is up and keeps only what was already written, so
the token counts and cost in `AgentContext` and the ATIF trajectory in `logs_dir` are updated
after every model reply and tool result, not at the end.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
from harbor.agents.base import BaseAgent
from harbor.agents.capabilities import AgentCapabilities
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from ..agent import Agent
from ..approvals import approve_all
from ..context import ContextPolicy, window_for
from ..errors import ConfigError
from ..events import Event
from ..loop import Budget
from ..messages import Usage
from ..providers import Model, ScriptedModel, make_model
from ..providers.scripted import read_script
from ..runtime import Runtime
from ..tally import Tally
from ..terminal import TERMINAL_CHECK, TERMINAL_SYSTEM
from ..tools.tool import RunContext
from ..transcript import atif
from ..version import __version__
from .tools import TOOLS

TRAJECTORY = "trajectory.json"
PROVIDERS = {"anthropic": "anthropic", "openai": "openai-responses"}


class TetherAgent(BaseAgent):
    capabilities = AgentCapabilities(atif=True)

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *args: Any,
        script: str | None = None,
        base_url: str | None = None,
        api: str | None = None,
        max_steps: int | str = 100,
        max_cost: float | str | None = None,
        context_window: int | str | None = None,
        check: bool | str = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, model_name, *args, **kwargs)
        self.script = script
        self.base_url = base_url
        self.api = api
        self.max_steps = int(max_steps)
        self.max_cost = float(max_cost) if max_cost is not None else None
        self.context_window = int(context_window) if context_window is not None else None
        self.check = str(check).lower() not in ("false", "0", "no", "off")

    @staticmethod
    def name() -> str:
        return "tether"

    def version(self) -> str | None:
        return __version__

    async def setup(self, environment: BaseEnvironment) -> None:
        """Nothing to install: Tether runs in Harbor's process and works through `exec`."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        model = self.model_for(instruction)
        workdir = environment.task_env_config.workdir or await current_directory(environment)
        window = self.context_window or window_for(model.name)
        agent = Agent(
            model,
            TOOLS,
            system=TERMINAL_SYSTEM,
            check=TERMINAL_CHECK if self.check else None,
            budget=Budget(max_steps=self.max_steps, max_cost_usd=self.max_cost),
            context=ContextPolicy(window, reserve=min(4096, window // 4)) if window else None,
        )
        record = Record(self.logs_dir / TRAJECTORY, context, model.name)
        try:
            async with Runtime(agents=[agent]) as rt:
                run = await rt.start(
                    agent,
                    instruction,
                    context=RunContext(workspace=Path(workdir), deps=environment),
                    sinks=[record],
                    approver=approve_all,  # the environment is the sandbox; no one to ask
                )
                try:
                    await run.wait()
                except asyncio.CancelledError:  # Harbor's timeout: keep what was done
                    run.cancel()
                    await run.wait()
                    raise
        finally:
            await model.aclose()

    def model_for(self, instruction: str) -> Model:
        name = self.model_name or ""
        provider, _, model = name.partition("/")
        if provider == "scripted" or (not name and self.script):
            return scripted_for(instruction, self.script)
        if provider == "local":
            return make_model("local")
        if not model:
            raise ConfigError(
                f"--model {name!r}: give provider/name (anthropic/..., openai/...), local, "
                "or scripted with --ak script=FILE"
            )
        api = self.api or PROVIDERS.get(provider) or "openai-chat"
        if api == "openai-chat" and provider not in PROVIDERS and not self.base_url:
            raise ConfigError(f"--model {name!r}: an unknown provider needs --ak base_url=URL")
        return make_model(api, model, base_url=self.base_url)


def scripted_for(instruction: str, script: str | None) -> ScriptedModel:
    """A scripted model for this instruction. A script file is either one list of replies, or
    an object mapping a phrase of an instruction to that task's replies."""
    if not script:
        raise ConfigError("--model scripted needs --ak script=FILE")
    items = read_script(script)
    if isinstance(items, dict):
        chosen = [replies for phrase, replies in items.items() if phrase in instruction]
        if len(chosen) != 1:
            raise ConfigError(
                f"script {script}: {len(chosen)} entries match this instruction "
                f"({instruction[:60]!r}...); exactly one must"
            )
        items = chosen[0]
    return ScriptedModel.from_json(items, script)


async def current_directory(environment: BaseEnvironment) -> str:
    result = await environment.exec("pwd")
    return (result.stdout or "/").strip() or "/"


class Record:
    """An event sink that keeps Harbor's view of the run current: the token counts and cost in
    its `AgentContext`, and the ATIF trajectory on disk (written whole, then renamed)."""

    def __init__(self, path: Path, context: AgentContext, model: str) -> None:
        self.path = path
        self.context = context
        self.events: list[Event] = []
        self.tally = Tally()  # the run's usage and cost as they grow (the same fold as the page's)
        path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, event: Event) -> None:
        if event.type == "text_delta":
            return
        self.events.append(event)
        self.tally(event)
        if event.type in ("model_response", "context_summarized", "tool_result"):
            self.update(self.tally.usage, self.tally.cost)
        elif event.type == "run_finished":
            self.update(Usage.from_dict(event.data.get("usage") or {}), event.data["cost_usd"])
            self.context.metadata = {
                "outcome": event.data["outcome"],
                "reason": event.data["reason"],
                "steps": event.data.get("steps"),
            }
        if event.type in ("model_response", "tool_result", "run_finished", "context_trimmed"):
            self.write()

    def update(self, usage: Usage, cost: float) -> None:
        self.context.n_input_tokens = usage.input_tokens
        self.context.n_cache_tokens = usage.cached_input_tokens
        self.context.n_output_tokens = usage.output_tokens
        self.context.cost_usd = round(cost, 6)

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(atif(self.events), option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.path)
