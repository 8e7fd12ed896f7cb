"""Layers point one way: a module imports only modules of its own layer or the layers above it in
this list (imports inside functions included), and every module has a layer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent / "src" / "tether"

LAYERS: list[tuple[str, set[str]]] = [
    (
        "values",
        {
            "frozen",
            "messages",
            "compact",
            "events",
            "event_types",
            "errors",
            "pricing",
            "tally",
            "redact",
            "keys",
            "approvals",
            "questions",
            "admission",
            "deadlines",
            "journal",
            "transcript",
            "terminal",
            "tracing",
            "version",
            "tree",
            "fork",
            "run_filter",
            "dashboard",
            "background",
            "summaries",
            "accounts",
            "rates",
        },
    ),
    ("providers and tools", {"providers", "tools"}),
    (
        "loop and agent",
        {"loop", "context", "output", "result", "calls", "guardrails", "paying", "children"}
        | {"agent"},
    ),
    ("run options", {"options"}),
    ("runs in memory", {"run", "supervisor", "bus", "memory_view"}),
    ("durable runs", {"durable"}),
    ("the Runtime", {"backends", "agents", "runtime", "overview"}),
    ("the package's public names", {"tether"}),
    ("interfaces", {"cli", "web", "mcp_server", "harbor", "__main__"}),
]
RANK = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def top(module: str) -> str:
    """`tether.cli.run` -> `cli`; the package root is `tether` (it imports the Runtime)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(path: Path) -> set[str]:
    """The tether modules a file imports, anywhere in it. `from . import x` names the package
    root (`tether/__init__.py`, which imports the Runtime): a module below the Runtime must
    import `from .x import ...` instead."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    package = list(rel.parts if path.name == "__init__.py" else rel.parts[:-1])
    if package[-1] == "__init__":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            names = [a.name for a in node.names]
            if target == "tether":  # `from . import x` runs the root's imports first
                found.add("tether")
                found.update(f"tether.{n}" for n in names if n in RANK)
            elif target.startswith("tether."):
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tether."))
    return found


def modules() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if p != ROOT / "__init__.py"]


def test_every_module_has_a_layer() -> None:
    missing = sorted(
        {top("tether." + p.relative_to(ROOT).parts[0].removesuffix(".py")) for p in modules()}
        - set(RANK)
    )
    assert missing == [], f"put these in a layer of LAYERS: {missing}"


def test_no_import_points_up() -> None:
    upward = []
    for path in modules():
        here = top("tether." + path.relative_to(ROOT).parts[0].removesuffix(".py"))
        for target in imports(path):
            there = top(target)
            if RANK[there] > RANK[here]:
                upward.append(
                    f"{path.relative_to(ROOT)} ({LAYERS[RANK[here]][0]}) imports {target} "
                    f"({LAYERS[RANK[there]][0]})"
                )
    assert upward == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The parser above finds relative imports inside functions (so the check can fail)."""
    fake = ROOT / "agent.py"
    source = fake.read_text() + "\n\ndef _probe() -> None:\n    from .cli import main\n"
    probe = tmp_path / "tether" / "agent.py"
    probe.parent.mkdir()
    probe.write_text(source)
    rel = ROOT.parent
    try:
        globals()["ROOT"] = tmp_path / "tether"
        assert "tether.cli" in imports(probe)
    finally:
        globals()["ROOT"] = rel / "tether"
