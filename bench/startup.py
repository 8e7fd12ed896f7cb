"""How soon `tether run` asks the model: from starting the process to its first request
reaching the server, in memory and on the default SQLite store, taking turns.

    .venv/bin/python bench/startup.py [--runs 9]

The server is a Chat Completions endpoint in this process that answers at once. Each kind runs
once first, unmeasured (Python writes its bytecode caches, the store is created), and the
medians of the rest are printed with the whole run's time. PYTHONDONTWRITEBYTECODE is unset for
the runs, as on a user's machine (with it, every start compiles Tether's modules again).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPLY = {
    "id": "c",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


class Server(http.server.ThreadingHTTPServer):
    first: float | None = None


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def do_POST(self) -> None:
        if self.server.first is None:
            self.server.first = time.perf_counter()
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps(REPLY).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def once(server: Server, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the first request, seconds to the process's end)."""
    server.first = None
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    end = time.perf_counter()
    if done.returncode != 0 or server.first is None:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return server.first - t0, end - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=9)
    a = ap.parse_args()
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    tether = str(Path(sys.executable).parent / "tether")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OPENAI_API_KEY"] = "sk-bench"
    data = tempfile.mkdtemp()
    base = [tether, "run", "Say hello.", "--base-url", url, "--tools", "none", "--no-stream"]
    base += ["--data-dir", data]
    kinds = {"memory": [*base, "--store", "memory"], "durable (SQLite)": base}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for argv in kinds.values():
        once(server, argv, env)  # caches and the store, unmeasured
    for _ in range(a.runs):
        for kind, argv in kinds.items():
            times[kind].append(once(server, argv, env))
    server.shutdown()
    print(f"tether run, {a.runs} runs each, taking turns, medians")
    for kind, ts in times.items():
        first = statistics.median(t for t, _ in ts)
        whole = statistics.median(t for _, t in ts)
        print(f"  {kind:18} first request {first:5.3f} s   whole run {whole:5.3f} s")


if __name__ == "__main__":
    main()
