"""MkDocs hooks: the references that are generated from the code, so they cannot drift from it.

A page holds a marker where a reference goes, and this hook writes it at build time:

    <!-- generated: cli -->      every `tether` command and flag, from `cli.parser.build_parser`
    <!-- generated: events -->   every event type and field, from `tether.events.SCHEMA`
    <!-- generated: api -->      a mkdocstrings entry for every name in `tether.__all__`

A public name without a docstring of its own fails the build: the API reference would otherwise
show an empty entry, or a parent class's text as if it were the name's.
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from mkdocs.exceptions import PluginError

import tether
from tether.cli.parser import build_parser
from tether.events import COMMON, SCHEMA

MARKERS = {"cli", "events", "api"}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name in MARKERS:
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, GENERATORS[name]())
    return markdown


def cell(text: str) -> str:
    """Text that cannot break a Markdown table's row."""
    return " ".join(text.split()).replace("|", "\\|")


def flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    metavar = action.metavar or action.dest.upper()
    return f"`{names} {metavar}`"


def expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return cell(parser._get_formatter()._expand_help(action))


def cli_reference() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in sub._choices_actions}
    out = [
        "Generated from the command's own parser at build time: what `tether COMMAND --help`"
        " prints, as tables.",
        "",
        f"`tether --version` prints the version. {parser.epilog}",
        "",
    ]
    for name, command in sub.choices.items():
        out += [f"## `tether {name}`", "", cell(command.description or helps[name]), ""]
        usage = command.format_usage().removeprefix("usage: ").strip()
        out += ["```text", usage, "```", ""]
        for group in command._action_groups:
            actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
            if not actions:
                continue
            title = {"positional arguments": "Arguments", "options": "Options"}.get(
                group.title or "", (group.title or "").capitalize()
            )
            out += [f"**{title}**", "", "| | |", "| --- | --- |"]
            out += [f"| {flags(a)} | {expanded_help(command, a)} |" for a in actions]
            out.append("")
    return "\n".join(out)


def events_reference() -> str:
    out = [
        "Generated from `tether.events.SCHEMA` at build time. Every event also has:",
        "",
        "| field | |",
        "| --- | --- |",
    ]
    out += [f"| `{k}` | {cell(v)} |" for k, v in COMMON.items()]
    out.append("")
    for name, kind in SCHEMA.items():
        out += [f"## `{name}`", "", cell(kind.summary) + ".", ""]
        if kind.fields:
            out += ["| field | |", "| --- | --- |"]
            out += [f"| `{k}` | {cell(v)} |" for k, v in kind.fields.items()]
            out.append("")
    return "\n".join(out)


def own_docstring(obj: Any) -> str | None:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        if doc and doc.startswith(f"{obj.__name__}("):
            return None  # a dataclass's generated signature, not a docstring
        return doc
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return obj.__doc__
    return "data"  # a constant: documented by the text around it in its module


def api_reference() -> str:
    missing = [n for n in tether.__all__ if not (own_docstring(getattr(tether, n)) or "").strip()]
    if missing:
        raise PluginError(f"public names without a docstring: {', '.join(sorted(missing))}")
    out = []
    for group, names in API_GROUPS.items():
        out += [f"## {group}", ""]
        for n in names:
            out += [f"::: tether.{n}", ""]
    listed = {n for names in API_GROUPS.values() for n in names}
    if listed != set(tether.__all__):
        extra, left = sorted(listed - set(tether.__all__)), sorted(set(tether.__all__) - listed)
        raise PluginError(f"API groups out of date: not public {extra}, not listed {left}")
    return "\n".join(out)


API_GROUPS = {
    "Agents and runs": [
        "Agent", "Runtime", "RunHandle", "RunResult", "Budget", "RestartPolicy", "RunContext",
        "run_child",
        "approve_all", "deny_all", "Guardrail", "Event",
    ],
    "Accounts and rates": ["Limits", "Standing", "Rate", "RateStanding"],
    "Tools": ["tool", "Tool", "Toolbox", "BUILTINS"],
    "Models": [
        "Model", "OpenAIChatModel", "OpenAIResponsesModel", "AnthropicModel", "FallbackModel",
        "ScriptedModel", "reply", "make_model", "HTTPSettings", "Price",
    ],
    "Messages": [
        "Message", "TextPart", "ImagePart", "ReasoningPart", "ToolCall", "ToolResult",
        "ToolSpec", "ModelRequest", "ModelResponse", "Usage",
    ],
    "Errors": [
        "TetherError", "ConfigError", "MissingAPIKey", "RunError", "RunExists", "NoSuchRun",
        "RunEnded", "ApprovalError", "QuestionError", "AccountOverBudget", "RecordError",
        "ReplayDiverged", "OutputInvalid", "ChildRunEnded", "StoreUnavailable",
        "ProviderError", "ProviderConnectionError", "ProviderTimeout", "ProviderStatusError",
        "RateLimited", "ServerError", "ClientRequestError", "ProviderProtocolError",
        "ImagesUnsupported",
    ],
}  # fmt: skip

GENERATORS = {"cli": cli_reference, "events": events_reference, "api": api_reference}
