"""Typed answers: the schema reaches each protocol in its own form (checked field by field in
the request bodies a local server receives), the answer comes back typed, an answer that does
not match goes back to the model, and a model that never matches fails the run, in memory and
durable, from Python and from the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import warm
from helpers import CLIENTS, json_lines, tether, wire_model
from tether import (
    Agent,
    Runtime,
)
from wire_server import WireServer


class Invoice(BaseModel):
    number: str
    total_cents: int


def model(protocol: str, wire: WireServer, stream: bool = True) -> Any:
    return wire_model(protocol, wire.url, stream)


def answer(wire: WireServer, protocol: str, value: Any) -> None:
    """The model's answer as each protocol gives a structured one: Anthropic calls the
    final-answer tool, the others answer in text."""
    if protocol == "anthropic":
        wire.add(text="", calls=[("final_answer", value)])
    else:
        wire.add(text=json.dumps(value))


async def run_agent(agent: Agent) -> Any:
    events: list[Any] = []
    async with Runtime(None, [agent]) as rt:
        run = await rt.start(agent.name, "Read invoice A-7.", sinks=[events.append])
        result = await run.wait()
    await agent.model.aclose()  # the Runtime closes only the agents it built
    return result, events


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("protocol", list(CLIENTS))
async def test_a_typed_answer_in_each_protocols_own_form(
    wire: WireServer, protocol: str, stream: bool
) -> None:
    answer(wire, protocol, {"number": "A-7", "total_cents": 4200})
    agent = Agent(model(protocol, wire, stream), output_type=Invoice)
    result, events = await run_agent(agent)

    assert result.outcome == "done", result.reason
    assert result.output == Invoice(number="A-7", total_cents=4200)
    (finished,) = [e.data for e in events if e.type == "run_finished"]
    assert finished["output"] == {"number": "A-7", "total_cents": 4200}
    body = wire.requests[0]
    schema = Invoice.model_json_schema()
    if protocol == "chat":
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "Invoice", "schema": schema, "strict": False},
        }
    elif protocol == "responses":
        assert body["text"] == {
            "format": {"type": "json_schema", "name": "Invoice", "schema": schema, "strict": False}
        }
    else:
        (tool,) = body["tools"]
        assert (tool["name"], tool["input_schema"]) == ("final_answer", schema)
        assert "response_format" not in body and "text" not in body


@pytest.mark.parametrize("protocol", list(CLIENTS))
async def test_an_answer_that_does_not_match_goes_back_to_the_model(
    wire: WireServer, protocol: str
) -> None:
    answer(wire, protocol, {"number": "A-7", "total_cents": "a lot"})
    answer(wire, protocol, {"number": "A-7", "total_cents": 4200})
    result, _ = await run_agent(Agent(model(protocol, wire), output_type=Invoice))
    assert result.outcome == "done" and result.output.total_cents == 4200
    assert len(wire.requests) == 2
    told = json.dumps(wire.requests[1])
    assert "does not match the required output schema" in told and "total_cents" in told
    assert result.steps == 2  # both answers count against the budget


async def test_a_model_that_never_matches_fails_the_run(wire: WireServer) -> None:
    for _ in range(3):
        wire.add(text="It is invoice A-7, about forty-two euros.")
    result, _ = await run_agent(Agent(model("chat", wire), output_type=Invoice))
    assert result.outcome == "failed" and result.output is None
    assert result.error["kind"] == "output_invalid"
    assert "after 3 tries" in result.reason and "not JSON" in result.reason
    assert len(wire.requests) == 3


async def test_a_json_schema_answer_in_a_fence_is_read(wire: WireServer) -> None:
    schema = {
        "title": "total",
        "type": "object",
        "properties": {"cents": {"type": "integer", "minimum": 0}},
        "required": ["cents"],
    }
    wire.add(text='```json\n{"cents": -5}\n```').add(text='```json\n{"cents": 4200}\n```')
    result, _ = await run_agent(Agent(model("chat", wire), output_type=schema))
    assert result.output == {"cents": 4200}
    assert "cents: -5 is less than the minimum of 0" in json.dumps(wire.requests[1])


def test_an_output_type_is_a_model_or_a_schema(wire: WireServer) -> None:
    with pytest.raises(TypeError, match="pydantic model class or a JSON Schema"):
        Agent(model("chat", wire), output_type=int)
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        Agent(model("chat", wire), output_type={"type": "no such type"})


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_the_cli_prints_the_typed_answer(wire: WireServer, tmp_path: Path, store: str) -> None:
    schema = tmp_path / "invoice.json"
    schema.write_text(json.dumps(Invoice.model_json_schema()))
    wire.add(text='{"number": "A-7"}').add(text='{"number": "A-7", "total_cents": 4200}')
    if store == "sqlite":
        store = f"sqlite:///{tmp_path / 'runs.db'}"
    p = tether(
        *("run", "Read invoice A-7.", "--store", store, "--json", "--tools", "none"),
        *("--base-url", wire.url, "--output-schema", str(schema)),
        OPENAI_API_KEY="sk-o",
    )
    assert p.returncode == 0, p.stderr
    (end,) = [e for e in json_lines(p.stdout) if e["type"] == "run_finished"]
    assert end["output"] == {"number": "A-7", "total_cents": 4200}
    assert wire.requests[0]["response_format"]["json_schema"]["name"] == "Invoice"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read"),
        ("{not json", "is not JSON"),
        ("[1, 2]", "is not a JSON Schema"),
        ('{"type": 7}', "not a valid JSON Schema"),
    ],
)
def test_a_bad_output_schema_is_a_clear_error(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    p = tether(
        *("run", "hi", "--store", "memory", "--tools", "none", "--output-schema", str(path)),
        OPENAI_API_KEY="sk-o",
    )
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and "Traceback" not in p.stderr


PROGRAM = """
import asyncio, sys
from pydantic import BaseModel
from tether import Agent, HTTPSettings, OpenAIChatModel, Runtime

class Invoice(BaseModel):
    number: str
    total_cents: int

async def main() -> None:
    fast = HTTPSettings(max_retries=0)
    model = OpenAIChatModel("m", api_key="k", base_url=sys.argv[2], settings=fast)
    agent = Agent(model, output_type=Invoice, name="reader")
    async with Runtime(sys.argv[1], [agent]) as rt:
        result = await (await rt.start("reader", "Read invoice A-7.")).wait()
    print(type(result.output).__name__, result.output.total_cents)

asyncio.run(main())
"""


def test_a_durable_run_gives_the_typed_answer(wire: WireServer, tmp_path: Path) -> None:
    """On a store the answer is recorded as JSON; the process that started the run gets it
    back as the output type."""
    import sys

    from helpers import cli_env

    wire.add(text='{"number": "A-7", "total_cents": 4200}')
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    p = warm.run(
        [sys.executable, "-c", PROGRAM, store, wire.url],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["Invoice", "4200"]


async def test_a_long_schema_title_is_cut_to_the_length_protocols_allow(wire: WireServer) -> None:
    """OpenAI refuses a json_schema name over 64 characters, or with other than letters,
    digits, `_` and `-`."""
    schema = {"title": "an invoice: " + "x" * 100, "type": "object"}
    wire.add(text="{}")
    result, _ = await run_agent(Agent(model("chat", wire), output_type=schema))
    assert result.output == {}
    name = wire.requests[0]["response_format"]["json_schema"]["name"]
    assert name == ("an_invoice__" + "x" * 100)[:64]
