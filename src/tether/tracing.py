"""OpenTelemetry spans from a run's events, following the GenAI semantic conventions.

    invoke_agent tether          (the run: outcome, usage, cost)
     ├── chat gpt-4.1-mini       (each model call: model, tokens, finish reason)
     └── execute_tool get_weather  (each tool call: name, call id, error)

Spans are made from events (as a sink), so tracing needs no hooks in the loop, costs nothing
when off, and can be rebuilt later from a journal. Needs the `otel` extra; off by default
(`tether run --otel`, or pass `SpanSink(tracer)` in `sinks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .events import Event


def ns(ts: float) -> int:
    return int(ts * 1e9)


@dataclass
class RunSpans:
    run: Span
    provider: str = ""
    model: str = ""
    chat: Span | None = None
    tools: dict[str, Span] = field(default_factory=dict)


class SpanSink:
    def __init__(self, tracer: trace.Tracer | None = None, agent_name: str = "tether") -> None:
        self.tracer = tracer or trace.get_tracer("tether")
        self.agent_name = agent_name
        self.runs: dict[str, RunSpans] = {}

    def __call__(self, event: Event) -> None:
        handler = getattr(self, "on_" + event.type, None)
        if handler is not None:
            handler(event, event.data)

    def on_run_started(self, e: Event, d: dict[str, Any]) -> None:
        old = self.runs.get(e.run_id)
        if old is not None:  # a restart continues the same run: one span per attempt
            old.run.end(ns(e.ts))
        span = self.tracer.start_span(
            f"invoke_agent {self.agent_name}",
            kind=SpanKind.INTERNAL,
            start_time=ns(e.ts),
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self.agent_name,
                "gen_ai.conversation.id": e.run_id,
                "gen_ai.provider.name": d.get("provider", ""),
                "gen_ai.request.model": d.get("model", ""),
            },
        )
        self.runs[e.run_id] = RunSpans(span, d.get("provider", ""), d.get("model", ""))

    def child(self, e: Event, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Span:
        parent = trace.set_span_in_context(self.runs[e.run_id].run)
        return self.tracer.start_span(
            name, context=parent, kind=kind, start_time=ns(e.ts), attributes=attributes
        )

    def on_model_request(self, e: Event, d: dict[str, Any]) -> None:
        r = self.runs.get(e.run_id)
        if r is None:
            return
        r.chat = self.child(
            e,
            f"chat {r.model}",
            SpanKind.CLIENT,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": r.provider,
                "gen_ai.request.model": r.model,
                "gen_ai.conversation.id": e.run_id,
            },
        )

    def on_retry(self, e: Event, d: dict[str, Any]) -> None:
        r = self.runs.get(e.run_id)
        if r is not None and r.chat is not None:
            r.chat.add_event(
                "retry",
                {
                    "attempt": d["attempt"],
                    "delay_s": d["delay"],
                    "error.type": d["error"].get("kind", ""),
                },
                ns(e.ts),
            )

    def on_model_response(self, e: Event, d: dict[str, Any]) -> None:
        r = self.runs.get(e.run_id)
        if r is None or r.chat is None:
            return
        usage = d.get("usage") or {}
        r.chat.set_attributes(
            {
                "gen_ai.usage.input_tokens": usage.get("input_tokens", 0),
                "gen_ai.usage.output_tokens": usage.get("output_tokens", 0),
                "gen_ai.usage.cache_read.input_tokens": usage.get("cached_input_tokens", 0),
                "gen_ai.usage.reasoning.output_tokens": usage.get("reasoning_tokens", 0),
                "gen_ai.response.finish_reasons": [d.get("stop_reason", "")],
            }
        )
        r.chat.end(ns(e.ts))
        r.chat = None

    def on_tool_call(self, e: Event, d: dict[str, Any]) -> None:
        if e.run_id not in self.runs:
            return
        self.runs[e.run_id].tools[d["id"]] = self.child(
            e,
            f"execute_tool {d['name']}",
            SpanKind.INTERNAL,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": d["name"],
                "gen_ai.tool.call.id": d["id"],
                "gen_ai.tool.type": "function",
            },
        )

    def on_tool_result(self, e: Event, d: dict[str, Any]) -> None:
        r = self.runs.get(e.run_id)
        span = r.tools.pop(d["id"], None) if r else None
        if span is None:
            return
        if d.get("is_error"):
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, d.get("output", "")[:200]))
        span.end(ns(e.ts))

    def on_run_finished(self, e: Event, d: dict[str, Any]) -> None:
        r = self.runs.pop(e.run_id, None)
        if r is None:
            return
        end = ns(e.ts)
        for span in [*([r.chat] if r.chat else []), *r.tools.values()]:
            span.set_status(Status(StatusCode.ERROR, "the run ended before it finished"))
            span.end(end)
        usage = d.get("usage") or {}
        r.run.set_attributes(
            {
                "gen_ai.usage.input_tokens": usage.get("input_tokens", 0),
                "gen_ai.usage.output_tokens": usage.get("output_tokens", 0),
                "tether.outcome": d.get("outcome", ""),
                "tether.steps": d.get("steps", 0),
                "tether.cost_usd": d.get("cost_usd", 0.0),
            }
        )
        if d.get("outcome") == "failed":
            error = d.get("error") or {}
            r.run.set_attribute("error.type", error.get("kind", "error"))
            r.run.set_status(Status(StatusCode.ERROR, d.get("reason", "")[:200]))
        elif d.get("outcome") == "cancelled":
            r.run.set_attribute("error.type", "cancelled")
        r.run.end(end)


def configure() -> tuple[SpanSink, Any]:
    """A sink for the CLI's `--otel`: the tracer provider already set up in the process if any,
    else the SDK's, exporting over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set (and the OTLP
    exporter is installed), otherwise to stderr. Returns the sink and a shutdown function."""
    import os
    import sys

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    provider = TracerProvider()
    processor: Any = SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )

            processor = BatchSpanProcessor(OTLPSpanExporter())
        except ImportError:
            pass
    provider.add_span_processor(processor)
    return SpanSink(provider.get_tracer("tether")), provider.shutdown
