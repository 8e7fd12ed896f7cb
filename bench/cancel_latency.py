"""Time from cancelling a model call mid-stream to the server seeing its socket closed.

    .venv/bin/python bench/cancel_latency.py [--n 50]

For each protocol, N streamed calls are started against the test wire mock (events 50 ms apart),
cancelled after a random 50-250 ms, and the server's own record of the disconnect is compared
with the moment of the cancel. Prints p50/p99/max in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tether import Message, ModelRequest
from tether.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from wire_server import WireServer

CLIENTS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel, "anthropic": AnthropicModel}


async def measure(server: WireServer, protocol: str, n: int) -> list[float]:
    model = CLIENTS[protocol]("m", api_key="k", base_url=server.url)  # type: ignore[call-arg]
    latencies = []
    for _ in range(n):
        server.add(text="word " * 200, deltas=100, chunk_delay=0.05)
        before = server.closed_streams
        task = asyncio.create_task(model.respond(ModelRequest((Message.user("hi"),))))
        await asyncio.sleep(random.uniform(0.05, 0.25))
        cancelled = time.monotonic()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        while server.closed_streams == before:
            await asyncio.sleep(0.0005)
        latencies.append((server.closed_at[-1] - cancelled) * 1000)
    await model.aclose()
    return latencies


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    n = ap.parse_args().n
    server = WireServer().start()
    try:
        for protocol in CLIENTS:
            ms = sorted(await measure(server, protocol, n))
            p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
            print(
                f"{protocol:10s} n={n} cancel->socket closed: p50 {statistics.median(ms):.2f} ms"
                f"  p99 {p99:.2f} ms  max {ms[-1]:.2f} ms"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
