"""What encoding a durable step's record costs (`durable/records.py`): a model step of one reply
with three tool calls, and the tool step of their three results, each `steps.record`ed 20,000
times; microseconds a record. Every step of a durable run is encoded as it is recorded, and its
inputs and result once each.

    .venv/bin/python bench/records_encode.py [SRC]     # SRC: another tree's src, to compare
"""

from __future__ import annotations

import sys
import timeit

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])

from tether.durable.steps import ModelStep, ToolsStep, record
from tether.messages import Message, ModelResponse, TextPart, ToolCall, ToolResult, Usage

CALLS = tuple(ToolCall(f"c{i}", "sleep_tool", {"ms": 50}, "") for i in range(3))
REPLY = Message("assistant", (TextPart("thinking about it"), *CALLS))
MODEL = ModelStep(ModelResponse(REPLY, "tool_calls", Usage(100, 20), "m"), 1.0, 2.0, [], [])
TOOLS = ToolsStep([ToolResult(f"c{i}", "sleep_tool", "slept 50 ms", False) for i in range(3)], 3.0)

if __name__ == "__main__":
    n = 20_000
    for name, step in (("model step", MODEL), ("tools step", TOOLS)):
        took = timeit.timeit(lambda step=step: record(step), number=n)  # type: ignore[misc]
        print(f"{name}: {took / n * 1e6:.2f} us a record, {len(record(step))} bytes")
