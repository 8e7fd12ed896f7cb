"""The `bash` tool: a command in the workspace, with a clean environment, whose processes end
with the call.

The environment is an allow-list (`SAFE_ENV`, `LC_*`) plus the names a user passes with
`--tool-env`: provider keys and database URLs never reach a command, so no transformation of
them (`base64`, `rev`, half a key) can leak what redaction would miss.

When the call ends (the shell exits, it times out, or it is cancelled) every process it started
is killed: its process group, and the processes that left the group (`setsid`, `nohup ... &`),
found by a cookie in their environment (`TETHER_CALL`, a fresh value per call), as Jenkins finds
a build's strays. A process that both leaves the session and clears its environment escapes;
the sandbox is what stops that. Output is stdout and stderr combined; long output keeps its head
and tail with a marker saying how much was cut, and memory stays bounded however much a command
prints.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Coroutine, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from ..errors import known
from .sandbox import Sandbox
from .seccomp import descriptor as filter_descriptor
from .session import ShellSession, session_of
from .tool import RunContext, Tool, tool

HEAD = 8_000
TAIL = 8_000
DRAIN_AFTER_KILL = 0.5
"""Seconds to wait for the pipe to close once the call's processes are killed."""
SAFE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR")
COOKIE = "TETHER_CALL"
PF_KTHREAD = 0x00200000
"""The flag in /proc/<pid>/stat of a kernel thread."""
KILL_PASSES = 20
SETTLE_PAUSE = 0.005
"""Seconds between looks while an empty environment settles: an `execve` takes well under a
millisecond, so three looks 5 ms apart cover it with room under load."""


class CappedOutput:
    """Keeps the first `head` and the last `tail` bytes of a stream and counts the rest."""

    def __init__(self, head: int = HEAD, tail: int = TAIL) -> None:
        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if cut > 0:
            return f"{head}\n[... {cut} bytes of output cut ...]\n{tail}"
        return head + tail


def environment(passed: Sequence[str], cwd: str, cookie: str) -> dict[str, str]:
    """What a command sees: the safe variables, those the user named, and the call's cookie."""
    env = {
        k: v for k, v in os.environ.items() if k in SAFE_ENV or k.startswith("LC_") or k in passed
    }
    env.setdefault("PATH", os.defpath)
    env["PWD"] = cwd
    env[COOKIE] = cookie
    return env


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def mark_of(cookie: str) -> bytes:
    return f"{COOKIE}={cookie}".encode()


def marked_processes(marks: AbstractSet[bytes]) -> tuple[list[int], list[int]]:
    """The processes whose environment holds one of `marks` (an environment entry such as
    `TETHER_CALL=...`), and the live user processes whose environment reads empty: a process
    inside `execve` shows none for a moment, so it may hold a mark a moment later (Linux's
    /proc; elsewhere none are found)."""
    found: list[int] = []
    empty: list[int] = []
    me = os.getpid()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    environ = f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            except OSError:  # not ours to read
                environ = b""
            if environ:
                if not marks.isdisjoint(environ.split(b"\0")):
                    found.append(int(entry.name))
            elif user_process(entry.name):
                empty.append(int(entry.name))
    return found, empty


def user_process(pid: str) -> bool:
    """Whether a /proc entry is a live process with memory of its own: not a kernel thread
    (whose environment is always empty), not a zombie, not gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0] not in ("Z", "X") and not int(fields[6]) & PF_KTHREAD


def kill_strays(marks: AbstractSet[bytes], settle: int = 0) -> int:
    """Kill the processes that carry any of `marks`, until none is left (one may fork while
    the last is being killed); how many were killed, in at most KILL_PASSES looks.

    With `settle`, a process whose environment reads empty (one inside `execve`, whose new
    image is not mapped yet) is looked at again, SETTLE_PAUSE apart, until it has stayed
    empty `settle` looks running (some processes really have none: `env -i`). A trial's end
    waits so (Harbor's stop missed 1 in 50 `setsid sleep 300 &` with one look); a bash call
    does not, as three looks would add some 15 ms to every call."""
    killed = 0
    empty_for: collections.Counter[int] = collections.Counter()
    for _ in range(KILL_PASSES):
        found, empty = marked_processes(marks)
        for p in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
                killed += 1
        empty_for.update(empty)
        if not found and all(empty_for[p] >= settle for p in empty):
            return killed
        if settle:
            time.sleep(SETTLE_PAUSE)
    return killed


def kill_all(pid: int, cookie: str) -> None:
    """Kill the call's process group and its strays."""
    kill_group(pid)
    kill_strays({mark_of(cookie)})


class Sweeper:
    """Kills the strays of the calls that end in one turn of the event loop with one look at
    /proc for all of them.

    A look reads every process's environment: 0.8 ms with 80 processes here, and a call's own
    processes add to them. A tree of 100 runs cancelled at its root ends 45 bash calls at
    once, and a look for each call in turn held the event loop 150 ms
    (`bench/tree_cancel.py`); the calls that end together now share one look."""

    def __init__(self) -> None:
        self.waiting: dict[bytes, asyncio.Future[None]] = {}

    async def sweep(self, cookie: str) -> None:
        loop = asyncio.get_running_loop()
        if not self.waiting:
            loop.call_soon(self.look)
        done = self.waiting[mark_of(cookie)] = loop.create_future()
        await done

    def look(self) -> None:
        waiting, self.waiting = self.waiting, {}
        try:
            kill_strays(waiting.keys())
        finally:
            for done in waiting.values():
                if not done.done():
                    done.set_result(None)


async def start(
    spawn: Coroutine[Any, Any, asyncio.subprocess.Process], cookie: str
) -> asyncio.subprocess.Process:
    """The started process, even when the call is cancelled or times out while it starts.

    The process runs before `create_subprocess_exec` returns (asyncio still connects its
    pipes), and a cancel in that window makes asyncio kill the shell alone: what the shell had
    started by then lived on. So the start is shielded, and on a cancel the call waits for it
    and kills everything it started before going on with the cancel."""
    starting = asyncio.ensure_future(spawn)
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # it failed to start: nothing to kill
            proc = await starting
            kill_all(proc.pid, cookie)
            await proc.wait()
        raise


async def run_command(
    command: str,
    cwd: str,
    output: CappedOutput,
    passed: Sequence[str] = (),
    sandbox: Sandbox | None = None,
    sweeper: Sweeper | None = None,
) -> int:
    """Run `command` with bash in `cwd` (inside `sandbox` when given); every process it starts
    dies with this coroutine (`sweeper` finds those that left its group)."""
    sweeper = sweeper or Sweeper()
    cookie = uuid.uuid4().hex
    fds: tuple[int, ...] = (filter_descriptor(),) if sandbox else ()
    try:
        argv = sandbox.argv(command, cwd, fds[0]) if sandbox else ["bash", "-c", command]
        proc = await start(
            asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=environment(passed, cwd, cookie),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                pass_fds=fds,
            ),
            cookie,
        )
    finally:
        for fd in fds:
            os.close(fd)
    stdout = known(proc.stdout, "the command's stdout pipe")

    async def pump() -> None:
        while chunk := await stdout.read(65536):
            output.add(chunk)

    reader = asyncio.create_task(pump())
    try:
        # Process.wait() also waits for the pipe to close, which a child left running in the
        # background can hold open: watch the exit status and the pipe side by side.
        while proc.returncode is None and not reader.done():
            await asyncio.wait({reader}, timeout=0.05)
        if reader.done():
            return await proc.wait()
        return proc.returncode if proc.returncode is not None else -1
    finally:  # done, timed out or cancelled: whatever the call started goes
        kill_group(proc.pid)
        await asyncio.shield(sweeper.sweep(cookie))
        if proc.returncode is None:
            await asyncio.shield(proc.wait())
        if not reader.done():
            await asyncio.shield(asyncio.wait({reader}, timeout=DRAIN_AFTER_KILL))
        if not reader.done():
            reader.cancel()
            # Let go of a pipe still held by children: asyncio has no public way to close it.
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


SESSION_ROOM = 65_536
"""Room kept at the end of a session call's output for the session's state (see `session`)."""
WAIT_MAX = 110.0
"""The longest a session call waits for its command (its tool's time limit is a little more)."""


def bash_tool(passed: Sequence[str] = (), sandbox: Sandbox | None = None) -> Tool:
    """The bash tool, passing these environment variables on (`--tool-env`) besides the safe
    ones, and running every command in `sandbox` when one is given (`--sandbox`)."""
    names = tuple(passed)
    sweeper = Sweeper()  # the calls of this tool that end together share one look at /proc

    @tool(timeout=120, approval="always")
    async def bash(command: str, ctx: RunContext) -> str:
        """Run a bash command in the workspace and return its exit status and combined output.

        Args:
            command: The command line, run with `bash -c` in the workspace directory.
        """
        output = CappedOutput()
        code = await run_command(command, str(ctx.workspace), output, names, sandbox, sweeper)
        return f"exit status {code}\n{output.text()}"

    return bash


bash = bash_tool()


class BackgroundJob:
    """A session command that went on past its call's wait: its task, and its output so far."""

    def __init__(self, task: asyncio.Task[int], output: CappedOutput, mark: str) -> None:
        self.task, self.output, self.mark = task, output, mark

    async def stop(self) -> None:
        self.task.cancel()  # run_command's cleanup kills all it started
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def wait(self, seconds: float) -> None:
        await asyncio.wait({self.task}, timeout=seconds)

    def report(self, number: int) -> str:
        """What the model is told of the job: running, or how it ended, and its output."""
        text = ShellSession().take(self.output.text(), self.mark)  # its end leaves no state
        if not self.task.done():
            return f"job {number} still running\n{capped(text)}"
        if self.task.cancelled():
            return f"job {number} stopped\n{capped(text)}"
        return f"job {number} ended: exit status {self.task.result()}\n{capped(text)}"


def session_tools(passed: Sequence[str] = (), sandbox: Sandbox | None = None) -> list[Tool]:
    """bash in the run's shell session (`session.py`: the working directory and variables
    carry from call to call), and `bash_job` for commands that outlast their call's wait; the
    environment and sandbox as `bash_tool`'s."""
    names = tuple(passed)
    sweeper = Sweeper()

    @tool(name="bash", timeout=WAIT_MAX + 10, approval="always")
    async def bash(command: str, ctx: RunContext, fresh: bool = False, wait: float = 60) -> str:
        """Run a bash command in the workspace's shell session and return its exit status and
        combined output. The working directory and variables carry over from one call to the
        next, as in a terminal. A command still running after `wait` seconds goes on in the
        background as a job: poll it or stop it with bash_job.

        Args:
            command: The command line, run with bash; no terminal, no interactive programs.
            fresh: Start a fresh session first: the workspace directory, no variables.
            wait: Seconds to wait for the command before it goes on as a job (at most 110).
        """
        shell = session_of(ctx.kept, fresh)
        script, mark = shell.wrap(command)
        output = CappedOutput(tail=TAIL + SESSION_ROOM)
        running = asyncio.ensure_future(
            run_command(script, str(ctx.workspace), output, names, sandbox, sweeper)
        )
        try:
            await asyncio.wait({running}, timeout=max(0.0, min(wait, WAIT_MAX)))
        except asyncio.CancelledError:
            running.cancel()
            raise
        if not running.done():
            number = shell.add_job(BackgroundJob(running, output, mark))
            return shell.jobs[number].report(number) + (
                f"(it goes on as job {number}: bash_job({number}) shows its output, "
                f"bash_job({number}, stop=true) stops it)"
            )
        code = running.result()
        return f"exit status {code}\n{capped(shell.take(output.text(), mark))}"

    @tool(timeout=WAIT_MAX + 10)
    async def bash_job(job: int, ctx: RunContext, stop: bool = False, wait: float = 0) -> str:
        """Show a background job's output so far and whether it still runs, or stop it.

        Args:
            job: The job's number, as bash said.
            stop: Stop the job (every process it started).
            wait: Seconds to wait for the job to end first (at most 110).
        """
        shell = session_of(ctx.kept, False)
        found = shell.jobs.get(job)
        if found is None:
            known = ", ".join(map(str, shell.jobs)) or "none"
            return f"no job {job} in this session (jobs: {known})"
        if stop:
            await found.stop()
        elif wait > 0:
            await found.wait(min(wait, WAIT_MAX))
        return found.report(job)

    return [bash, bash_job]


def capped(text: str) -> str:
    """`text` with its head and tail kept, as a call's output is."""
    out = CappedOutput()
    out.add(text.encode())
    return out.text()
