"""The options of the commands that run agents (`run`, `ask`, `serve`, `mcp-serve`), in the
groups `--help` shows: the model, the tools (MCP servers and approvals among them), budgets and
the run. Every `options.RunOptions` field with a `Flag` is the flag of its name, made here
from the field (its type, default and help are declared once, there); the run group adds
what only the command line has (`--json`, `--store`, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from ..durable.outage import STORE_PATIENCE_S
from ..journal import STORE_FORMS
from ..options import Flag, RunOptions
from .common import STORE_HELP, data_dir

GROUPS = {
    "model": "model",
    "tools": "tools",
    "budgets": "budgets (checked before every model call)",
    "run": "run",
}
"""Each `Flag.group`'s title in `--help`, in the order shown."""


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a command that runs agents, in groups (their order is --help's)."""
    groups = {name: p.add_argument_group(title) for name, title in GROUPS.items()}
    for f in dataclasses.fields(RunOptions):
        flag = f.metadata.get("flag")
        if isinstance(flag, Flag):
            groups[flag.group].add_argument("--" + f.name.replace("_", "-"), **argparse_of(f, flag))
            if f.name == "approve":
                yolo(groups[flag.group])
    run_options(groups["run"])


def argparse_of(f: dataclasses.Field[Any], flag: Flag) -> dict[str, Any]:
    """What argparse takes for a field: a list repeats (`append`), a bool is a switch (and
    `bool | None` one with a `--no-` form, None when neither is given), a number is parsed
    as the field's type; the default is the field's (or its flag's environment variable)."""
    kind = str(f.type).replace(" ", "")
    out: dict[str, Any] = {"help": flag.help}
    if flag.metavar is not None:
        out["metavar"] = flag.metavar
    if flag.choices is not None:
        out["choices"] = flag.choices
    if kind == "list[str]":
        return {**out, "action": "append", "default": []}
    if kind == "bool":
        return {**out, "action": "store_true"}
    if kind == "bool|None":
        return {**out, "action": argparse.BooleanOptionalAction, "default": None}
    default = f.default
    if flag.env is not None:
        default = os.environ.get(flag.env, default)
    numbers = {"int": int, "float": float}
    parse = numbers.get(kind.removesuffix("|None"))
    return {**out, "default": default, **({"type": parse} if parse else {})}


Group = argparse._ArgumentGroup


def yolo(t: Group) -> None:
    """`--yolo`: the short way to say `--approve auto`."""
    t.add_argument(
        "--yolo",
        dest="approve",
        action="store_const",
        const="auto",
        help="run every tool call without asking (the same as --approve auto)",
    )


def run_options(o: Group) -> None:
    """What only the command line has: how the run is shown, recorded and named."""
    o.add_argument("--json", action="store_true", help="print events as JSON lines")
    o.add_argument(
        "--otel",
        action="store_true",
        help="emit OpenTelemetry spans (needs the otel extra; exporter from the "
        "OTEL_* environment, else printed to stderr)",
    )
    o.add_argument("--run-id", metavar="ID", help="id of the run (default: generated)")
    o.add_argument(
        "--store",
        metavar="URL",
        help=f"where durable runs are recorded: {STORE_FORMS}; or memory for a run that is "
        f"not recorded (default: $TETHER_STORE, else {STORE_HELP})",
    )
    patience_option(o)
    o.add_argument(
        "--queue",
        action="store_true",
        help="with --store: queue the run for tether worker instead of running it here",
    )
    o.add_argument(
        "--data-dir",
        default=str(data_dir()),
        help="where run journals and the default store are kept, for tether show and runs "
        f"(default: {data_dir()})",
    )
    o.add_argument(
        "--log",
        metavar="FILE",
        help="append a structured log (JSON lines, secrets redacted) to FILE",
    )


def patience_option(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--store-patience",
        type=float,
        default=STORE_PATIENCE_S,
        metavar="SECONDS",
        help="how long runs wait for a store that stops answering; then they end failed here "
        f"and stay in the store, to resume (default: {STORE_PATIENCE_S:g})",
    )
