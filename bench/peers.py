"""Tether beside every peer on the same task, the same mock model and the same machine, in one
command (`bench/peers`, which makes its own venv and runs this).

Each variant runs in a process of its own (the rig's `harness.py`, `bench/rig`), the variants
taking turns within each repetition, against the rig's mock LLM (`mock_llm.py`, OpenAI Chat
Completions, streamed), with the peers' versions pinned (`bench/peers.lock`). A row is the
median of its repetitions (five by default), with the least and the most. Scenarios (K model
turns of T parallel `sleep_tool` calls):

- a: one run at a time, K=5, T=1, no latency, 20 runs: the CPU a runtime adds per model turn;
- c100 and c1000: 100 and 1,000 runs at once, K=3, T=3, 50 ms model latency and 50 ms tools.

Every durable variant gets a fresh store (a new SQLite file, a new Postgres database), and after
its run the store's rows are counted: what each runtime records of a run (its steps, its tool
calls), so "durable" means the same thing on every row, and a peer that keeps no record of tool
calls is marked so. A Postgres variant's figure counts the server's CPU too (its postmaster and
backends, over the same phase as the driver's own: `BENCH_SERVER_PID`), and its ratios are of
the total: a runtime that writes more rows pays for them there.

Then start-up: each runtime started from nothing for one run (its command-line tool where it
has one, else the smallest script its docs show), the time from the process's start to its
first request at the mock, medians of 5, the runtimes in turn.

    bench/peers [--scenarios a,c100,c1000] [--reps 5] [--only NAME,...] [--startup 5]
                [--postgres URL]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RIG = Path(os.environ.get("BENCH_RIG", HERE / "rig")).resolve()


def at_once(n: int, most_reps: int | None = None) -> dict[str, Any]:
    """n runs at once, each 3 turns of 3 parallel 50 ms tools, 50 ms model latency.
    `most_reps`: repetitions at most, whatever `--reps` says."""
    mock = dict(steps=3, tools=3, latency_ms=50, tool_ms=50, deltas=8)
    return dict(mock=mock, n=n, repeat=1, warmup=1, timeout=240, most_reps=most_reps)


SCENARIOS: dict[str, dict[str, Any]] = {
    "a": dict(
        mock=dict(steps=5, tools=1, latency_ms=0, tool_ms=0, deltas=8),
        n=1,
        repeat=20,
        warmup=3,
        timeout=120,
    ),
    "c100": at_once(100),
    "c1000": at_once(1000, most_reps=1),
}
"""c1000 runs once: its peers take 60-90 s a variant, so two repetitions alone took about 17
minutes (over the 20 the command is meant to take), and its figures are already medians over a
thousand runs."""


@dataclass
class Variant:
    """One runtime in one mode: its driver, its options, the store it records in (none, a
    SQLite file or a Postgres database), and how to count what it recorded there."""

    name: str
    driver: Path
    opts: dict[str, str] = field(default_factory=dict)
    store: str = ""  # "", "sqlite" or "postgres"
    store_opt: str = "store"
    sqlite_url: bool = True  # the driver takes sqlite:///PATH (else a bare path)
    counts: dict[str, str] = field(default_factory=dict)  # what: SQL counting it
    memory_twin: str = ""  # the variant of the same runtime without a store
    stream: int = 1


TETHER = HERE / "tether_driver.py"
LANGGRAPH = HERE / "langgraph_driver.py"
PAI_DBOS = RIG / "drivers" / "pydantic_ai_dbos_driver.py"
TETHER_COUNTS = {  # on SQLite the ledger is a file of its own beside the store: {ledger}
    "runs": "SELECT count(*) FROM {dbos}workflow_status",
    "steps": "{ledger}SELECT count(*) FROM tether_steps",
    "tool calls": "{ledger}SELECT count(*) FROM tether_tool_calls",
}
DBOS_COUNTS = {
    "runs": "SELECT count(*) FROM {dbos}workflow_status",
    "steps": "SELECT count(*) FROM {dbos}operation_outputs",
}
LANGGRAPH_COUNTS = {
    "checkpoints": "SELECT count(*) FROM checkpoints",
    "writes": "SELECT count(*) FROM {writes}",
}

VARIANTS = [
    Variant("bare aiohttp loop", RIG / "drivers" / "baseline_aiohttp.py"),
    Variant("tether", TETHER),
    Variant("tether sqlite", TETHER, store="sqlite", counts=TETHER_COUNTS, memory_twin="tether"),
    Variant(
        "tether postgres", TETHER, store="postgres", counts=TETHER_COUNTS, memory_twin="tether"
    ),
    Variant("pydantic-ai", RIG / "drivers" / "pydantic_ai_driver.py"),
    Variant(
        "pydantic-ai dbos sqlite",
        PAI_DBOS,
        store="sqlite",
        counts=DBOS_COUNTS,
        memory_twin="pydantic-ai",
    ),
    Variant(
        "pydantic-ai dbos postgres",
        PAI_DBOS,
        store="postgres",
        counts=DBOS_COUNTS,
        memory_twin="pydantic-ai",
    ),
    Variant(
        "pydantic-ai dbos sqlite tool steps",
        PAI_DBOS,
        {"tool_steps": "1"},
        store="sqlite",
        counts=DBOS_COUNTS,
        memory_twin="pydantic-ai",
    ),
    Variant(
        "pydantic-ai dbos postgres tool steps",
        PAI_DBOS,
        {"tool_steps": "1"},
        store="postgres",
        counts=DBOS_COUNTS,
        memory_twin="pydantic-ai",
    ),
    Variant("openai-agents", RIG / "drivers" / "openai_agents_driver.py"),
    Variant("langgraph", LANGGRAPH, {"saver": "none"}),
    Variant(
        "langgraph sqlite",
        LANGGRAPH,
        {"saver": "sqlite"},
        store="sqlite",
        sqlite_url=False,
        counts=LANGGRAPH_COUNTS,
        memory_twin="langgraph",
    ),
    Variant(
        "langgraph postgres",
        LANGGRAPH,
        {"saver": "postgres"},
        store="postgres",
        counts=LANGGRAPH_COUNTS,
        memory_twin="langgraph",
    ),
    Variant(
        "langgraph sqlite sync",
        LANGGRAPH,
        {"saver": "sqlite", "durability": "sync"},
        store="sqlite",
        sqlite_url=False,
        counts=LANGGRAPH_COUNTS,
        memory_twin="langgraph",
    ),
    Variant(
        "langgraph postgres sync",
        LANGGRAPH,
        {"saver": "postgres", "durability": "sync"},
        store="postgres",
        counts=LANGGRAPH_COUNTS,
        memory_twin="langgraph",
    ),
]
"""LangGraph's default durability, `async`, does not wait for a step's checkpoint before the
next step; the `sync` rows wait, as Tether's and DBOS's durable runs do."""
BARE = "bare aiohttp loop"
TOOLS_NOT_RECORDED = {"pydantic-ai dbos sqlite", "pydantic-ai dbos postgres"}
"""DBOSAgent runs function tools inline in its workflow: a tool call is not a recorded step.
The `tool steps` rows make the tool a `@DBOS.step`, as pydantic-ai's docs advise for a tool
that does I/O: each call recorded, as Tether records each."""


def rig() -> Any:
    """The shared rig's runner (its mock, its harness) as a module."""
    spec = importlib.util.spec_from_file_location("rig_bench", RIG / "bench.py")
    if spec is None or spec.loader is None:
        sys.exit(f"peers: no benchmark rig at {RIG} (set BENCH_RIG)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Stores:
    """Fresh stores for the durable variants, and the count of what each recorded."""

    def __init__(self, postgres: str) -> None:
        self.postgres = postgres.rstrip("/")
        self.made = 0
        self.postmaster = 0

    def fresh(self, kind: str) -> tuple[str, Callable[[dict[str, str]], dict[str, int]]]:
        """A new store's URL (or path), and how to count its rows and drop it."""
        self.made += 1
        if kind == "sqlite":
            path = Path(tempfile.mkdtemp(prefix="peers-")) / "store.sqlite"

            def count_here(counts: dict[str, str]) -> dict[str, int]:
                try:
                    return sqlite_counts(path, counts)
                finally:
                    shutil.rmtree(path.parent, ignore_errors=True)

            return str(path), count_here
        name = f"tether_peers_{os.getpid()}_{self.made}"
        self.admin(f"DROP DATABASE IF EXISTS {name}")
        self.admin(f"CREATE DATABASE {name}")
        url = f"{self.postgres}/{name}"

        def count(counts: dict[str, str]) -> dict[str, int]:
            try:
                return postgres_counts(url, counts)
            finally:
                self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

        return url, count

    def server_pid(self) -> int:
        """The Postgres server's postmaster (the parent of a backend): the harness counts its
        CPU, with its backends', beside the driver's. The server must run on this machine."""
        import psutil
        import psycopg

        if self.postmaster:
            return self.postmaster
        with psycopg.connect(f"{self.postgres}/postgres", autocommit=True) as c:
            backend = int(c.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
            try:  # read while the backend lives: it ends with the connection
                parent = psutil.Process(backend).parent()
            except psutil.Error:
                parent = None
        if parent is None:
            raise SystemExit("peers: the Postgres server is not a process of this machine")
        self.postmaster = int(parent.pid)
        return self.postmaster

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(f"{self.postgres}/postgres", autocommit=True) as c:
            c.execute(sql)  # type: ignore[arg-type]


def sqlite_counts(path: Path, counts: dict[str, str]) -> dict[str, int]:
    import sqlite3

    found = {}
    for what, sql in counts.items():
        where = Path(f"{path}-effects") if sql.startswith("{ledger}") else path
        with sqlite3.connect(where) as c:
            q = sql.format(dbos="", writes="writes", ledger="")
            found[what] = int(c.execute(q).fetchone()[0])
    return found


def postgres_counts(url: str, counts: dict[str, str]) -> dict[str, int]:
    import psycopg

    found = {}
    with psycopg.connect(url) as c:
        for what, sql in counts.items():
            q = sql.format(dbos="dbos.", writes="checkpoint_writes", ledger="")
            found[what] = int(c.execute(q).fetchone()[0])  # type: ignore[arg-type, index]
    return found


def run_one(r: Any, port: int, scenario: str, v: Variant, stores: Stores) -> dict[str, Any]:
    sc = dict(SCENARIOS[scenario], name=scenario)
    opts = dict(v.opts)
    count = None
    if v.store:
        where, count = stores.fresh(v.store)
        if v.store == "sqlite" and v.sqlite_url:
            where = f"sqlite:///{where}"
        opts[v.store_opt] = where
    # the server's CPU is the run's too: counted over the same phase as the driver's
    server = str(stores.server_pid()) if v.store == "postgres" else ""
    os.environ["BENCH_SERVER_PID"] = server
    res: dict[str, Any] = r.run_variant(
        port, sc, v.name, (str(v.driver), "chat", v.stream), [f"{k}={x}" for k, x in opts.items()]
    )
    os.environ.pop("BENCH_SERVER_PID", None)
    if count is not None:
        try:
            res["recorded"] = count(v.counts)
        except Exception as e:  # a store the run never made: say so in the row
            res["recorded"] = {"error": f"{type(e).__name__}: {e}"}
    return res


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
    return statistics.median(values) if values else None


def spread(rows: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """The least and the most of a figure over the repetitions (None with fewer than two)."""
    values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
    return (min(values), max(values)) if len(values) > 1 else None


def total_per_turn(run: dict[str, Any]) -> float | None:
    """The driver's CPU per model turn and its database server's (0 for none, or in process)."""
    own = run.get("cpu_ms_per_model_turn")
    if not isinstance(own, int | float):
        return None
    return own + (run.get("server_ms_per_model_turn") or 0.0)


def summary(results: list[dict[str, Any]], scenario: str) -> list[dict[str, Any]]:
    """One row a variant: medians over the repetitions, and the ratios."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for res in results:
        if res["scenario"] == scenario:
            by_name.setdefault(res["variant"], []).append(res)
    rows = []
    for v in VARIANTS:
        runs = by_name.get(v.name)
        if not runs:
            continue
        total = sum(r.get("n", 0) * r.get("repeat", 1) for r in runs)
        ok = sum(r.get("completed_ok", 0) for r in runs)
        for run in runs:
            run["total_ms_per_turn"] = total_per_turn(run)
        rows.append(
            {
                "variant": v.name,
                "ok": f"{ok}/{total}",
                "cpu_ms_per_turn": median(runs, "cpu_ms_per_model_turn"),
                "cpu_spread": spread(runs, "cpu_ms_per_model_turn"),
                "server_ms_per_turn": median(runs, "server_ms_per_model_turn")
                if v.store == "postgres"
                else None,
                "total_ms_per_turn": median(runs, "total_ms_per_turn"),
                "reps": len(runs),
                "wall_s": median(runs, "wall_per_batch_s"),
                "peak_rss_mb": median(runs, "peak_rss_mb"),
                "tools_in_flight": max((r.get("max_tools_in_flight") or 0) for r in runs),
                "recorded": runs[-1].get("recorded"),
                "memory_twin": v.memory_twin,
                "errors": sorted({e for r in runs for e in (r.get("errors") or {})})[:1]
                or [r["fatal"] for r in runs if "fatal" in r][:1],
            }
        )
    bare = next((r["total_ms_per_turn"] for r in rows if r["variant"] == BARE), None)
    cpu = {r["variant"]: r["total_ms_per_turn"] for r in rows}
    for row in rows:  # with the server's CPU: a store's work is the run's, wherever it runs
        row["x_bare"] = ratio(row["total_ms_per_turn"], bare)
        row["x_memory"] = ratio(row["total_ms_per_turn"], cpu.get(row["memory_twin"]))
    return rows


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 1) if a and b else None


def recorded_text(row: dict[str, Any]) -> str:
    found = row.get("recorded")
    if not found:
        return ""
    if "error" in found:
        return str(found["error"])[:60]
    text = ", ".join(f"{n:,} {what}" for what, n in found.items())
    return text + ("; tool calls not recorded" if row["variant"] in TOOLS_NOT_RECORDED else "")


def table(rows: list[dict[str, Any]], scenario: str) -> str:
    def num(x: float | None, f: str = "{:.2f}") -> str:
        return "-" if x is None else f.format(x)

    def ranged(row: dict[str, Any]) -> str:
        low_high = row.get("cpu_spread")
        shown = num(row["cpu_ms_per_turn"])
        return f"{shown} ({low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else shown

    lines = [
        f"scenario {scenario} (medians of each variant's repetitions; CPU: min-max)",
        "",
        "| variant | runs ok | CPU ms / model turn | + Postgres server | total | x bare loop "
        "| x own memory mode | wall s | peak RSS MB | tools in flight | recorded |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['ok']} | {ranged(r)} | {num(r['server_ms_per_turn'])} | "
            f"{num(r['total_ms_per_turn'])} | "
            f"{num(r['x_bare'], '{:.1f}')} | {num(r['x_memory'], '{:.1f}')} | "
            f"{num(r['wall_s'])} | {num(r['peak_rss_mb'], '{:.0f}')} | {r['tools_in_flight']} | "
            f"{recorded_text(r)} |"
        )
    return "\n".join(lines)


STARTUP = {
    "tether (CLI)": [
        "{bin}/tether",
        "run",
        "hi",
        "--base-url",
        "{base}",
        "--model",
        "m",
        "--store",
        "memory",
        "--no-sandbox",
    ],
    "tether": [
        "{bin}/python",
        "-c",
        """
import asyncio
from tether import Agent, OpenAIChatModel
async def main():
    async with OpenAIChatModel("m", base_url="{base}", api_key="x") as model:
        print((await Agent(model, []).run("hi")).answer)
asyncio.run(main())
""",
    ],
    "pydantic-ai (clai)": ["{clai}", "-m", "openai:m", "--no-stream", "hi"],
    "mini-swe-agent (mini)": [
        "{mini}",
        *("-m", "openai/m", "-t", "hi", "--yolo", "--exit-immediately", "--cost-limit", "0"),
        *("-c", "mini.yaml", "-c", "model.model_kwargs.api_base={base}"),
        *("-c", "agent.step_limit=1", "-o", "{scratch}/mini.traj.json"),
    ],
    "pydantic-ai": [
        "{bin}/python",
        "-c",
        """
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
model = OpenAIChatModel("m", provider=OpenAIProvider(base_url="{base}", api_key="x"))
print(Agent(model).run_sync("hi").output)
""",
    ],
    "openai-agents": [
        "{bin}/python",
        "-c",
        """
from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI
set_tracing_disabled(True)
model = OpenAIChatCompletionsModel("m", AsyncOpenAI(base_url="{base}", api_key="x"))
print(Runner.run_sync(Agent("a", model=model), "hi").final_output)
""",
    ],
    "langgraph": [
        "{bin}/python",
        "-c",
        """
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
agent = create_react_agent(ChatOpenAI(model="m", base_url="{base}", api_key="x"), [])
print(agent.invoke({{"messages": [("user", "hi")]}})["messages"][-1].content)
""",
    ],
    # durable: one run recorded in a SQLite store that exists (made by the first start)
    "tether sqlite (CLI)": [
        *("{bin}/tether", "run", "hi", "--base-url", "{base}", "--model", "m"),
        *("--store", "sqlite:///{scratch}/cli.sqlite", "--no-sandbox"),
    ],
    "tether sqlite": [
        "{bin}/python",
        "-c",
        """
import asyncio
from tether import Agent, OpenAIChatModel, Runtime
async def main():
    async with OpenAIChatModel("m", base_url="{base}", api_key="x") as model:
        async with Runtime("sqlite:///{scratch}/lib.sqlite", [Agent(model, [], name="a")]) as rt:
            print((await (await rt.start("a", "hi")).wait()).answer)
asyncio.run(main())
""",
    ],
    "pydantic-ai dbos sqlite": [
        "{bin}/python",
        "-c",
        """
import sys, warnings
try:
    import sqlite3
    if sqlite3.sqlite_version_info < (3, 42):  # as the rig's driver: DBOS needs 3.42
        raise ImportError
except ImportError:
    import pysqlite3, pysqlite3.dbapi2
    sys.modules["sqlite3"], sys.modules["sqlite3.dbapi2"] = pysqlite3, pysqlite3.dbapi2
from dbos import DBOS
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
warnings.simplefilter("ignore")
from pydantic_ai.durable_exec.dbos import DBOSAgent
url = "sqlite:///{scratch}/dbos.sqlite"
DBOS(config={{"name": "startup", "system_database_url": url, "log_level": "WARNING"}})
model = OpenAIChatModel("m", provider=OpenAIProvider(base_url="{base}", api_key="x"))
agent = DBOSAgent(Agent(model, name="startup"))
DBOS.launch()
print(agent.run_sync("hi").output)
""",
    ],
    "langgraph sqlite": [
        "{bin}/python",
        "-c",
        """
import sqlite3, uuid
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import create_react_agent
saver = SqliteSaver(sqlite3.connect("{scratch}/lg.sqlite", check_same_thread=False))
model = ChatOpenAI(model="m", base_url="{base}", api_key="x")
agent = create_react_agent(model, [], checkpointer=saver)
thread = {{"configurable": {{"thread_id": str(uuid.uuid4())}}}}
print(agent.invoke({{"messages": [("user", "hi")]}}, thread)["messages"][-1].content)
""",
    ],
}
"""How each runtime is started for one run, from nothing: its command-line tool where it has
one (pydantic-ai's `clai` and mini-swe-agent's `mini`, each in a venv of its own: `clai` pins
an older pydantic-ai, `mini` brings litellm), else the smallest script its docs show; and
durable, in memory's stead, one run recorded in a SQLite store that exists."""

TOOL_VENVS = {
    "{clai}": HERE / ".venv-clai" / "bin" / "clai",
    "{mini}": HERE / ".venv-mini" / "bin" / "mini",
}
QUIET_MINI = {
    "MSWEA_CONFIGURED": "true",  # no first-run set-up questions
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",  # the mock's model has no price
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm fetches its prices from the web otherwise
}


def served(port: int) -> int:
    """How many requests the mock has answered."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        stats = json.loads(r.read())
    return sum(v for k, v in stats.items() if isinstance(v, int) and k != "maxrss_kb")


def base_of(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1"


def first_request_s(command: list[str], port: int) -> float:
    """Seconds from the process's start to its first request reaching the mock (the mock's
    counters read every 2 ms); the process is then let finish."""
    before = served(port)
    env = {**os.environ, **QUIET_MINI, "OPENAI_API_KEY": "x", "OPENAI_BASE_URL": base_of(port)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        while served(port) == before:
            if proc.poll() is not None:
                raise RuntimeError(f"{command[:3]} ended first: {proc.stderr.read()[-300:]!r}")  # type: ignore[union-attr]
            time.sleep(0.002)
        return time.perf_counter() - t0
    finally:
        proc.wait(60)


def startup(r: Any, reps: int) -> dict[str, float]:
    """The median seconds to the first request of each runtime, started in turn."""
    port = r.free_port()
    mock = r.start_mock(port, dict(steps=0, tools=1, latency_ms=0, tool_ms=0, deltas=1))
    bin_dir = str(Path(sys.executable).parent)
    chosen = {  # a tool whose venv is missing is left out
        name: template
        for name, template in STARTUP.items()
        if all(path.exists() for tag, path in TOOL_VENVS.items() if tag in template)
    }
    taken: dict[str, list[float]] = {name: [] for name in chosen}
    scratch = tempfile.mkdtemp(prefix="peers-startup-")
    tools = {tag.strip("{}"): str(path) for tag, path in TOOL_VENVS.items()}
    try:
        for _ in range(reps):
            for name, template in chosen.items():
                command = [
                    part.format(bin=bin_dir, base=base_of(port), scratch=scratch, **tools)
                    for part in template
                ]
                taken[name].append(first_request_s(command, port))
    finally:
        mock.kill()
        mock.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    return {name: round(statistics.median(s), 3) for name, s in taken.items()}


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in ("tether", "pydantic-ai-slim", "openai-agents", "langgraph", "dbos", "openai"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[dist] = metadata.version(dist)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="a,c100,c1000", help='"" for start-up alone')
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", help="variants by name, comma-separated")
    ap.add_argument(
        "--startup", type=int, default=5, help="starts of each runtime to time (0: none)"
    )
    ap.add_argument(
        "--postgres",
        default=os.environ.get("TETHER_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432"),
        help="a server where fresh databases may be made",
    )
    args = ap.parse_args()
    chosen = [v for v in VARIANTS if not args.only or v.name in args.only.split(",")]
    r = rig()
    stores = Stores(args.postgres)
    results: list[dict[str, Any]] = []
    began = time.monotonic()
    scenarios = [s for s in args.scenarios.split(",") if s]
    for scenario in scenarios:
        sc = SCENARIOS[scenario]
        port = r.free_port()
        mock = r.start_mock(port, sc["mock"])
        try:
            for rep in range(1, min(args.reps, sc.get("most_reps") or args.reps) + 1):
                for v in chosen:  # in turn, so drift in the machine falls on every variant
                    res = run_one(r, port, scenario, v, stores)
                    res["rep"] = rep
                    results.append(res)
                    print(r.fmt_row(res), recorded_text({**res, "variant": v.name}), flush=True)
        finally:
            mock.kill()
            mock.wait()
    started = startup(r, args.startup) if args.startup else {}
    took = time.monotonic() - began
    out = HERE / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip(),
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "versions": versions(),
        "took_s": round(took),
        "scenarios": {k: SCENARIOS[k] for k in scenarios},
    }
    rows = {s: summary(results, s) for s in scenarios}
    everything = {"meta": meta, "rows": rows, "startup_s": started, "results": results}
    out.write_text(json.dumps(everything, indent=1))
    print(f"\n{json.dumps(meta['versions'])}; {meta['machine']}; {took:.0f} s; {out.name}\n")
    for s in scenarios:
        print(table(rows[s], s), "\n")
    if started:
        print(f"start-up: process start to the first request at the mock, median of {args.startup}")
        print("\n| runtime | seconds |\n| --- | --- |")
        print("\n".join(f"| {name} | {s:.3f} |" for name, s in started.items()))


if __name__ == "__main__":
    main()
