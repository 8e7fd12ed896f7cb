"""Tools: `@tool`, the toolbox that runs calls, the built-ins, and loading a user's tools."""

from __future__ import annotations

from .bash import bash
from .files import edit_file, list_files, read_file, write_file
from .tool import RunContext, Tool, tool
from .toolbox import Toolbox
from .weather import get_weather

BUILTINS: dict[str, Tool] = {
    t.name: t for t in (bash, read_file, write_file, edit_file, list_files, get_weather)
}

__all__ = ["BUILTINS", "RunContext", "Tool", "Toolbox", "tool"]
