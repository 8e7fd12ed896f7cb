"""OpenTelemetry spans of a run with tools, read back from the SDK's in-memory exporter."""

from __future__ import annotations

import pytest

import warm
from helpers import TETHER, cli_env
from tether import Agent, RateLimited, ScriptedModel, reply, tool
from wire_server import WireServer

pytest.importorskip("opentelemetry.sdk", reason="needs the otel extra")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from tether.tracing import SpanSink


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    if city == "Atlantis":
        raise LookupError("no such city")
    return f"{city}: 4 °C"


def exporter_and_sink() -> tuple[InMemorySpanExporter, SpanSink]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, SpanSink(provider.get_tracer("test"))


async def test_spans_of_a_run_with_tools() -> None:
    exporter, sink = exporter_and_sink()
    model = ScriptedModel(
        [
            reply(tool_calls=[("lookup", {"city": "Oslo"}), ("lookup", {"city": "Atlantis"})]),
            reply("Oslo is 4 °C; Atlantis is not a city."),
        ],
        name="gpt-4.1-mini",
    )
    result = await Agent(model, [lookup]).run("weather?", sinks=[sink])
    spans = {s.name: s for s in exporter.get_finished_spans()}
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == [
        "chat gpt-4.1-mini",
        "chat gpt-4.1-mini",
        "execute_tool lookup",
        "execute_tool lookup",
        "invoke_agent tether",
    ]
    run = spans["invoke_agent tether"]
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.conversation.id"] == result.run_id
    assert run.attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens
    assert run.attributes["tether.cost_usd"] == pytest.approx(result.cost_usd, abs=1e-6)
    assert run.attributes["tether.outcome"] == "done"
    children = [s for s in exporter.get_finished_spans() if s.name != run.name]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in children)
    chats = [s for s in children if s.name.startswith("chat")]
    assert all(s.attributes["gen_ai.request.model"] == "gpt-4.1-mini" for s in chats)
    assert [s.attributes["gen_ai.response.finish_reasons"] for s in chats] == [
        ("tool_use",),
        ("end_turn",),
    ]
    assert all(s.attributes["gen_ai.usage.output_tokens"] > 0 for s in chats)
    tools = sorted(
        (s for s in children if s.name.startswith("execute_tool")),
        key=lambda s: s.status.status_code == StatusCode.ERROR,
    )
    assert tools[0].attributes["gen_ai.tool.name"] == "lookup"
    assert tools[0].status.status_code != StatusCode.ERROR
    assert tools[1].status.status_code == StatusCode.ERROR
    assert tools[1].attributes["error.type"] == "tool_error"
    assert "no such city" in (tools[1].status.description or "")


async def test_a_failed_run_is_an_error_span() -> None:
    exporter, sink = exporter_and_sink()
    model = ScriptedModel([RateLimited("HTTP 429: slow down", status=429)])
    await Agent(model).run("hi", sinks=[sink])
    spans = {s.name: s for s in exporter.get_finished_spans()}
    run = spans["invoke_agent tether"]
    assert run.status.status_code == StatusCode.ERROR
    assert run.attributes["error.type"] == "rate_limited"
    assert spans["chat scripted"].status.status_code == StatusCode.ERROR  # ended with the run


def test_cli_otel_prints_spans(wire: WireServer) -> None:
    wire.add(text="hello")
    p = warm.run(
        [*TETHER, "run", "hi", "--base-url", wire.url, "--otel"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(OPENAI_API_KEY="sk-otel"),
    )
    assert p.returncode == 0
    assert '"name": "invoke_agent tether"' in p.stderr and '"name": "chat ' in p.stderr


async def test_chat_spans_use_the_genai_names_for_cached_and_reasoning_tokens() -> None:
    from tether import Usage

    exporter, sink = exporter_and_sink()
    usage = Usage(input_tokens=100, cached_input_tokens=60, output_tokens=20, reasoning_tokens=12)
    model = ScriptedModel([reply("hi", usage=usage)], name="gpt-4.1-mini")
    await Agent(model).run("hi", sinks=[sink])
    chat = next(s for s in exporter.get_finished_spans() if s.name.startswith("chat"))
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 60
    assert chat.attributes["gen_ai.usage.reasoning.output_tokens"] == 12
    assert "gen_ai.usage.cached_input_tokens" not in chat.attributes
