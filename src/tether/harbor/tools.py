"""bash and the file tools, carried out inside a Harbor environment.

The environment is the run's scope: it arrives in `RunContext.deps`, never from the model's
arguments. Commands go through `environment.exec`, files through its upload and download
calls, so the same tools work in Docker, in a cloud sandbox or in the local environment.
Relative paths are relative to the task's workdir (`RunContext.workspace`). Outputs keep their
head and tail, as the local tools do.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import Any

from ..tools.bash import capped
from ..tools.files import MAX_READ, page
from ..tools.session import session_of
from ..tools.tool import RunContext, Tool, tool

COMMAND_TIMEOUT = 180


def environment_of(ctx: RunContext) -> Any:
    if ctx.deps is None:
        raise RuntimeError("this tool runs only inside a Harbor environment")
    return ctx.deps


def where(ctx: RunContext, path: str) -> str:
    return path if path.startswith("/") else str(Path(ctx.workspace) / path)


@tool(timeout=COMMAND_TIMEOUT + 10)
async def bash(command: str, ctx: RunContext, fresh: bool = False) -> str:
    """Run a bash command in the task's shell session and return its exit status and output.
    The working directory and variables carry over from one call to the next, as in a
    terminal.

    Args:
        command: The command line, run with bash. Runs without a terminal.
        fresh: Start a fresh session first: the workdir, no variables.
    """
    env = environment_of(ctx)
    shell = session_of(ctx.kept, fresh)
    script, mark = shell.wrap(command)
    result = await env.exec(script, cwd=str(ctx.workspace), timeout_sec=COMMAND_TIMEOUT)
    output = shell.take(result.stdout or "", mark) + (result.stderr or "")
    note = f" (timed out after {COMMAND_TIMEOUT} s)" if result.return_code == 124 else ""
    return f"exit status {result.return_code}{note}\n{capped(output)}"


async def fetch(ctx: RunContext, path: str) -> str:
    env = environment_of(ctx)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "file"
        try:
            await env.download_file(where(ctx, path), local)
        except Exception as e:
            raise FileNotFoundError(f"cannot read {path!r}: {e}") from None
        return local.read_text(errors="replace")


async def store(ctx: RunContext, path: str, content: str) -> None:
    env = environment_of(ctx)
    target = where(ctx, path)
    parent = str(Path(target).parent)
    await env.exec(f"mkdir -p {shlex.quote(parent)}")
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "file"
        local.write_text(content)
        await env.upload_file(local, target)


@tool
async def read_file(path: str, ctx: RunContext, offset: int = 0, limit: int = MAX_READ) -> str:
    """Read a text file in the environment.

    Args:
        path: File path, relative to the workdir or absolute.
        offset: Character offset to start reading at.
        limit: At most this many characters are returned.
    """
    return page(await fetch(ctx, path), offset, limit)


@tool
async def write_file(path: str, content: str, ctx: RunContext) -> str:
    """Create or overwrite a text file in the environment (parent directories are created).

    Args:
        path: File path, relative to the workdir or absolute.
        content: The whole new content of the file.
    """
    await store(ctx, path, content)
    return f"wrote {len(content)} characters to {path}"


@tool
async def edit_file(
    path: str, old_text: str, new_text: str, ctx: RunContext, replace_all: bool = False
) -> str:
    """Replace exact text in a file in the environment.

    Args:
        path: File path, relative to the workdir or absolute.
        old_text: The exact text to replace; it must occur once unless replace_all is set.
        new_text: The replacement.
        replace_all: Replace every occurrence.
    """
    text = await fetch(ctx, path)
    count = text.count(old_text)
    if count == 0:
        raise ValueError(f"old_text does not occur in {path}")
    if count > 1 and not replace_all:
        raise ValueError(f"old_text occurs {count} times in {path}; make it unique")
    await store(ctx, path, text.replace(old_text, new_text))
    return f"replaced {count if replace_all else 1} occurrence(s) in {path}"


@tool
async def list_files(ctx: RunContext, path: str = ".") -> str:
    """List a directory in the environment (`ls -la`).

    Args:
        path: Directory, relative to the workdir or absolute.
    """
    env = environment_of(ctx)
    result = await env.exec(f"ls -la {shlex.quote(where(ctx, path))}", timeout_sec=30)
    if result.return_code != 0:
        raise FileNotFoundError((result.stderr or result.stdout or "").strip())
    return capped(result.stdout or "")


TOOLS: list[Tool] = [bash, read_file, write_file, edit_file, list_files]
