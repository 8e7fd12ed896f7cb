"""Which MCP tools a run is offered, under which names, and which of their calls wait for a
person: the rules a user gives with `--mcp-approve`, `--mcp-prefix`, `--mcp-tools` and
`--mcp-skip` (`MCPApproval`, `MCPNames`), read from each tool's listing as its server gave it.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from ..approvals import Policy
from ..errors import ConfigError
from .tool import Tool

APPROVALS = ("hints", "always", "never")


@dataclass(frozen=True)
class MCPApproval:
    """Which MCP tools' calls wait for a person's approval, under the run's approval policy as
    bash's do (`--approve ask|auto|deny`). `default`: `hints` (the default) asks for every tool
    its server does not mark read-only (`readOnlyHint`; MCP's `destructiveHint` defaults to
    true), `always` for all, `never` for none. `tools`: a rule per tool, by its name
    (`write_file`) or by its server and name (`SERVER#write_file`, the server as `--mcp` gave
    it), which wins. Tools were built with approval "never": server-filesystem's `write_file`
    and `move_file`, marked destructive, ran under `--approve deny`."""

    default: str = "hints"
    tools: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, rules: list[str]) -> MCPApproval:
        """From `--mcp-approve` values: `hints`, `always`, `never`, or `[SERVER#]TOOL=RULE`;
        a bad one is a ConfigError that names it."""
        default, tools = "hints", {}
        for rule in rules:
            name, eq, value = rule.rpartition("=")
            value = value.strip()
            if value not in APPROVALS or (eq and not name.strip()):
                raise ConfigError(
                    f"--mcp-approve {rule!r}: give hints, always or never, or "
                    "TOOL=RULE (SERVER#TOOL=RULE for one server's)"
                )
            if eq:
                tools[name.strip()] = value
            else:
                default = value
        return cls(default, tools)

    def policy(self, server: tuple[str, ...], listed: Any) -> Policy:
        """The approval policy of the server's tool `listed` (the server known by any of the
        names in `server`: its `--mcp` text, the name it gives itself)."""
        found = [self.tools.get(f"{name}#{listed.name}") for name in server]
        rule = next(filter(None, found), None) or self.tools.get(listed.name) or self.default
        if rule == "hints":
            hints = getattr(listed, "annotations", None)
            return "never" if hints is not None and hints.read_only_hint is True else "always"
        return "always" if rule == "always" else "never"


PREFIX = re.compile(r"[A-Za-z0-9_-]{1,32}")


@dataclass(frozen=True)
class MCPNames:
    """Which tools of the MCP servers a run is offered, and under which names. A server is
    named as `--mcp` gives it or by the name it gives itself (server-filesystem's is
    `secure-filesystem-server`). `prefixes`: a server's tools are offered as `PREFIX_TOOL`;
    `only`: when given, only the tools that match one of these `[SERVER#]TOOL` patterns are
    offered (TOOL may be a shell pattern: `read_*`); `skip`: tools left out, the same way. A
    tool that needs MCP tasks (`taskSupport: required`) is never offered: Tether calls tools
    without them. Two tools of one name (of two servers, or of a server and the run's own)
    were an error that only dropping a server mended."""

    prefixes: dict[str, str] = field(default_factory=dict)
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()

    @classmethod
    def parse(cls, prefixes: list[str], only: list[str], skip: list[str]) -> MCPNames:
        """From `--mcp-prefix SERVER=PREFIX`, `--mcp-tools` and `--mcp-skip` values; a bad
        one is a ConfigError that names it."""
        found = {}
        for given in prefixes:
            server, eq, prefix = given.rpartition("=")
            if not eq or not server.strip() or not PREFIX.fullmatch(prefix.strip()):
                raise ConfigError(
                    f"--mcp-prefix {given!r}: give SERVER=PREFIX, the server as --mcp gives it "
                    "or by its own name, the prefix of letters, digits, _ and - (at most 32)"
                )
            found[server.strip()] = prefix.strip()
        for flag, patterns in (("--mcp-tools", only), ("--mcp-skip", skip)):
            for pattern in patterns:
                if not pattern.rpartition("#")[2].strip():
                    raise ConfigError(f"{flag} {pattern!r}: give TOOL or SERVER#TOOL")
        return cls(found, tuple(only), tuple(skip))

    def offered(self, server: tuple[str, ...], listed: Any) -> str | None:
        """The name the server's tool `listed` is offered under, or None: not offered."""
        execution = getattr(listed, "execution", None)
        if execution is not None and execution.task_support == "required":
            return None
        if self.only and not self.matches(self.only, server, listed.name):
            return None
        if self.matches(self.skip, server, listed.name):
            return None
        prefix = next((self.prefixes[n] for n in server if n in self.prefixes), "")
        return f"{prefix}_{listed.name}" if prefix else str(listed.name)

    @staticmethod
    def matches(patterns: tuple[str, ...], server: tuple[str, ...], tool: str) -> bool:
        for pattern in patterns:
            named, hash_, tools = pattern.rpartition("#")
            if (not hash_ or named in server) and fnmatch.fnmatchcase(tool, tools):
                return True
        return False


def check_names(tools: list[Tool]) -> None:
    """Two servers' tools of one name are a ConfigError that says how to tell them apart."""
    seen: dict[str, Tool] = {}
    for t in tools:
        other = seen.setdefault(t.name, t)
        if other is not t:
            raise ConfigError(
                f"--mcp: the servers {other.source!r} and {t.source!r} both have a tool named "
                f"{t.name!r}: offer one's tools under a prefix (--mcp-prefix "
                f"'{t.source}=PREFIX') or leave one out (--mcp-skip '{t.source}#{t.name}')"
            )


def said_idempotent(listed: Any) -> bool:
    """Whether the server says a tool may be called again with no further effect (MCP's
    `idempotentHint`, or `readOnlyHint`): a durable run makes such a call again when a crash
    interrupted it, where another is reported as of unknown outcome."""
    hints = getattr(listed, "annotations", None)
    return bool(hints and (hints.idempotent_hint or hints.read_only_hint))
