"""The mutation tool's targets stay true to the tree: every test it names for a module exists,
and every function it focuses on is in its module (a renamed test once made a whole module's
mutation run stop at its start, as if its tests failed)."""

from __future__ import annotations

import ast
from pathlib import Path

import mutate

ROOT = Path(__file__).parent.parent


def test_every_test_the_mutation_tool_names_exists() -> None:
    for module, tests in mutate.TARGETS.items():
        assert (ROOT / module).is_file(), module
        assert mutate.missing(tests) == [], module


def test_every_function_the_mutation_tool_focuses_on_is_in_its_module() -> None:
    for module, names in mutate.FOCUS.items():
        tree = ast.parse((ROOT / module).read_text())
        defined = {
            n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert set(names) <= defined, (module, set(names) - defined)
        assert mutate.sites((ROOT / module).read_text(), names), module
