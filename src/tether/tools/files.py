"""File tools confined to the run's workspace.

A path is taken relative to the workspace and opened one component at a time, each from a
descriptor of the directory before it and without following links (`O_NOFOLLOW`). A link is
followed by hand: its target takes its place in the path still to walk, and a `..` or an
absolute target that would leave the workspace is refused with an error that says so. The check
and the open are one act, so a directory swapped for a link between them cannot lead outside
(checking the resolved path and then opening it could be raced, and was: 158 escapes in 5,000
reads).

Only regular files are read or written: a FIFO would block a thread for ever, a device could be
endless. A file with another hard link is not written (its other name may be outside the
workspace). `read_file` reads from its offset and at most its limit, never the whole file;
`edit_file` edits files up to `MAX_EDIT` bytes.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Iterator

from .tool import RunContext, tool

MAX_READ = 200_000
MAX_LIST = 500
MAX_EDIT = 10_000_000
MAX_LINKS = 40
SKIP_CHUNK = 1 << 20
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class OutsideWorkspace(Exception):
    pass


class Opened:
    """A file or directory opened inside the workspace: its descriptor and its path there."""

    def __init__(self, fd: int, shown: str) -> None:
        self.fd, self.shown = fd, shown

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def open_in(
    ctx: RunContext, path: str, flags: int, *, make_parents: bool = False, mode: int = 0o644
) -> Opened:
    """Open `path` inside the workspace with `flags` (see the module docstring for how)."""
    if not path or not path.strip():
        path = "."
    if os.path.isabs(path) or path.startswith("~"):
        raise OutsideWorkspace(
            f"{path!r} is an absolute path; give a path relative to the workspace"
        )
    plain = os.path.normpath(path)
    if plain == ".." or plain.startswith("../"):
        raise OutsideWorkspace(f"{path!r} leads outside the workspace; stay inside it")
    root = os.path.realpath(ctx.workspace)
    left = parts_of(path)
    dirs = [os.open(root, os.O_RDONLY | DIRECTORY)]
    names: list[str] = []
    links = 0
    try:
        while left:
            name = left.pop(0)
            if name == "..":
                if len(dirs) == 1:
                    raise OutsideWorkspace(f"{path!r} leads outside the workspace; stay inside it")
                os.close(dirs.pop())
                names.pop()
                continue
            last = not left
            try:
                if last:
                    fd = os.open(name, flags | NOFOLLOW | NONBLOCK, mode, dir_fd=dirs[-1])
                    return Opened(fd, "/".join([*names, name]))
                dirs.append(open_dir(name, dirs[-1], make_parents))
                names.append(name)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                target = link_target(name, dirs[-1])
                if target is None:
                    raise
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, f"{path!r}: too many links") from None
                if os.path.isabs(target):
                    inside = os.path.relpath(target, root)
                    if inside == ".." or inside.startswith("../"):
                        raise OutsideWorkspace(
                            f"{path!r} leads outside the workspace (through a link); stay inside it"
                        ) from None
                    while len(dirs) > 1:
                        os.close(dirs.pop())
                    names.clear()
                    target = inside
                left = parts_of(target) + left
        return Opened(os.dup(dirs[-1]), "/".join(names) or ".")  # the path named a directory
    finally:
        for fd in dirs:
            os.close(fd)


def parts_of(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def open_dir(name: str, parent: int, make: bool) -> int:
    try:
        return os.open(name, os.O_RDONLY | DIRECTORY | NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        if not make:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        return os.open(name, os.O_RDONLY | DIRECTORY | NOFOLLOW, dir_fd=parent)


def link_target(name: str, parent: int) -> str | None:
    """Where the link `name` points, or None when it is not a link."""
    try:
        return os.readlink(name, dir_fd=parent)
    except OSError:
        return None


def regular(opened: Opened, path: str) -> os.stat_result:
    """The file's status, or an error when it is not a regular file."""
    st = os.fstat(opened.fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{path!r} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path!r} is not a regular file (a FIFO, socket or device); not touched")
    return st


def alone(st: os.stat_result, path: str, done: str) -> None:
    """Refuse a file that has another name: a hard link made in the workspace to a file
    outside it (`ln /etc/shadow notes`, by a command outside the sandbox) reads and writes
    that file, whatever its path says."""
    if st.st_nlink > 1:
        raise PermissionError(
            f"{path!r} has {st.st_nlink} hard links; one may be outside the workspace, so it "
            f"is not {done}"
        )


@contextlib.contextmanager
def opened_file(ctx: RunContext, path: str, flags: int, **kw: bool) -> Iterator[Opened]:
    """A regular file of the workspace, opened (a missing one is a clear error)."""
    try:
        f = open_in(ctx, path, flags, **kw)
    except FileNotFoundError:
        raise FileNotFoundError(f"no file {path!r} in the workspace") from None
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO opened to write, with no reader
            raise OSError(f"{path!r} is not a regular file (a FIFO); not touched") from None
        raise
    try:
        yield f
    finally:
        f.close()


@tool(idempotent=True)
def read_file(path: str, ctx: RunContext, offset: int = 0, limit: int = MAX_READ) -> str:
    """Read a text file in the workspace.

    Args:
        path: File path relative to the workspace.
        offset: Character offset to start reading at.
        limit: At most this many characters are returned.
    """
    with opened_file(ctx, path, os.O_RDONLY) as f:
        alone(regular(f, path), path, "read")
        os.set_blocking(f.fd, True)
        with open(os.dup(f.fd), encoding="utf-8", errors="replace", newline="") as text:
            return read_part(text, max(0, offset), max(0, min(limit, MAX_READ)))


def read_part(text: io.TextIOBase, offset: int, limit: int) -> str:
    """`limit` characters from `offset`, reading no more than that (and what lies before
    `offset`, a chunk at a time), saying how to read on if more follow."""
    skipped = 0
    while skipped < offset:
        got = len(text.read(min(SKIP_CHUNK, offset - skipped)))
        if not got:
            return f"[the file has {skipped} characters; nothing at offset {offset}]"
        skipped += got
    part = text.read(limit)
    if text.read(1):
        part += f"\n[... more follows; read on with offset={offset + len(part)}]"
    return part


def page(text: str, offset: int, limit: int) -> str:
    """`limit` characters of `text` from `offset`, saying how to read on if more follow."""
    limit = max(0, min(limit, MAX_READ))
    part = text[offset : offset + limit]
    rest = len(text) - offset - len(part)
    if rest > 0:
        part += f"\n[... {rest} more characters; read on with offset={offset + len(part)}]"
    return part


def overwrite(f: Opened, path: str, content: str) -> None:
    """Replace an opened regular file's content, unless another name shares it."""
    alone(regular(f, path), path, "written")
    os.set_blocking(f.fd, True)
    os.ftruncate(f.fd, 0)
    os.lseek(f.fd, 0, os.SEEK_SET)
    data = content.encode()
    view = memoryview(data)
    while view:
        view = view[os.write(f.fd, view) :]


@tool(idempotent=True)
def write_file(path: str, content: str, ctx: RunContext) -> str:
    """Create or overwrite a text file in the workspace (parent directories are created).

    Args:
        path: File path relative to the workspace.
        content: The whole new content of the file.
    """
    with opened_file(ctx, path, os.O_WRONLY | os.O_CREAT, make_parents=True) as f:
        overwrite(f, path, content)
        return f"wrote {len(content)} characters to {f.shown}"


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
    if not old_text:
        raise ValueError("old_text is empty; give the exact text to replace")
    with opened_file(ctx, path, os.O_RDWR) as f:
        st = regular(f, path)
        if st.st_size > MAX_EDIT:
            raise ValueError(
                f"{path!r} is {st.st_size} bytes; edit_file edits files up to {MAX_EDIT} bytes"
            )
        os.set_blocking(f.fd, True)
        with open(os.dup(f.fd), "rb") as raw:
            text = raw.read(MAX_EDIT + 1).decode("utf-8", "replace")
        count = text.count(old_text)
        if count == 0:
            raise ValueError(
                f"old_text was not found in {path!r}; read the file and copy it exactly"
            )
        if count > 1 and not replace_all:
            raise ValueError(
                f"old_text occurs {count} times in {path!r}; add context to make it unique "
                "or set replace_all"
            )
        overwrite(f, path, text.replace(old_text, new_text))
        return f"replaced {count if replace_all else 1} occurrence(s) in {f.shown}"


@tool(idempotent=True)
def list_files(ctx: RunContext, path: str = ".", recursive: bool = False) -> str:
    """List the files and directories under a directory of the workspace (directories end in /).

    Args:
        path: Directory relative to the workspace.
        recursive: Also list everything below it.
    """
    try:
        d = open_in(ctx, path, os.O_RDONLY | DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        raise NotADirectoryError(f"no directory {path!r} in the workspace") from None
    try:
        if not stat.S_ISDIR(os.fstat(d.fd).st_mode):
            raise NotADirectoryError(f"no directory {path!r} in the workspace")
        entries = sorted(entries_of(d, recursive))
    finally:
        d.close()
    lines = entries[:MAX_LIST]
    if len(entries) > MAX_LIST:
        lines.append(f"[... {len(entries) - MAX_LIST} more entries]")
    return "\n".join(lines) or "(empty)"


def entries_of(d: Opened, recursive: bool) -> list[str]:
    """The directory's entries as workspace paths (directories end in /); links are listed,
    never followed."""
    prefix = "" if d.shown == "." else d.shown + "/"
    if not recursive:
        with os.scandir(d.fd) as it:
            return [prefix + e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in it]
    out: list[str] = []
    for top, dirs, files, _fd in os.fwalk(".", dir_fd=d.fd):
        base = prefix + ("" if top == "." else top[2:] + "/")
        out += [base + n + "/" for n in dirs]
        out += [base + n for n in files]
    return out
