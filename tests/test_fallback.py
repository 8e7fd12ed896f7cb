"""Fallback models: when the first model cannot serve now, the next one answers, within the
run's one budget, priced as itself, and said in the events; never on an error of the request.
Against local servers speaking each provider's wire format, in memory and durable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import json_lines, tether
from tether import (
    AnthropicModel,
    ConfigError,
    FallbackModel,
    HTTPSettings,
    OpenAIChatModel,
    OpenAIResponsesModel,
    Price,
    Runtime,
)
from tether.agent import Agent
from tether.approvals import approve_all
from wire_server import WireServer

NO_RETRIES = HTTPSettings(max_retries=1, backoff_base=0.01, backoff_max=0.02, read_timeout=5)
CLIENTS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel, "anthropic": AnthropicModel}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}


@pytest.fixture
def second() -> Iterator[WireServer]:
    """The fallback's own server (a provider of its own)."""
    server = WireServer().start()
    yield server
    server.stop()


def model(protocol: str, name: str, server: WireServer) -> Any:
    cls = CLIENTS[protocol]
    return cls(name, api_key="sk-k", base_url=server.url, stream=True, settings=NO_RETRIES)


def task_of(body: dict[str, Any]) -> str:
    """The user's task in a request body of any of the three protocols."""
    if "input" in body:
        first = body["input"][0]
        content = first["content"]
        return content if isinstance(content, str) else content[0]["text"]
    user = next(m for m in body["messages"] if m["role"] == "user")
    content = user["content"]
    return content if isinstance(content, str) else content[0]["text"]


async def one_run(agent: Agent, store: str | None) -> tuple[Any, list[Any]]:
    """One run of `agent`; its models are closed after, as the README's programs close theirs
    (the Runtime closes only the agents it built)."""
    events: list[Any] = []
    async with Runtime(store, [agent]) as rt:
        run = await rt.start(
            agent.name, "Say who you are.", sinks=[events.append], approver=approve_all
        )
        result = await run.wait()
    await agent.model.aclose()
    return result, events


@pytest.mark.parametrize("protocol", list(CLIENTS))
@pytest.mark.parametrize(
    "failure",
    [
        {"status": 529, "type": "overloaded_error"},
        {"status": 500},
        {"status": 429},
        {"status": 408},
        {"fault": "reset"},
    ],
    ids=["overloaded", "5xx", "429", "408", "connection"],
)
async def test_the_next_model_answers_when_the_first_cannot_serve_now(
    wire: WireServer,
    second: WireServer,
    protocol: str,
    failure: dict[str, Any],
) -> None:
    for _ in range(2):  # the first model's one retry fails too
        wire.add(**failure, headers={"Retry-After": "0"})
    second.add(text="I am the fallback.")
    primary, fallback = model("chat", "primary-1", wire), model(protocol, "backup-2", second)
    prices = {"primary-1": Price(1.0, 1.0, 1.0), "backup-2": Price(10.0, 10.0, 10.0)}
    agent = Agent(FallbackModel(primary, fallback), name="fb", prices=prices)
    result, events = await one_run(agent, None)

    assert (result.outcome, result.answer) == ("done", "I am the fallback.")
    assert len(wire.requests) == 2 and len(second.requests) == 1
    assert second.paths == [PATHS[protocol]]  # in the fallback's own wire format
    assert task_of(second.requests[0]) == "Say who you are."
    (fell,) = [e.data for e in events if e.type == "fallback"]
    assert (fell["failed"], fell["to"]) == ("primary-1", "backup-2")
    assert fell["error"]["retryable"] is True
    (answered,) = [e.data for e in events if e.type == "model_response"]
    assert answered["model"] == "backup-2"
    # priced as the model that answered: 10 $ a million tokens, not the first model's 1 $
    assert result.cost_usd == pytest.approx(result.usage.total_tokens * 10 / 1_000_000)


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_an_error_of_the_request_itself_does_not_fall_back(
    wire: WireServer, second: WireServer, status: int
) -> None:
    wire.add(status=status, type="invalid_request_error", message="bad request")
    second.add(text="should not be asked")
    agent = Agent(FallbackModel(model("chat", "p", wire), model("anthropic", "b", second)))
    result, events = await one_run(agent, None)
    assert result.outcome == "failed" and result.error["status"] == status
    assert second.requests == []
    assert not [e for e in events if e.type == "fallback"]


async def test_the_last_models_error_ends_the_run_when_every_model_fails(
    wire: WireServer, second: WireServer
) -> None:
    for _ in range(2):
        wire.add(status=503)
        second.add(status=529, type="overloaded_error", message="Overloaded")
    agent = Agent(FallbackModel(model("chat", "p", wire), model("anthropic", "b", second)))
    result, _ = await one_run(agent, None)
    assert result.outcome == "failed"
    assert result.error["kind"] == "server_error" and result.error["status"] == 529


def test_a_fallback_model_needs_a_model_to_fall_back_to(wire: WireServer) -> None:
    with pytest.raises(ConfigError, match="at least one model to fall back to"):
        FallbackModel(model("chat", "p", wire))


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_the_cli_falls_back_to_another_provider(
    wire: WireServer, second: WireServer, tmp_path: Path, store: str
) -> None:
    """In memory and durable (a durable run records which model answered each reply, so a
    replay never switches: the store's events say it)."""
    wire.add(status=529, type="overloaded_error").add(status=529, type="overloaded_error")
    wire.add(status=529, type="overloaded_error")  # --max-retries 2: three tries in all
    second.add(text="Anthropic here.")
    if store == "sqlite":
        store = f"sqlite:///{tmp_path / 'runs.db'}"
    p = tether(
        *("run", "who are you?", "--store", store, "--json", "--tools", "none", "--run-id", "f1"),
        *("--provider", "openai-chat", "--base-url", wire.url),
        *("--fallback", f"anthropic:claude-backup@{second.url}"),
        OPENAI_API_KEY="sk-o",
        ANTHROPIC_API_KEY="sk-a",
    )
    assert p.returncode == 0, p.stderr
    events = json_lines(p.stdout)
    (fell,) = [e for e in events if e["type"] == "fallback"]
    assert (fell["failed"], fell["to"]) == ("gpt-4.1-mini", "claude-backup")
    (end,) = [e for e in events if e["type"] == "run_finished"]
    assert end["answer"] == "Anthropic here."
    assert second.paths == ["/v1/messages"] and second.requests[0]["model"] == "claude-backup"
    if store != "memory":
        shown = tether("show", "f1", "--store", store, "--json")
        assert shown.returncode == 0, shown.stderr
        (recorded,) = [e for e in json_lines(shown.stdout) if e["type"] == "model_response"]
        assert recorded["model"] == "claude-backup"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("claude-backup", "is not PROVIDER:MODEL[@URL]"),
        ("gemini:pro", "is not PROVIDER:MODEL[@URL]"),
        ("anthropic:", "is not PROVIDER:MODEL[@URL]"),
        ("anthropic:c@ftp://x", "is not an http(s) URL"),
    ],
)
def test_a_bad_fallback_is_a_clear_error(spec: str, says: str) -> None:
    p = tether(
        *("run", "hi", "--store", "memory", "--tools", "none", "--fallback", spec),
        OPENAI_API_KEY="sk-o",
        ANTHROPIC_API_KEY="sk-a",
    )
    assert p.returncode == 2
    assert says in p.stderr and "Traceback" not in p.stderr
