"""The page's runs list over a big store: how long one page takes to read, first and deep, with
and without a filter, and the counts by state, as the store grows.

    .venv/bin/python bench/list_page.py [--runs 2000,100000] [--store postgresql://...]

Queues the runs (one transaction each 10,000, as `Runtime.enqueue_many` does; no worker takes
them), then times through the store's view what `GET /api/list` reads: the first page of 50,
the page after 50 pages (by cursor), a text filter that matches one run (which reads every
run's record until it finds it, up to the scan limit), and the counts. Medians of 5. A fresh
SQLite file per size unless --store names a Postgres database (emptied first).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether import Agent, OpenAIChatModel, Runtime
from tether.durable.remote import StoreView
from tether.run_filter import Cursor, RunFilter

BATCH = 10_000


def timed(fn: Callable[[], Any], repeat: int = 5) -> tuple[float, Any]:
    """The median milliseconds of `fn()`, and its last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def fill(store: str, runs: int) -> None:
    agent = Agent(OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1", api_key="x"), [])
    runtime = Runtime(store, [agent])
    for start in range(0, runs, BATCH):
        tasks = [f"errand {i:06d}" for i in range(start, min(runs, start + BATCH))]
        runtime.enqueue_many(agent, tasks)


def measure(store: str, runs: int) -> dict[str, float]:
    t0 = time.perf_counter()
    fill(store, runs)
    queued_s = time.perf_counter() - t0
    view = StoreView(store)
    first_ms, first = timed(lambda: view.page(RunFilter(), None, 50))
    after: Cursor | None = first.next
    for _ in range(49):  # to page 51 (or the last)
        if after is None:
            break
        after = view.page(RunFilter(), after, 50).next
    deep_ms, _ = timed(lambda: view.page(RunFilter(), after, 50))
    needle = RunFilter(text=f"errand {runs // 2:06d}")
    text_ms, found = timed(lambda: view.page(needle, None, 50), repeat=3)
    return {
        "runs": runs,
        "queue_s": round(queued_s, 1),
        "first_page_ms": round(first_ms, 1),
        "page_51_ms": round(deep_ms, 1),
        "text_filter_ms": round(text_ms, 1),
        "text_filter_scanned": found.scanned,
        "text_filter_found": len(found.rows),
    }


def empty_postgres(url: str) -> None:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS dbos CASCADE")
        c.execute("DROP TABLE IF EXISTS " + ", ".join(TETHER_TABLES))


TETHER_TABLES = (
    "tether_steps",
    "tether_tool_calls",
    "tether_inbox",
    "tether_questions",
    "tether_executors",
    "tether_images",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="2000,100000")
    ap.add_argument("--store", help="a Postgres database to use (emptied first)")
    args = ap.parse_args()
    print("| store | runs | queued in | first page | page 51 | text filter (runs read) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for runs in (int(n) for n in args.runs.split(",")):
        if args.store:
            empty_postgres(args.store)
            store, kind = args.store, "Postgres"
        else:
            store, kind = f"sqlite:///{Path(tempfile.mkdtemp()) / 'runs.db'}", "SQLite"
        r = measure(store, runs)
        print(
            f"| {kind} | {runs:,} | {r['queue_s']} s | {r['first_page_ms']} ms | "
            f"{r['page_51_ms']} ms | {r['text_filter_ms']} ms ({r['text_filter_scanned']:,}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
