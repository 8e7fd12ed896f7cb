"""The `bash` tool: a command in the workspace, in its own process group.

A timeout or a cancel kills the whole group (the shell and every child it started), so nothing is
left running. Output is stdout and stderr combined; long output keeps its head and tail with a
marker saying how much was cut, and memory stays bounded however much a command prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from .tool import RunContext, tool

HEAD = 8_000
TAIL = 8_000
DRAIN_AFTER_EXIT = 0.5
"""Seconds to keep reading after the shell exits, for output of children it left running."""


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


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_command(command: str, cwd: str, output: CappedOutput) -> int:
    """Run `command` with bash in `cwd`; the process group dies with this coroutine."""
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            output.add(chunk)

    reader = asyncio.create_task(pump())
    finished = False
    try:
        # Process.wait() also waits for the pipe to close, which a child left running in the
        # background can hold open for ever: watch the exit status and the pipe side by side.
        while proc.returncode is None and not reader.done():
            await asyncio.wait({reader}, timeout=0.05)
        if reader.done():
            code = await proc.wait()
        else:
            await asyncio.wait({reader}, timeout=DRAIN_AFTER_EXIT)
            code = proc.returncode if proc.returncode is not None else -1
        finished = True
        return code
    finally:
        if not finished:  # timeout or cancel: the whole tree goes
            kill_group(proc.pid)
            if proc.returncode is None:
                await asyncio.shield(proc.wait())
        if not reader.done():
            reader.cancel()
            # Let go of a pipe still held by children: asyncio has no public way to close it.
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


@tool(timeout=120, approval="always")
async def bash(command: str, ctx: RunContext) -> str:
    """Run a bash command in the workspace and return its exit status and combined output.

    Args:
        command: The command line, run with `bash -c` in the workspace directory.
    """
    output = CappedOutput()
    code = await run_command(command, str(ctx.workspace), output)
    return f"exit status {code}\n{output.text()}"
