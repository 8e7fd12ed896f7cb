"""Loading a user's tools from a Python file or an importable module (`--tools-from`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from ..errors import ConfigError
from .tool import Tool


def load_module(source: str, option: str = "--tools-from") -> ModuleType:
    """A Python file or an importable module; errors name the `option` that gave it. A file is
    compiled from its source every time, its bytecode cache neither read nor written: a
    sandboxed command could plant a `__pycache__` entry that an import would run instead of
    the file (bash's sandbox keeps the file itself read-only, `Sandbox.protect`)."""
    path = Path(source)
    if source.endswith(".py") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"{option}: no file {source}")
        name = f"tether_user_tools_{abs(hash(str(path.resolve())))}"
        module = ModuleType(name)
        module.__file__ = str(path.resolve())
        sys.modules[name] = module
        try:
            code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
            exec(code, module.__dict__)
        except Exception as e:
            raise ConfigError(f"{option}: {source} failed to load: {type(e).__name__}: {e}") from e
        return module
    try:
        return importlib.import_module(source)
    except ImportError as e:
        raise ConfigError(f"{option}: cannot import {source}: {e}") from e


def load_tools(source: str) -> list[Tool]:
    """Every `@tool` defined in `source` (a .py file or a module name)."""
    module = load_module(source)
    tools = [v for v in vars(module).values() if isinstance(v, Tool)]
    if not tools:
        raise ConfigError(f"--tools-from: {source} defines no tools (mark functions with @tool)")
    return tools
