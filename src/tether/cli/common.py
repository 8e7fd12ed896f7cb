"""What the commands share: where things are kept, how events are shown, and the runtime they
run on (its factory builds agents from the recorded `RunOptions`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

import orjson

from ..approvals import ApprovalRequest, Decision
from ..errors import ConfigError, StoreUnavailable, known
from ..events import Event, Sink
from ..journal import append_private, private_dir
from ..messages import ToolCall
from ..options import CLI_AGENT, RunOptions, build_agent, select_tools
from ..questions import (
    Answer,
    Asker,
    Question,
    answer_defaults,
    decline_all,
    parse_value,
    problems,
)
from ..redact import redactor, scrub
from ..result import RunResult
from ..runtime import Runtime
from ..tools.mcp_auth import AuthSettings

STORE_HELP = "a SQLite file in the data directory"


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tether"


def default_store(directory: str | Path | None = None) -> str:
    """$TETHER_STORE, else a SQLite file in the data directory (`--data-dir`, else the
    default one)."""
    store = os.environ.get("TETHER_STORE") or ""
    if not store:
        path = private_dir(directory or data_dir()) / "runs.sqlite"
        store = f"sqlite:///{path}"
    return store


def error(message: str) -> int:
    """A one-line error, exit status 2; what it quotes (a server's words, a file's name) is
    shown without the escapes that would redraw the terminal."""
    print(f"tether: error: {terminal_safe(message)}", file=sys.stderr)
    return 2


# -- the runtime --------------------------------------------------------------------------------


WORKER_OWN = (
    "tools_from", "mcp", "mcp_auth", "guardrails", "tool_env", "workspace", "sandbox",
    "sandbox_net",
)  # fmt: skip
"""Run options a worker takes from its own command line only, never from a run's record: each
names code the worker runs (a tools file, an MCP server's command, guardrails), a secret it
hands a command (`--tool-env`) or how far a command reaches (the workspace, the sandbox).
Taken from the record, write access to a store's rows was code execution on every worker that
took the run, with the workers' keys."""
NAMED_CODE = {"tools_from": "--tools-from", "mcp": "--mcp", "guardrails": "--guardrails"}


@dataclass(frozen=True)
class WorkerScope:
    """What a worker runs a queued run with: its own `WORKER_OWN` options (`own`, those its
    command line gave), and the model endpoints beside each provider's own that its keys may
    go to (`endpoints`, its `--allow-base-url`)."""

    own: dict[str, Any] = field(default_factory=dict)
    endpoints: frozenset[str] = frozenset()

    def options_for(self, recorded: dict[str, Any]) -> RunOptions:
        """A run's options as this worker runs it: the record's, but for `WORKER_OWN`, which
        are the worker's. A run that names code the worker was not given (a tools file, an
        MCP server, guardrails), or a model endpoint its keys may not go to, is refused with
        the reason (its tools would be missing, or its key sent where the record says)."""
        for key, flag in NAMED_CODE.items():
            if recorded.get(key) and key not in self.own:
                named = ", ".join(map(str, recorded[key]))
                raise ConfigError(
                    f"the run names {flag} {named}, which this worker was not given: a worker "
                    f"runs only the code its own command line names (start it with {flag})"
                )
        kept = {k: v for k, v in recorded.items() if k not in WORKER_OWN}
        options = RunOptions.from_dict({**kept, **self.own})
        allowed = {url.rstrip("/") for url in self.endpoints}
        for url in endpoints_of(options):
            if url.rstrip("/") not in allowed:
                raise ConfigError(
                    f"the run sends its model calls to {url}, where this worker's keys may "
                    f"not go: start the worker with --allow-base-url {url}"
                )
        return options


def endpoints_of(options: RunOptions) -> list[str]:
    """The model endpoints a run's options name beside the providers' own (its base URL, its
    fallbacks' `@URL`)."""
    found = [options.base_url] if options.base_url else []
    return found + [spec.partition("@")[2] for spec in options.fallback if "@" in spec]


def cli_runtime(
    store: str | None,
    scope: WorkerScope | None = None,
    asker: Asker | None = None,
    data: str | None = None,
    **settings: Any,
) -> Runtime:
    """A runtime whose factory builds agents from `RunOptions` (with their MCP servers'
    tools, connected once per runtime): the CLI's, the page's, and a worker's, which runs each
    run within its own `scope` (`WorkerScope`). `asker` answers the MCP servers' questions
    (None: they wait for `tether answer` or the page, see `Runtime.answer`); their sign-in
    tokens are kept in the data directory (`data`, the command's `--data-dir`)."""
    tokens = Path(data) if data else data_dir()

    async def factory(name: str, recorded: dict[str, Any]) -> Any:
        if name != CLI_AGENT:
            raise ConfigError(f"no agent named {name!r} here (this process builds {CLI_AGENT!r})")
        options = scope.options_for(recorded) if scope else RunOptions.from_dict(recorded)
        tools = select_tools(options)
        if options.mcp:
            from ..tools.mcp import MCPApproval, MCPNames

            tools += await rt.mcp_tools(
                options.mcp,
                options.connect_timeout,
                auth=AuthSettings.load(options.mcp_auth) if options.mcp_auth else None,
                token_dir=tokens / "mcp-tokens",
                asker=asker,
                sampling=options.mcp_sampling != "off",
                approval=MCPApproval.parse(options.mcp_approve),
                names=MCPNames.parse(options.mcp_prefix, options.mcp_tools, options.mcp_skip),
            )
        return build_agent(options, tools)

    quiet_mcp_sign_in_log()
    # the command owns its process: the collector is set for many live runs
    rt = Runtime(store, factory=factory, gc_tuning=True, **settings)
    return rt


def quiet_mcp_sign_in_log() -> None:
    """The `mcp` SDK logs a failed sign-in with its traceback before raising it; the command
    says it in one line naming the server (`tools.mcp`), so the log's copy is dropped here."""
    log = logging.getLogger("mcp.client.auth")
    log.propagate = False
    if not log.handlers:
        log.addHandler(logging.NullHandler())


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop the command as Ctrl-C does: the task that follows the run (or
    the worker's loop) is cancelled, so the run is cancelled with its tool calls' processes
    and the command exits. By default they ended the process at once, and a bash call's
    processes went on running. Call it from the command's main task."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is None:
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, task.cancel)


async def until_end(run: Any) -> RunResult:
    """Wait for a run's end (its events go to the sinks it was started with, as they are
    emitted, so what is shown happened before the next thing the run does). A cancel of this
    task (Ctrl-C) cancels the run, which still reports its end."""
    try:
        result: RunResult | None = await run.wait()
    except asyncio.CancelledError:
        run.cancel()
        result = await run.wait()
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
    return known(result, "the result of a run that has ended")


# -- approvals at the terminal ----------------------------------------------------------------


async def read_line(stream: TextIO) -> str:
    """The next line typed on `stream`, read on the event loop, not in a thread: a Ctrl-C
    while it waits cancels the wait at once, and nothing is left reading. A thread blocked in
    `readline` held up the command's exit until Enter was pressed, then swallowed that line
    (the next `you>` of `tether ask`). Answers piped in are read through Python's buffer,
    which may hold them already (`input()` reads ahead), in a thread as before."""
    if not stream.isatty():  # piped answers: Python's buffer may hold them already
        return await asyncio.to_thread(stream.readline)
    loop = asyncio.get_running_loop()
    try:
        fd = stream.fileno()
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, readable)
    except (OSError, ValueError, NotImplementedError):
        return stream.readline()
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    line = bytearray()
    while not line.endswith(b"\n"):  # a terminal hands over a whole line; a pipe, what came
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode(errors="replace")


class TerminalApprover:
    """Asks at the terminal, one call at a time: `? allow bash({"command": "ls"})? [y/N]`.
    Ctrl-C at the prompt cancels the run (see `read_line`)."""

    def __init__(self, err: TextIO, can_ask: bool) -> None:
        self.err, self.can_ask = err, can_ask
        self.lock: asyncio.Lock | None = None

    async def __call__(self, request: ApprovalRequest) -> Decision:
        if not self.can_ask:
            return Decision(False, "no one at a terminal to approve it (--approve auto allows it)")
        self.lock = self.lock or asyncio.Lock()
        async with self.lock:
            # the whole call, wrapped: a padded argument must not hide what follows it
            args = spelled_out(orjson.dumps(request.call.arguments or {}).decode())
            shown = "\n      ".join(textwrap.wrap(args, 92, drop_whitespace=False)) or "{}"
            self.err.write(f"  ? allow {terminal_safe(request.call.name)}(\n      {shown})? [y/N] ")
            self.err.flush()
            answer = await read_line(sys.stdin)
        if answer.strip().lower() in ("y", "yes"):
            return Decision(True, "approved at the terminal")
        return Decision(False, "the user said no")


class TerminalAsker:
    """Asks an MCP server's question at the terminal, a field at a time, each typed value
    checked as the field's type wants (asked again when it is not); an empty line takes a
    field's default. `n` at the first prompt declines; Ctrl-C cancels the run."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.lock: asyncio.Lock | None = None  # made on the loop that asks

    async def __call__(self, question: Question) -> Answer:
        self.lock = self.lock or asyncio.Lock()
        async with self.lock:  # one prompt at a time, whoever asks
            who, said = terminal_safe(question.asker), terminal_safe(question.message)
            if question.url:
                self.say(f"  ? {who} asks you to visit {terminal_safe(question.url)}\n"
                         f"    {said}\n    done? [y/N] ")  # fmt: skip
                done = (await read_line(sys.stdin)).strip().lower() in ("y", "yes")
                return Answer("accept" if done else "decline", reason="at the terminal")
            self.say(f"  ? {who} asks: {said}\n    answer? [Y/n] ")
            if (await read_line(sys.stdin)).strip().lower() in ("n", "no"):
                return Answer("decline", reason="the user declined at the terminal")
            while True:
                content = await self.fields(question)
                wrong = problems(question, content)
                if not wrong:
                    return Answer("accept", content, "answered at the terminal")
                self.say(f"    that does not fit: {terminal_safe(wrong)}\n")

    async def fields(self, question: Question) -> dict[str, Any]:
        content: dict[str, Any] = {}
        for name, spec in question.fields().items():
            hint = spec.get("type", "text")
            if "enum" in spec:
                hint = "|".join(map(str, spec["enum"]))
            if "default" in spec:
                hint += f", default {spec['default']}"
            label = terminal_safe(str(spec.get("title") or name))
            while True:
                self.say(f"    {label} ({terminal_safe(str(hint))}): ")
                typed = (await read_line(sys.stdin)).strip()
                if not typed:
                    if "default" in spec:
                        content[name] = spec["default"]
                    break
                try:
                    content[name] = parse_value(spec, typed)
                    break
                except ValueError as e:
                    self.say(f"    {terminal_safe(str(e))}\n")
        return content

    def say(self, text: str) -> None:
        self.err.write(text)
        self.err.flush()


def asker_for(approve: str, can_ask: bool, durable: bool) -> Asker | None:
    """Who answers an MCP server's question: the person at this terminal (`--approve ask`
    with one), the defaults (`--approve auto`); with no terminal, a durable run waits for
    `tether answer` (None: the runtime's `Questions`), one in memory is declined at once."""
    if approve == "auto":
        return answer_defaults
    if approve == "ask" and can_ask:
        return TerminalAsker(sys.stderr)
    if approve == "ask" and durable:
        return None
    return decline_all


def inline_approvals(rt: Runtime, run_id: str) -> Sink:
    """Ask at this terminal for each call the run waits on and give the runtime the answer;
    for a durable run, `tether approve` from elsewhere works as well (the first answer counts)."""
    ask = TerminalApprover(sys.stderr, can_ask=True)

    async def answer(d: dict[str, Any]) -> None:
        raw = orjson.dumps(d["arguments"]).decode()
        call = ToolCall(d["id"], d["name"], d["arguments"], raw)
        request = ApprovalRequest(d["approval_id"], call, d["args_hash"])
        decision = await ask(request)
        run = rt.get(run_id)
        if not any(r.id == request.id for r in run.waiting()):
            return  # decided elsewhere meanwhile
        try:
            if decision.approved:
                run.approve(request.id, request.args_hash)
            else:
                run.deny(request.id, decision.reason)
        except StoreUnavailable as e:  # the call still waits: `tether approve` can answer it
            print(f"tether: {e}", file=sys.stderr, flush=True)

    def sink(event: Event) -> None:
        if event.type == "approval_requested":
            rt.spawn(answer(event.data))

    return sink


def waiting(given: str | None = None) -> Sink:
    """With no terminal to ask on, say how to answer from elsewhere; the run waits (durably).
    A call's line is said a moment later, and not at all if a policy (`--approve auto`)
    decided it meanwhile: its decision follows its request at once, in the same step."""
    pending: dict[tuple[str, str], asyncio.Handle] = {}

    def say(said: str) -> None:
        print(f"tether: {terminal_safe(said)}", file=sys.stderr, flush=True)

    def sink(event: Event) -> None:
        run_id = given or event.run_id
        said = ""
        if event.type == "approval_decided":
            decided = pending.pop((event.run_id, event.data.get("approval_id", "")), None)
            if decided is not None:
                decided.cancel()
            return
        if event.type == "approval_requested":
            a = event.data["approval_id"]
            said = (
                f"{run_id} waits for approval of {event.data['name']}: "
                f"tether approve {run_id} {a}   (or tether deny {run_id} {a})"
            )
        elif event.type == "question_asked":
            q = event.data["question_id"]
            said = (
                f"{run_id} waits for an answer: {event.data['asker']} asks "
                f"{event.data['message']!r}: tether answer {run_id} {q} JSON   "
                f"(or tether answer {run_id} {q} --decline)"
            )
        if not said:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not in the loop's thread: say it now
            loop = None
        if event.type == "approval_requested" and loop is not None:
            key = (event.run_id, event.data["approval_id"])

            def later() -> None:
                pending.pop(key, None)
                say(said)

            pending[key] = loop.call_soon(later)
        else:
            say(said)

    return sink


# -- showing events -----------------------------------------------------------------------------


def json_sink(out: TextIO) -> Sink:
    """Events as JSON lines on `out`. A reader that stops reading (`tether run --json | head`)
    stops the output, not the run: the run goes on to its end, recorded as ever, and exits
    with its status (a write into the closed pipe raised into the run, which then hung on its
    way out with a traceback)."""
    scrubber = redactor()
    gone = False

    def write(event: Event) -> None:
        nonlocal gone
        if gone:
            return
        try:
            out.write(scrubber.scrub_bytes(event.to_json()).decode() + "\n")
            out.flush()
        except BrokenPipeError:
            gone = True
            with contextlib.suppress(OSError, ValueError):  # no error at exit either
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())

    return write


class HumanOutput:
    """Streams text to stdout and shows tool calls and short results on stderr."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.streamed = False
        self.pending = ""  # the start of an escape sequence a later delta may complete

    def __call__(self, event: Event) -> None:
        d = event.data
        if "parent_run_id" in d:
            self.child(event)
        elif event.type == "text_delta":
            shown, self.pending = held_back(self.pending + d["text"])
            self.out.write(terminal_safe(scrub(shown)))
            self.out.flush()
            self.streamed = True
        elif event.type == "model_response":
            if self.streamed:
                self.out.write(terminal_safe(scrub(self.pending)) + "\n")
                self.pending = ""
            elif d["text"]:
                self.out.write(terminal_safe(d["text"]) + "\n")
            self.out.flush()
            self.streamed = False
        elif event.type == "tool_call":
            args = orjson.dumps(d["arguments"]).decode()
            self.err.write(f"  → {terminal_safe(d['name'])}({spelled_out(short(args, 200))})\n")
        elif event.type == "tool_result":
            mark = "✗" if d["is_error"] else "←"
            output = short(terminal_safe(d["output"]), 160)
            self.err.write(f"  {mark} {terminal_safe(d['name'])}: {output}\n")
        elif event.type == "approval_decided" and not d["approved"]:
            self.err.write(f"  ✗ not approved: {terminal_safe(d['reason'])}\n")
        elif event.type == "retry":
            self.err.write(
                f"  … retry {d['attempt']} in {d['delay']:.1f} s: "
                f"{terminal_safe(d['error']['message'])}\n"
            )
        self.err.flush()

    def child(self, event: Event) -> None:
        """A child run's events (an agent used as a tool): its calls and its end, on stderr
        under its id; its text is not streamed, as children run side by side."""
        d, who = event.data, terminal_safe(event.run_id)
        if event.type == "tool_call":
            args = orjson.dumps(d["arguments"]).decode()
            shown = spelled_out(short(args, 160))
            self.err.write(f"    {who} → {terminal_safe(d['name'])}({shown})\n")
        elif event.type == "run_finished":
            self.err.write(f"    {who} {d['outcome']}: {short(terminal_safe(d['answer']), 120)}\n")
        else:
            return
        self.err.flush()


def output_sink(as_json: bool) -> Sink:
    return json_sink(sys.stdout) if as_json else HumanOutput(sys.stdout, sys.stderr)


ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, clearing the screen
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
    r"|\x1b[@-_]?"  # other escapes
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # other control characters (not tab or newline)
    r"|[\u202a-\u202e\u2066-\u2069]"  # bidi overrides: text shown in another order than read
)


COMPLETE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def held_back(text: str) -> tuple[str, str]:
    """`text` split before an escape sequence that a later delta may complete (a stream can
    part one anywhere), so that it is stripped whole; a long one is let go."""
    i = text.rfind("\x1b")
    if i < 0 or COMPLETE.match(text, i) or len(text) - i > 256:
        return text, ""
    return text[:i], text[i:]


BIDI = re.compile(r"[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def spelled_out(text: str) -> str:
    """`text` with its bidi controls written as `\\uXXXX`: in a call a person is asked to
    approve they must show, not act (they can make `rm -rf ~/x` read as something else)."""
    return BIDI.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def terminal_safe(text: str) -> str:
    """What a model or a tool wrote, without the escape sequences and control characters
    that would let it redraw the terminal (hide a line, fake a prompt, set a title)."""
    return ESCAPES.sub("", text)


def short(text: str, limit: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def exit_status(result: RunResult, as_json: bool) -> int:
    """The end of a run on the terminal (unless --json) and the command's exit status."""
    if result.outcome == "cancelled":
        if not as_json:
            print("\n[cancelled]", file=sys.stderr)
        return 130
    if not as_json:
        report(result, sys.stderr)
    if (result.error or {}).get("kind") == "store_unavailable":
        leave(result.exit_status)
    return result.exit_status


def leave(status: int) -> NoReturn:
    """Exit now, with `status`, when the store stopped answering: DBOS's threads wait for it
    without end, and an ordinary exit waits for them (the run is kept in the store)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def counted(n: int, what: str) -> str:
    """`1 step`, `2 steps`."""
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def report(result: RunResult, err: TextIO, quiet_done: bool = False) -> None:
    u = result.usage
    figures = f"{counted(result.steps, 'step')}, {u.total_tokens} tokens, ${result.cost_usd:.4f}"
    if result.outcome == "done":
        if not quiet_done:
            err.write(f"[done] {figures}\n")
    elif result.outcome == "halted":
        err.write(f"[halted] {terminal_safe(result.reason)} ({figures})\n")
    elif result.outcome == "failed":  # a provider's words, among others
        err.write(f"tether: run failed: {terminal_safe(result.reason)}\n")
    err.flush()


def journal_sinks(data_dir: str, log: str | None, journal: bool = True) -> list[Sink]:
    """The journal (for tether show) and, with --log, the structured log."""
    from ..journal import Journal

    sinks: list[Sink] = []
    try:
        if journal:
            sinks.append(Journal(Path(data_dir) / "events").write)
    except OSError as e:
        print(f"tether: warning: no journal in {data_dir}: {e}", file=sys.stderr)
    if log:
        out = append_private(log)  # lives as long as the process
        scrubber = redactor()

        def write_log(event: Event) -> None:
            if event.type == "text_delta":
                return
            level = "error" if event.type == "run_finished" and event.data.get("error") else "info"
            record = {"ts": event.ts, "level": level, "event": event.to_dict()}
            out.write(scrubber.scrub_bytes(orjson.dumps(record)) + b"\n")
            out.flush()

        sinks.append(write_log)
    return sinks
