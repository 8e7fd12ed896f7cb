#!/usr/bin/env python3
"""Run ONE driver for ONE scenario in THIS process and print one `RESULT {json}` line.

    python harness.py drivers/pydantic_ai_driver.py --port 8765 --protocol chat --stream 0 \
        --n 1000 --timeout 300 [--warmup 1] [--opt key=value ...]

bench.py launches this as a separate process per (driver, scenario); it can also be run by hand.
The driver interface is documented in README.md and drivers/_template.py.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import ipaddress
import json
import os
import resource
import socket
import sys
import time
import traceback
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

T_PROC0 = time.perf_counter()

# ----------------------------------------------------------------------------- loopback-only guard
# Frameworks sometimes phone home (tracing exporters, price tables ...).  Refuse anything that is
# not loopback *before* the driver module is imported, and count the attempts.
BLOCKED: Counter = Counter()
_orig_getaddrinfo = socket.getaddrinfo
_orig_connect = socket.socket.connect
_orig_connect_ex = socket.socket.connect_ex


def _loopback(host) -> bool:
    if host in ("localhost", None, ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _guard_getaddrinfo(host, *a, **k):
    h = host.decode() if isinstance(host, bytes) else host
    if not _loopback(h):
        BLOCKED[f"dns:{h}"] += 1
        raise socket.gaierror(socket.EAI_NONAME, f"bench guard: non-loopback host {h!r} blocked")
    return _orig_getaddrinfo(host, *a, **k)


def _addr_ok(self, addr) -> bool:
    if self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(addr, tuple):
        if not _loopback(addr[0]):
            BLOCKED[f"connect:{addr[0]}"] += 1
            return False
    return True


def _guard_connect(self, addr):
    if not _addr_ok(self, addr):
        raise ConnectionRefusedError(f"bench guard: non-loopback address {addr!r} blocked")
    return _orig_connect(self, addr)


def _guard_connect_ex(self, addr):
    if not _addr_ok(self, addr):
        return 111
    return _orig_connect_ex(self, addr)


socket.getaddrinfo = _guard_getaddrinfo
socket.socket.connect = _guard_connect
socket.socket.connect_ex = _guard_connect_ex
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")

FINAL_PREFIX = "Final answer"


# ----------------------------------------------------------------------------- the tool + context
class ToolStats:
    def __init__(self):
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0


TOOL_STATS = ToolStats()


async def sleep_tool_impl(ms: int) -> str:
    """The one tool every driver must expose as `sleep_tool(ms: int) -> str`."""
    st = TOOL_STATS
    st.calls += 1
    st.in_flight += 1
    if st.in_flight > st.max_in_flight:
        st.max_in_flight = st.in_flight
    try:
        await asyncio.sleep(ms / 1000)
    finally:
        st.in_flight -= 1
    return f"slept {ms} ms"


@dataclass
class DriverContext:
    base_url: str            # OpenAI-style, ends in /v1
    anthropic_base_url: str  # no /v1 (the Anthropic SDK appends /v1/messages)
    protocol: str            # chat | responses | anthropic
    stream: bool
    api_key: str
    model: str
    n: int                   # concurrent runs that will be launched
    tool: Callable[[int], Awaitable[str]]  # async sleep_tool implementation to wrap
    opts: dict[str, str] = field(default_factory=dict)
    prompt: str = "Call sleep_tool as instructed, then answer."


def load_driver(path: str):
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("bench_driver", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for attr in ("NAME", "PROTOCOLS", "setup"):
        if not hasattr(mod, attr):
            raise SystemExit(f"driver {path} lacks {attr}")
    return mod


def mock_stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
        return json.loads(r.read())


def rusage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_maxrss


def server_cpu_s() -> float:
    """CPU seconds of the database server named by BENCH_SERVER_PID (its postmaster): the
    postmaster, its live children, and the children it has reaped (0 when none is named).
    Taken before and after the measured phase: a backend alive at the first reading and gone
    at the second is counted once (its earlier part in the first, its whole in the reaped)."""
    pid = int(os.environ.get("BENCH_SERVER_PID") or 0)
    if not pid:
        return 0.0
    import psutil

    server = psutil.Process(pid)
    t = server.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in server.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:  # ended between the listing and the reading: in the reaped
            continue
        total += c.user + c.system
    return total


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def classify(e: BaseException) -> str:
    chain, cur = [], e
    while cur is not None and len(chain) < 4:
        chain.append(type(cur).__name__)
        cur = cur.__cause__ or cur.__context__
    return ("<-".join(chain) + ": " + str(e).replace("\n", " "))[:160]


async def amain(a) -> dict:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    opts = dict(kv.split("=", 1) for kv in a.opt)
    t_imp = time.perf_counter()
    drv = load_driver(a.driver)
    import_s = time.perf_counter() - t_imp
    out: dict[str, Any] = {"driver": drv.NAME, "driver_file": os.path.basename(a.driver),
                           "protocol": a.protocol, "stream": bool(a.stream), "n": a.n, "opts": opts,
                           "import_s": round(import_s, 3)}
    if a.protocol not in drv.PROTOCOLS:
        out["skipped"] = f"protocol {a.protocol} not supported by driver"
        return out
    ctx = DriverContext(base_url=f"http://127.0.0.1:{a.port}/v1", anthropic_base_url=f"http://127.0.0.1:{a.port}",
                        protocol=a.protocol, stream=bool(a.stream), api_key="sk-dummy-bench",
                        model=a.model, n=a.n, tool=sleep_tool_impl, opts=opts)
    t_set = time.perf_counter()
    setup_ret = await drv.setup(ctx)
    run_one, aclose = (setup_ret if isinstance(setup_ret, tuple) else (setup_ret, None))
    out["setup_s"] = round(time.perf_counter() - t_set, 3)

    # warm-up (not measured): first-call costs such as schema building, lazy imports, connection setup
    cold = []
    for i in range(a.warmup):
        t = time.perf_counter()
        try:
            txt = await asyncio.wait_for(run_one(-1 - i), a.timeout)
            cold.append(round(time.perf_counter() - t, 4))
            if not str(txt).startswith(FINAL_PREFIX):
                out["warmup_bad_answer"] = str(txt)[:120]
        except Exception as e:  # noqa: BLE001
            out["warmup_error"] = classify(e)
            traceback.print_exc()
    out["warmup_run_s"] = cold
    tool_calls_before = TOOL_STATS.calls
    TOOL_STATS.max_in_flight = 0

    st0 = mock_stats(a.port)
    server0 = server_cpu_s()
    u0, s0, _ = rusage()
    rss0 = rss_kb()
    lat: list[float] = []
    errors: Counter = Counter()
    bad = 0

    async def one(i):
        nonlocal bad
        t = time.perf_counter()
        try:
            txt = await run_one(i)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            errors[classify(e)] += 1
            return
        lat.append(time.perf_counter() - t)
        if not str(txt).startswith(FINAL_PREFIX):
            bad += 1
            errors[f"bad final answer: {str(txt)[:80]!r}"] += 1

    wall = 0.0
    for rep in range(a.repeat):  # repeat>1: R sequential batches of N concurrent runs (less noise for small N)
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(one(i)) for i in range(a.n)]
        done, pending = await asyncio.wait(tasks, timeout=a.timeout)
        wall += time.perf_counter() - t0
        for t in pending:
            t.cancel()
        if pending:
            errors[f"timeout after {a.timeout}s"] += len(pending)
            await asyncio.wait(pending, timeout=10)
            break
    u1, s1, maxrss = rusage()
    server1 = server_cpu_s()
    st1 = mock_stats(a.port)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # noqa: BLE001
            pass
    reqs = sum(st1.get(k, 0) - st0.get(k, 0) for k in ("chat", "responses", "messages"))
    cpu = (u1 - u0) + (s1 - s0)
    lat.sort()

    def pct(p):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 4) if lat else None

    out.update({
        "repeat": a.repeat, "completed_ok": len(lat) - bad, "failed": a.n * a.repeat - (len(lat) - bad),
        "wall_s": round(wall, 3), "wall_per_batch_s": round(wall / a.repeat, 4),
        "cpu_user_s": round(u1 - u0, 3), "cpu_sys_s": round(s1 - s0, 3), "cpu_s": round(cpu, 3),
        "cpu_util": round(cpu / wall, 3) if wall else None,
        "model_requests": reqs, "final_turns": st1.get("final", 0) - st0.get("final", 0),
        "cpu_ms_per_model_turn": round(1000 * cpu / reqs, 3) if reqs else None,
        "tool_calls": TOOL_STATS.calls - tool_calls_before, "max_tools_in_flight": TOOL_STATS.max_in_flight,
        "rss_before_run_mb": round(rss0 / 1024, 1), "peak_rss_mb": round(maxrss / 1024, 1),
        "run_latency_p50_s": pct(0.5), "run_latency_p99_s": pct(0.99), "run_latency_max_s": pct(1.0),
        "runs_per_s": round((len(lat) - bad) / wall, 1) if wall else None,
        "mock_cpu_s": round(st1["cpu_s"] - st0["cpu_s"], 3),
        "server_cpu_s": round(server1 - server0, 3),
        "server_ms_per_model_turn": round(1000 * (server1 - server0) / reqs, 3) if reqs else None,
        "errors": dict(errors.most_common(8)), "blocked_non_loopback": dict(BLOCKED),
        "process_total_s": round(time.perf_counter() - T_PROC0, 3),
    })
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("driver")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--protocol", default="chat", choices=["chat", "responses", "anthropic"])
    ap.add_argument("--stream", type=int, default=0)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--model", default="gpt-4o")
    ap.add_argument("--opt", action="append", default=[], help="driver option key=value")
    a = ap.parse_args()
    try:
        res = asyncio.run(amain(a))
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        res = {"driver_file": os.path.basename(a.driver), "fatal": classify(e), "n": a.n}
    res["blocked_non_loopback"] = dict(BLOCKED)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
