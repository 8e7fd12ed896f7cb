"""Every example in the README and the docs runs, and the site builds.

Each page's code blocks run in order, in a directory of their own that holds a copy of
`examples/`, with no API key in the environment and the `tether` of this checkout first on the
PATH. The fence says what a block is:

    ```python                      run with this Python; it fails the test if it fails
    ```bash                        run with bash -e (every command must succeed)
    ```python title="notes.py"     a file the page's later blocks use: saved under that name
                                   (any language: a JSON script, a task list ...)
    ```text, json, toml, yaml ...  output or data, never run

A block that cannot run here (a real key, a real remote server, a server that runs until
stopped) has `<!-- not run: WHY -->` on the line before it. It is still checked for syntax, and
each one is reported as a skip with its reason, so the count of examples not run is in every
test run's summary. A fence without a language fails: every block must say what it is.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = {"python", "bash"}
DATA = {"text", "json", "toml", "yaml", "ini", "http", "csv"}
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```\s*$", re.M | re.S
)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>.+?)\s*-->\s*$")
NEEDS_LOCAL = re.compile(r"<!--\s*needs the offline model\s*-->\s*$")
"""A block that runs the bundled offline model (`scripts/setup --local`): skipped, saying so,
where it is not installed, unless `TETHER_REQUIRE_LOCAL` (CI) says it must run."""
TITLE = re.compile(r'title="(?P<name>[^"]+)"')
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    file: str | None
    not_run: str | None
    needs_local: bool = False

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        info = m["info"].strip()
        lang = info.split()[0] if info else ""
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        title = TITLE.search(info)
        body = "\n".join(s[len(m["indent"]) :] for s in m["body"].split("\n"))
        name = title["name"] if title else None
        needs = bool(NEEDS_LOCAL.search(before))
        found.append(Block(page, line, lang, body, name, marker and marker["why"], needs))
    return found


ALL = [b for p in PAGES for b in blocks(p)]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env["HOME"] = str(home)
    env["XDG_DATA_HOME"] = str(home / ".local" / "share")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("TETHER_STORE", None)
    env.pop("PYTHONPATH", None)
    return env


def test_every_block_says_what_it_is() -> None:
    unknown = [f"{b.where} ({b.lang or 'no language'})" for b in ALL if b.lang not in RUN | DATA]
    assert not unknown, "code blocks with a language that is neither run nor data: " + ", ".join(
        unknown
    )
    assert len([b for b in ALL if b.lang in RUN]) >= 40  # the docs are full of examples


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_examples_run(page: Path, tmp_path: Path) -> None:
    """Each page's blocks, in order, in one directory: a later block sees what earlier ones
    wrote (a tools file, a store, a run to resume)."""
    runnable = [b for b in blocks(page) if (b.lang in RUN or b.file) and not b.not_run]
    if not runnable:
        pytest.skip("no runnable examples on this page")
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    home = tmp_path / "home"
    home.mkdir()
    env = environment(home)
    saved: dict[str, Block] = {}
    skipped = []
    for n, b in enumerate(runnable):
        if b.needs_local and not local_model():
            skipped.append(b.where)
            continue
        if b.file is not None:
            (work / b.file).parent.mkdir(parents=True, exist_ok=True)
            (work / b.file).write_text(b.body)
            saved[b.file] = b
            continue
        for name in saved:
            if name in b.body:
                saved[name].not_run = "used"
        script = work / f".block{n}.{'py' if b.lang == 'python' else 'sh'}"
        script.write_text(b.body)
        argv = [sys.executable, script.name] if b.lang == "python" else ["bash", "-e", script.name]
        done = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=240, check=False
        )
        assert done.returncode == 0, (
            f"the example at {b.where} failed (exit {done.returncode}):\n{b.body}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )
    unused = [f"{b.file} ({b.where})" for b in saved.values() if b.not_run != "used"]
    assert not unused, f"files no later example of the page uses: {', '.join(unused)}"
    if skipped:  # the rest ran and passed
        pytest.skip(
            f"{', '.join(skipped)} needs the offline model (scripts/setup --local); "
            "the page's other examples passed"
        )


def local_model() -> bool:
    """Whether the offline model's examples run here: installed, or required (CI)."""
    from tether.providers import local

    return bool(os.environ.get("TETHER_REQUIRE_LOCAL")) or local.available()


MARKED = [b for b in ALL if b.lang in RUN and b.not_run]


@pytest.mark.parametrize("block", MARKED, ids=[b.where for b in MARKED])
def test_examples_not_run(block: Block) -> None:
    """A block marked not run is still valid code; the skip names why it cannot run here."""
    if block.lang == "python":
        ast.parse(block.body, block.where)
    else:
        checked = subprocess.run(["bash", "-n"], input=block.body, text=True, capture_output=True)
        assert checked.returncode == 0, f"{block.where}: {checked.stderr}"
    pytest.skip(f"not run: {block.not_run}")


PAGES_OF_THE_SITE = [
    "getting-started", "concepts/agent", "concepts/runtime", "concepts/budgets",
    "concepts/approvals", "concepts/supervision", "concepts/durability", "concepts/trees",
    "guides/tools", "guides/models", "guides/mcp", "guides/web", "guides/postgres",
    "guides/harbor", "guides/sandbox", "guides/guardrails", "guides/testing",
    "guides/observability", "operations/workers", "operations/data", "operations/upgrading",
    "operations/security", "reference/api", "reference/cli", "reference/events", "benchmarks",
    "changelog", "contributing",
]  # fmt: skip


def test_the_site_builds_strict_with_every_command_name_and_event(tmp_path: Path) -> None:
    """`scripts/docs` (strict: a broken link or reference, or a public name without a
    docstring, fails it) builds every page, and the generated references hold every `tether`
    subcommand and flag, every name of `tether.__all__` and every event type."""
    import argparse

    import tether
    from tether.cli.parser import build_parser
    from tether.events import SCHEMA

    site = tmp_path / "site"
    done = subprocess.run(
        [str(ROOT / "scripts" / "docs"), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for page in PAGES_OF_THE_SITE:
        assert (site / page / "index.html").exists(), page
    cli = (site / "reference/cli/index.html").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert f"tether {name}" in cli, name
        for action in command._actions:
            for flag in action.option_strings:
                assert flag in cli, f"tether {name} {flag}"
    api = (site / "reference/api/index.html").read_text()
    missing = [n for n in tether.__all__ if f'id="tether.{n}"' not in api]
    assert not missing, f"public names not in the API reference: {missing}"
    events = (site / "reference/events/index.html").read_text()
    assert all(f"<code>{t}</code>" in events for t in SCHEMA)


SENT_BY_NAME = re.compile(r'(?:emit|send)\(\s*"([a-z_]+)"')


def test_every_event_is_emitted_by_its_typed_method_and_documented() -> None:
    """The event reference is generated from `events.SCHEMA`, itself read from
    `event_types`; each type is emitted by the `Emitter` method of its name, which takes that
    type's fields (so mypy checks every site), and nothing in the code emits by a string name."""
    import inspect

    from tether.event_types import TYPES
    from tether.events import SCHEMA, Emitter

    assert list(SCHEMA) == list(TYPES) and len(SCHEMA) >= 20
    for name, fields in TYPES.items():
        method = getattr(Emitter, name, None)
        assert method is not None, f"no Emitter.{name} for the {name} event"
        data = inspect.signature(method).parameters["data"]
        assert data.annotation == f"Unpack[{fields.__name__}]", (name, data.annotation)
        assert SENT_BY_NAME.findall(inspect.getsource(method)) == [name]
    by_name = {
        f"{path.relative_to(ROOT)}: {m}"
        for path in (ROOT / "src" / "tether").rglob("*.py")
        if path.name != "events.py"  # the methods themselves, checked above
        for m in SENT_BY_NAME.findall(path.read_text())
    }
    assert not by_name, f"events emitted by a string name: {sorted(by_name)}"
