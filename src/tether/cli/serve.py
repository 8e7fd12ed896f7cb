"""The server commands: `serve` (the web page) and `mcp-serve` (tools for MCP clients)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import math
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..approvals import Approver, approve_all, deny_all
from ..errors import ConfigError, MissingAPIKey
from ..options import RunOptions, build_agent, select_tools, timed
from ..tools import BUILTINS
from .common import cli_runtime, error


def command_serve(args: argparse.Namespace, options: RunOptions) -> int:

    from ..journal import Journal
    from ..web import WebApp

    if not is_loopback(args.host) and not args.allow_remote:
        return error(
            f"--host {args.host} is not a loopback address; add --allow-remote to serve "
            "other machines"
        )
    token = args.token or secrets.token_urlsafe(24)
    model_name = options.model or ""
    try:
        default_tools = [t.name for t in select_tools(options)]
        agent = build_agent(options)  # a bad option is an error before the server starts
        asyncio.run(agent.model.aclose())
        model_name = agent.model.name
    except MissingAPIKey as e:  # to watch a store's runs, approve and cancel, none is needed
        if args.store == "memory":
            return error(str(e))
        print(f"tether serve: {e}; the page lists, approves and cancels the store's runs, and "
              "a run started there says what is missing", file=sys.stderr)  # fmt: skip
    except ConfigError as e:
        return error(str(e))
    loaded = [t.name for t in select_tools(dataclasses.replace(options, tools="none"))]
    available = [*BUILTINS, *(n for n in loaded if n not in BUILTINS)]

    options_for = form_options(options, available)

    defaults = {
        "model": model_name,
        "tools": default_tools,
        "available_tools": available,
        "max_steps": options.max_steps,
    }
    journal = Journal(Path(args.data_dir) / "events")
    if args.max_runs < 1:
        return error("--max-runs must be at least 1")
    runtime = cli_runtime(
        args.store,
        data=args.data_dir,
        take_over=False,
        max_runs=args.max_runs,
        store_connections=args.store_connections,
        store_patience=args.store_patience,
    )
    app = WebApp(
        runtime,
        token,
        options_for=options_for,
        journal=journal,
        defaults=defaults,
        workspace=Path(options.workspace),
        hosts=served_names(args.host, args.allow_host),
    ).app()
    try:
        asyncio.run(
            serve_until_stopped(
                app, args.host, args.port, token, args.header_timeout, args.max_connections
            )
        )
    except OSError as e:  # the port is taken, or the address is not this machine's
        return error(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}")
    return 0


def form_options(
    options: RunOptions, available: list[str]
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """How the page's form makes a run's options: the server's, with the form's choices
    (model, step and cost limits, tool choice, a subset of `available` tools) laid over."""

    def options_for(form: dict[str, Any]) -> dict[str, Any]:
        """The server's options with the form's choices laid over them."""
        o = dataclasses.replace(options)
        if form.get("model"):
            if not isinstance(form["model"], str):
                raise ConfigError("model: a string is required")
            o.model = form["model"]
        if form.get("max_steps") is not None:
            o.max_steps = whole(form["max_steps"], "max_steps", 1, 100_000)
        if form.get("max_cost") is not None:
            o.max_cost = dollars(form["max_cost"], "max_cost")
        if form.get("tool_choice") is not None:
            if not isinstance(form["tool_choice"], str):
                raise ConfigError("tool_choice: a string is required")
            o.tool_choice = form["tool_choice"] or None  # build_agent checks the name
        chosen = form.get("tools")
        if isinstance(chosen, list):
            unknown = [str(n) for n in chosen if n not in available]
            if unknown:
                raise ConfigError(f"tools: unknown {', '.join(unknown)}")
            # every tool the server offers, narrowed to the form's choice
            o.tools = ",".join(n for n in BUILTINS if n in available)
            o.only = [str(n) for n in chosen]
        return o.to_dict()  # the runtime builds it: a bad choice is the form's error (400)

    return options_for


async def serve_until_stopped(
    app: Any,
    host: str,
    port: int,
    token: str,
    header_timeout: float = 10.0,
    max_connections: int = 512,
) -> None:
    """Serve `app` until SIGINT or SIGTERM, then shut it down cleanly (running runs are left
    to the store). The address is printed once it is bound: with port 0, the one chosen. It
    is bound before the app starts: a port in use is an error before the store is opened
    (DBOS's threads, once launched, printed a traceback at that exit)."""
    import signal

    from aiohttp import web

    from ..web.connections import Connections

    sock = bound_socket(host, port)
    runner = web.AppRunner(app, access_log=None)
    server: asyncio.Server | None = None
    try:
        await runner.setup()
        connections = Connections(runner.server, header_timeout, max_connections)
        server = await connections.serve(sock)
        bound = sock.getsockname()[1]
        shown_host = f"[{host}]" if ":" in host else host
        url = f"http://{shown_host}:{bound}/?token={token}"
        print(f"tether serve: open {url}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        if server is not None:
            server.close()
        await runner.cleanup()


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port`; OSError when the port is taken or the address is
    not this machine's."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def whole(value: Any, name: str, low: int, high: int) -> int:
    """A whole number from the form, within bounds (a bad one is the form's error)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name}: a whole number from {low} to {high} is required")
    return value


def dollars(value: Any, name: str) -> float:
    """An amount of money from the form: finite and not negative (NaN would turn a budget
    off)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}: a finite amount in USD, 0 or more, is required")
    return float(value)


def served_names(host: str, allowed: list[str]) -> set[str] | None:
    """The names a request's Host may give: the bound address, loopback's names when it is
    loopback, and `--allow-host` ones. A wildcard bind with no names given takes any."""
    if host in ("0.0.0.0", "::", "") and not allowed:
        return None
    names = {host.strip("[]").lower(), *(a.lower() for a in allowed)}
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1", "::1"}
    return names


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def command_mcp_serve(args: argparse.Namespace, options: RunOptions) -> int:
    from ..mcp_server import Supervisor, agent_tool, serve_http, serve_stdio

    try:
        tools = timed(select_tools(options), options.tool_timeout)
        workspace = Path(options.workspace)
        approver: Approver = approve_all if options.approve == "auto" else deny_all
        runtime = cli_runtime(args.store, data=args.data_dir)  # a store keeps its runs
        try:
            probe = build_agent(options)  # without a key, no run_agent tool
            asyncio.run(probe.model.aclose())  # (the local model's server, too)
            tools.append(agent_tool(runtime, options.to_dict(), workspace, approver))
            waits = None if options.approve == "ask" else approver  # for decide_call
            runs = Supervisor(runtime, options.to_dict(), workspace, waits)
            tools += runs.tools()
        except MissingAPIKey as e:
            runs = None
            print(f"tether mcp-serve: no run_agent tool: {e}", file=sys.stderr)
        if not args.http:
            asyncio.run(serve_stdio(runtime, tools, workspace, approver, runs))
            return 0
        token = None if args.no_token else args.token or secrets.token_urlsafe(24)
        try:
            sock = socket.create_server(("127.0.0.1", args.port))
        except OSError as e:
            return error(f"cannot serve on 127.0.0.1:{args.port}: {e.strerror or e}")
        port = sock.getsockname()[1]
        said = f"; clients send Authorization: Bearer {token}" if token else " (no token)"
        print(f"tether mcp-serve: http://127.0.0.1:{port}/mcp{said}", file=sys.stderr, flush=True)
        with sock:
            asyncio.run(serve_http(runtime, tools, workspace, approver, sock, token, runs))
    except ConfigError as e:
        return error(str(e))
    except KeyboardInterrupt:
        return 130
    return 0
