"""The server commands: `serve` (the web page) and `mcp-serve` (tools for MCP clients)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import secrets
import sys
from pathlib import Path
from typing import Any

from .agent import Agent
from .approvals import Approver, approve_all, deny_all
from .cli import build_agent, select_tools
from .errors import ConfigError, MissingAPIKey
from .tools import BUILTINS, Tool


def command_serve(agent: Agent, args: argparse.Namespace) -> int:
    from aiohttp import web

    from .journal import Journal
    from .web import WebApp

    if not is_loopback(args.host) and not args.allow_remote:
        print(
            f"tether: error: --host {args.host} is not a loopback address; "
            "add --allow-remote to serve other machines",
            file=sys.stderr,
        )
        return 2
    token = args.token or secrets.token_urlsafe(24)
    default_tools = list(agent.toolbox.tools.values())
    available = {**BUILTINS, **{t.name: t for t in default_tools}}

    def options(form: dict[str, Any]) -> tuple[argparse.Namespace, list[Tool]]:
        """The server's options with the form's choices laid over them."""
        ns = argparse.Namespace(**vars(args))
        if form.get("model"):
            ns.model = str(form["model"])
        if form.get("max_steps") is not None:
            ns.max_steps = int(form["max_steps"])
        if form.get("max_cost") is not None:
            ns.max_cost = float(form["max_cost"])
        tools = default_tools
        if isinstance(form.get("tools"), list):
            unknown = [n for n in form["tools"] if n not in available]
            if unknown:
                raise ConfigError(f"tools: unknown {', '.join(map(str, unknown))}")
            tools = [available[n] for n in form["tools"]]
        return ns, tools

    def factory(form: dict[str, Any]) -> Agent:
        return build_agent(*options(form))

    def spec_for(form: dict[str, Any]) -> dict[str, Any]:
        from .durable import spec_of

        ns, tools = options(form)
        # every tool the server offers, narrowed to the form's choice
        ns.tools = ",".join(n for n in BUILTINS if n in available)
        return {**spec_of(ns), "only": [t.name for t in tools]}

    defaults = {
        "model": agent.model.name,
        "tools": [t.name for t in default_tools],
        "available_tools": list(available),
        "max_steps": args.max_steps,
    }
    journal = Journal(Path(args.data_dir) / "events")
    runs = None
    if args.store:
        from .web.stored import StoredRuns

        asyncio.run(agent.model.aclose())
        try:
            runs = StoredRuns(args.store, spec_for)
        except ConfigError as e:
            print(f"tether: error: {e}", file=sys.stderr)
            return 2
    app = WebApp(
        factory,
        token,
        supervisor=runs,
        journal=journal,
        defaults=defaults,
        workspace=Path(args.workspace).resolve(),
    ).app()
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"tether serve: open http://{shown_host}:{args.port}/?token={token}",
        file=sys.stderr,
        flush=True,
    )
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def command_mcp_serve(args: argparse.Namespace) -> int:
    from .mcp_server import agent_tool, serve_stdio

    try:
        tools = select_tools(args)
        workspace = Path(args.workspace).resolve()
        approver: Approver = approve_all if args.approve == "auto" else deny_all
        try:
            agent = build_agent(args)
            tools.append(agent_tool(agent, workspace, approver))
        except MissingAPIKey as e:
            print(f"tether mcp-serve: no run_agent tool: {e}", file=sys.stderr)
        asyncio.run(serve_stdio(tools, workspace, approver))
    except ConfigError as e:
        print(f"tether: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
