"""Mutation testing: break the modules that carry Tether's guarantees one small change at a
time, run their fast tests against each break, and count how many breaks the tests catch.

    scripts/mutate [MODULE ...] [--list] [--max N] [--only FUNCTION,...]

(`scripts/mutate` runs this file in a copy of the tree, which it removes at the end.)

A mutant flips one comparison (`<` and `<=`, `==` and `!=`, `in` and `not in`, `is` and
`is not`), swaps `and` and `or`, drops a `not`, swaps `True` and `False`, adds one to a whole
number, or turns `+` into `-`. It is killed when its module's tests fail (or hang past the
timeout), and survives when they pass: a survivor is either a test to write or an equivalent
change (one that no caller could tell apart), to be named as such. The source file is put back
after every mutant, and at the end whatever happens.

Each mutant runs first the tests that ran its line, the quickest first (both measured once a
module, by one run of its tests under coverage with this file as a plugin, which names each
test's lines and times it), and only when those pass the rest of the module's list: a mutant
those tests catch costs a few tests, not all of them (a full run took 82 minutes loaded
before, 10 s a mutant). A line run only in a subprocess (a durable run's) has no tests of its
own and runs the whole list.

Not part of CI: a module takes minutes. Run directly
(`.venv/bin/python tests/mutate.py`), it changes the checkout's own files: run no other tests
or durable runs from it meanwhile, they would import the mutants.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PYTHON = sys.executable

# the modules that carry the guarantees, and the fast tests that guard each
TARGETS: dict[str, list[str]] = {
    "src/tether/loop.py": [
        "tests/test_loop.py",
        "tests/test_agent.py",
        "tests/test_context.py",
        "tests/test_output.py",
    ],
    "src/tether/agent.py": [  # the one driver
        "tests/test_agent.py",
        "tests/test_context.py",
        "tests/test_tools.py",
        "tests/test_output.py",
        "tests/test_runtime.py",
        "tests/test_guardrails.py",
        "tests/test_terminal.py",
        "tests/test_images.py",
        "tests/test_one_driver.py",
        "tests/test_tree.py",
    ],
    "src/tether/approvals.py": ["tests/test_runtime.py", "tests/test_agent.py"],
    "src/tether/redact.py": ["tests/test_builtin_tools.py", "tests/test_tools.py"],
    "src/tether/admission.py": ["tests/test_admission.py", "tests/test_runtime.py"],
    "src/tether/providers/http.py": [
        "tests/test_http.py",
        "tests/test_providers.py",
        "tests/test_hostile_servers.py",
    ],
    "src/tether/web/server.py": [  # its access checks (see FOCUS), by the tests without a browser
        "tests/test_web.py::test_the_api_needs_the_token_as_a_header_and_never_takes_a_cookie",
        "tests/test_web.py::test_the_pages_are_shells_and_the_link_sets_no_cookie",
        "tests/test_web.py::test_a_host_header_names_a_host_without_its_port",
        "tests/test_web.py::test_requests_come_from_where_they_should",
        "tests/test_web.py::test_binding_beyond_loopback_needs_a_flag",
        "tests/test_durable.py::test_a_step_rewritten_with_a_pickle_is_refused_and_never_run",
    ],
    "src/tether/web/http.py": [  # its security headers and comparisons (see FOCUS)
        "tests/test_web.py::test_the_api_needs_the_token_as_a_header_and_never_takes_a_cookie",
        "tests/test_web.py::test_the_pages_are_shells_and_the_link_sets_no_cookie",
        "tests/test_web.py::test_a_host_header_names_a_host_without_its_port",
        "tests/test_web.py::test_requests_come_from_where_they_should",
        "tests/test_web.py::test_binding_beyond_loopback_needs_a_flag",
    ],
    "src/tether/paying.py": [  # a model call paid for, by both drivers
        "tests/test_accounts.py",
        "tests/test_agent.py",
        "tests/test_tree.py",
    ],
    "src/tether/children.py": ["tests/test_tree.py", "tests/test_agent.py"],
    "src/tether/durable/ledger.py": [
        "tests/test_ledger.py",
        "tests/test_durable_python.py",
        "tests/test_one_driver.py",
        "tests/test_store_outage.py",
    ],
    "src/tether/output.py": ["tests/test_output.py"],
    "src/tether/providers/fallback.py": ["tests/test_fallback.py"],
    "src/tether/durable/outage.py": ["tests/test_store_outage.py"],
    "src/tether/tree.py": ["tests/test_tree.py"],
}

FLIPS: dict[type[ast.AST], type[ast.AST]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.And: ast.Or,
    ast.Or: ast.And,
    ast.Add: ast.Sub,
}


FOCUS: dict[str, tuple[str, ...]] = {
    "src/tether/web/server.py": ("guard", "auth", "denied"),
    "src/tether/web/http.py": ("same", "host_name", "secure_headers", "html_page"),
}
"""The functions mutated by default in a module that is more than its guarantees: the page
server's are its access checks (token, cookie, CSRF header, Host, security headers); the rest
renders pages, which the browser tests guard at a minute a run. `--only` chooses others."""


@dataclass
class Site:
    """One place a mutant changes: the n-th mutable node of the module, the function it is in,
    and what it becomes."""

    index: int
    line: int
    what: str
    function: str = ""
    lines: range = dataclasses.field(default_factory=lambda: range(0))
    """The lines whose tests may catch it: its statement's first line to its own last."""


def mutable(tree: ast.AST) -> Iterator[tuple[ast.expr, str]]:
    """The nodes a mutant may change, in a fixed order, with a word on the change."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in FLIPS:
            yield node, f"{type(node.ops[0]).__name__} -> {FLIPS[type(node.ops[0])].__name__}"
        elif isinstance(node, ast.BoolOp):
            yield node, f"{type(node.op).__name__} -> {FLIPS[type(node.op)].__name__}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if not any(
                isinstance(s, ast.Constant) and isinstance(s.value, str)
                for s in (node.left, node.right)
            ):
                yield node, "Add -> Sub"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "not x -> x"
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            yield node, f"{node.value} -> {not node.value}"
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, f"{node.value} -> {node.value + 1}"


def annotation_nodes(tree: ast.AST) -> set[int]:
    """The nodes of annotations and a dataclass's `slots=` flag: never mutated (they change no
    behaviour; slots change only the memory an instance takes)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "slots":
            skip.add(id(node.value))
        for field in ("returns", "annotation"):
            sub = getattr(node, field, None)
            if sub is not None:
                skip |= {id(n) for n in ast.walk(sub)}
    return skip


def owners(tree: ast.AST) -> dict[int, str]:
    """The name of the innermost function each node is in (outer functions come first in a
    walk, so inner ones write over them)."""
    owner: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            owner.update((id(n), node.name) for n in ast.walk(node))
    return owner


def statements(tree: ast.AST) -> dict[int, int]:
    """The first line of the innermost statement each node is in (a line event of a statement
    spanning lines may name its first line only)."""
    first: dict[int, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            first.update((id(n), node.lineno) for n in ast.walk(node))
    return first


def sites(source: str, only: tuple[str, ...] = ()) -> list[Site]:
    """The module's mutants; with `only`, those inside the functions so named."""
    tree = ast.parse(source)
    skip = annotation_nodes(tree)
    owner = owners(tree)
    statement = statements(tree)
    found = [(n, w) for n, w in mutable(tree) if id(n) not in skip]
    every = [
        Site(
            i,
            getattr(n, "lineno", 0),
            w,
            owner.get(id(n), ""),
            range(
                min(statement.get(id(n), n.lineno), n.lineno),
                (n.end_lineno or n.lineno) + 1,
            ),
        )
        for i, (n, w) in enumerate(found)
    ]
    return [s for s in every if not only or s.function in only]


def mutant(source: str, index: int) -> str:
    """The module with its `index`-th mutable node changed."""
    tree = ast.parse(source)
    skip = annotation_nodes(tree)
    node = [n for n, _ in mutable(tree) if id(n) not in skip][index]
    if isinstance(node, ast.Compare):
        node.ops[0] = FLIPS[type(node.ops[0])]()
    elif isinstance(node, ast.BoolOp):
        node.op = FLIPS[type(node.op)]()
    elif isinstance(node, ast.BinOp):
        node.op = ast.Sub()
    elif isinstance(node, ast.UnaryOp):
        return replace_node(tree, node, node.operand)
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        node.value = not node.value
    elif isinstance(node, ast.Constant):
        node.value = node.value + 1
    return ast.unparse(tree)


def replace_node(tree: ast.AST, old: ast.AST, new: ast.AST) -> str:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
            elif isinstance(value, list):
                parent_list = value
                for i, item in enumerate(parent_list):
                    if item is old:
                        parent_list[i] = new
    return ast.unparse(tree)


PYTEST = ["-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider"]


def killed(
    tests: list[str],
    timeout: float,
    coverage: list[str] | None = None,
    times: Path | None = None,
) -> bool:
    """Whether the tests fail (or hang) against the module as it is on disk now. With
    `coverage` (its options), they run under it with this file as a plugin, each test's lines
    recorded under the test's id, and how long each took written to `times`."""
    if coverage is None:
        command = [PYTHON, *PYTEST, *tests]
    else:
        command = [PYTHON, "-m", "coverage", "run", *coverage, *PYTEST, "-p", "mutate", *tests]
    # a session of its own: a hung mutant's test run is ended with every process it started (a
    # `tether` a test started would otherwise outlive it, still running the mutant)
    tests_run = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,  # a test that reads stdin must not take the caller's
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])
            ),
            **({"MUTATE_TIMES": str(times)} if times is not None else {}),
        },
    )
    try:
        return tests_run.wait(timeout) != 0
    except subprocess.TimeoutExpired:
        return True
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tests_run.pid, signal.SIGKILL)
        tests_run.wait()


def missing(tests: list[str]) -> list[str]:
    """The named tests that are not there (a file gone, a test renamed): without this check a
    renamed test made its module's run stop, saying its tests fail with no mutant."""
    gone = []
    for test in tests:
        file, _, name = test.partition("::")
        path = ROOT / file
        if not path.is_file() or (name and f"def {name}(" not in path.read_text()):
            gone.append(test)
    return gone


TIMES = pytest.StashKey[dict[str, float]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """As a plugin of the coverage run (`-p mutate`): each test's lines under its id, and how
    long it took (written at the end to $MUTATE_TIMES)."""
    import coverage

    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(item.nodeid)
    began = time.perf_counter()
    try:
        return (yield)
    finally:
        item.config.stash.setdefault(TIMES, {})[item.nodeid] = time.perf_counter() - began
        if current is not None:
            current.switch_context("")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if path := os.environ.get("MUTATE_TIMES"):
        Path(path).write_text(json.dumps(session.config.stash.get(TIMES, {})))


@dataclass
class Tests:
    """A module's tests as one run of them under coverage saw them: the ids of those that ran
    each line (in the tests' own process), and how long each took."""

    by_line: dict[int, set[str]]
    seconds: dict[str, float]

    def of(self, site: Site) -> list[str]:
        """The tests that ran the site's lines, the quickest first (a mutant they catch is
        most often caught by any of them)."""
        found = set().union(*(self.by_line.get(line, set()) for line in site.lines))
        return sorted(found, key=lambda t: (self.seconds.get(t, float("inf")), t))


def measured(module: str, timeout: float) -> Tests | None:
    """The module's tests run once under coverage; None when they fail with no mutant."""
    import coverage

    data_file = ROOT / f".mutate-coverage-{os.getpid()}"
    times = ROOT / f".mutate-times-{os.getpid()}.json"
    options = [f"--data-file={data_file}", f"--include={ROOT / module}"]
    try:
        # coverage slows them
        if killed(TARGETS[module], 3 * timeout, coverage=options, times=times):
            return None
        data = coverage.CoverageData(basename=str(data_file))
        data.read()
        by_line = {
            line: {c for c in contexts if c}
            for line, contexts in data.contexts_by_lineno(str(ROOT / module)).items()
        }
        return Tests(by_line, json.loads(times.read_text()))
    finally:
        data_file.unlink(missing_ok=True)
        times.unlink(missing_ok=True)


def caught(site: Site, tests: Tests, every: list[str], timeout: float) -> bool:
    """Whether the tests catch the mutant on disk: first those that ran its line, the
    quickest first, then, when they pass (or none did), the rest of the module's list."""
    first = tests.of(site)
    if first and killed(first, timeout):
        return True
    return killed([*every, *(f"--deselect={t}" for t in first)], timeout)


def run(
    module: str, only: tuple[str, ...], limit: int | None, timeout: float
) -> tuple[int, int, list[str]]:
    path = ROOT / module
    original = path.read_text()
    if gone := missing(TARGETS[module]):
        sys.exit(f"mutate: {module}'s tests name what is not there: {', '.join(gone)}")
    tests = measured(module, timeout)
    if tests is None:  # else every mutant would count as caught
        sys.exit(f"mutate: {module}'s tests fail with no mutant; run them: {TARGETS[module]}")
    found = sites(original, only)[:limit]
    survivors = []
    lines = original.splitlines()
    try:
        for n, site in enumerate(found, 1):
            path.write_text(mutant(original, site.index))
            if not caught(site, tests, TARGETS[module], timeout):
                code = lines[site.line - 1].strip() if site.line else ""
                survivors.append(f"{module}:{site.line}: {site.what}    {code}")
                print(f"\rsurvived: {survivors[-1]}", flush=True)  # a run cut short keeps it
            print(f"\r{module}: {n}/{len(found)}, {len(survivors)} survived", end="", flush=True)
    finally:
        path.write_text(original)
    print()
    return len(found), len(found) - len(survivors), survivors


def stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("modules", nargs="*", help=f"default: {', '.join(TARGETS)}")
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    ap.add_argument("--max", type=int, help="at most N mutants a module")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a test run may take")
    ap.add_argument(
        "--only",
        help="mutate only inside these functions, comma-separated (default: FOCUS's, if any)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, stop)  # the source is put back on SIGTERM too, not only ^C
    modules = args.modules or list(TARGETS)
    unknown = [m for m in modules if m not in TARGETS]
    if unknown:
        sys.exit(f"mutate: no tests named for {', '.join(unknown)} (see TARGETS)")

    def only(module: str) -> tuple[str, ...]:
        return tuple(args.only.split(",")) if args.only else FOCUS.get(module, ())

    if args.list:
        for m in modules:
            for s in sites((ROOT / m).read_text(), only(m))[: args.max]:
                print(f"{m}:{s.line}: {s.what}  ({s.function or 'module'})")
        return
    t0 = time.monotonic()
    total = caught = 0
    everything: list[str] = []
    for m in modules:
        n, k, survivors = run(m, only(m), args.max, args.timeout)
        total, caught = total + n, caught + k
        everything += survivors
        print(f"{m}: {k}/{n} killed ({100 * k / max(n, 1):.0f}%)")
    share = 100 * caught / max(total, 1)
    print(f"\nkilled {caught}/{total} ({share:.0f}%) in {time.monotonic() - t0:.0f} s")
    if everything:
        print("survivors:")
        print("\n".join(everything))


if __name__ == "__main__":
    main()
