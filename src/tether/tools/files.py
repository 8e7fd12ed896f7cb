"""File tools confined to the run's workspace.

A path is taken relative to the workspace. Absolute paths, `..` that climbs out, and symlinks that
lead outside are refused with an error that says so; the check is made on the resolved path, so a
link planted inside the workspace cannot be used to reach out of it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .tool import RunContext, tool

MAX_READ = 200_000
MAX_LIST = 500


class OutsideWorkspace(Exception):
    pass


def confine(ctx: RunContext, path: str) -> Path:
    """The resolved path of `path` inside the workspace, or OutsideWorkspace."""
    if not path or path.strip() == "":
        path = "."
    if os.path.isabs(path) or path.startswith("~"):
        raise OutsideWorkspace(
            f"{path!r} is an absolute path; give a path relative to the workspace"
        )
    root = Path(ctx.workspace).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root):
        raise OutsideWorkspace(f"{path!r} leads outside the workspace; stay inside it")
    return target


def shown(ctx: RunContext, p: Path) -> str:
    rel = p.relative_to(Path(ctx.workspace).resolve())
    return str(rel) if str(rel) != "." else "."


@tool(idempotent=True)
def read_file(path: str, ctx: RunContext, offset: int = 0, limit: int = MAX_READ) -> str:
    """Read a text file in the workspace.

    Args:
        path: File path relative to the workspace.
        offset: Character offset to start reading at.
        limit: At most this many characters are returned.
    """
    target = confine(ctx, path)
    if not target.is_file():
        raise FileNotFoundError(f"no file {path!r} in the workspace")
    return page(target.read_text(errors="replace"), offset, limit)


def page(text: str, offset: int, limit: int) -> str:
    """`limit` characters of `text` from `offset`, saying how to read on if more follow."""
    limit = max(0, min(limit, MAX_READ))
    part = text[offset : offset + limit]
    rest = len(text) - offset - len(part)
    if rest > 0:
        part += f"\n[... {rest} more characters; read on with offset={offset + len(part)}]"
    return part


@tool(idempotent=True)
def write_file(path: str, content: str, ctx: RunContext) -> str:
    """Create or overwrite a text file in the workspace (parent directories are created).

    Args:
        path: File path relative to the workspace.
        content: The whole new content of the file.
    """
    target = confine(ctx, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"wrote {len(content)} characters to {shown(ctx, target)}"


@tool
def edit_file(
    path: str, old_text: str, new_text: str, ctx: RunContext, replace_all: bool = False
) -> str:
    """Replace an exact piece of text in a file. `old_text` must occur exactly once unless
    `replace_all` is true.

    Args:
        path: File path relative to the workspace.
        old_text: The exact text to replace, whitespace included.
        new_text: The text to put in its place.
        replace_all: Replace every occurrence instead of exactly one.
    """
    target = confine(ctx, path)
    if not target.is_file():
        raise FileNotFoundError(f"no file {path!r} in the workspace")
    if not old_text:
        raise ValueError("old_text is empty; give the exact text to replace")
    text = target.read_text()
    count = text.count(old_text)
    if count == 0:
        raise ValueError(f"old_text was not found in {path!r}; read the file and copy it exactly")
    if count > 1 and not replace_all:
        raise ValueError(
            f"old_text occurs {count} times in {path!r}; add context to make it unique "
            "or set replace_all"
        )
    target.write_text(text.replace(old_text, new_text))
    return f"replaced {count if replace_all else 1} occurrence(s) in {shown(ctx, target)}"


@tool(idempotent=True)
def list_files(ctx: RunContext, path: str = ".", recursive: bool = False) -> str:
    """List the files and directories under a directory of the workspace (directories end in /).

    Args:
        path: Directory relative to the workspace.
        recursive: Also list everything below it.
    """
    target = confine(ctx, path)
    if not target.is_dir():
        raise NotADirectoryError(f"no directory {path!r} in the workspace")
    root = Path(ctx.workspace).resolve()
    entries = sorted(target.rglob("*") if recursive else target.iterdir())
    lines = []
    for p in entries[:MAX_LIST]:
        rel = p.relative_to(root) if p.is_relative_to(root) else p
        lines.append(f"{rel}/" if p.is_dir() else str(rel))
    if len(entries) > MAX_LIST:
        lines.append(f"[... {len(entries) - MAX_LIST} more entries]")
    return "\n".join(lines) or "(empty)"
