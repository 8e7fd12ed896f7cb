"""Files between the host and a trial's root, with no link of the trial's ever followed.

A trial's root is a directory on the host that the processes inside the sandbox write as they
please, as root of their namespace. Opened on the host by name, a path in it follows whatever
links they made: `ln -s /etc/shadow /app/x` made the host's read of `/app/x` return the host's
`/etc/shadow`, a write through such a link wrote any host file, and a download of `/logs`
copied whatever its links named into the job's output. So the host never opens a trial's path
by name: it walks it one component at a time from a descriptor of the root, each opened with
`O_NOFOLLOW` (a link in the way is an error, never followed), and what it copies keeps the
trial's links as links. A copy that should follow a link (reading a file through one) is made
inside the sandbox first, where a link reaches only the trial's own files (`sandbox.py`).

What the host writes is its own: files are created by this process (so they are the caller's,
whatever owner they had inside) with their permission bits only, never setuid, setgid or sticky
(a root-run trial may `chmod 4755` a copy of bash; out through a download it was a setuid-root
program any local user ran as root). Devices, fifos and sockets are not copied.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PERMISSIONS = 0o777
"""The mode bits a copy keeps: read, write and execute; never setuid, setgid or sticky."""
DEPTH = 256
"""Directories deeper than this are refused rather than walked (each level holds two
descriptors while it is copied)."""


def parts(relative: str) -> list[str]:
    """The components of a path inside a root; `..` is refused (a caller normalises first)."""
    names = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in names:
        raise ValueError(f"{relative}: '..' is not followed out of the trial's root")
    return names


def refused_link(error: OSError, name: str, at: int, whole: str) -> OSError:
    """The error for a component that could not be opened: said plainly when it is a link."""
    if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=at, follow_symlinks=False).st_mode):
                return OSError(
                    errno.ELOOP, f"{whole}: {name} is a link, which is not followed here"
                )
    return error


@contextlib.contextmanager
def directory(root: Path, relative: str, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory `relative` in `root`, every component opened without
    following a link (and made, with `create`)."""
    fd = os.open(root, DIRECTORY)
    try:
        for name in parts(relative):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            try:
                inner = os.open(name, DIRECTORY, dir_fd=fd)
            except OSError as e:
                raise refused_link(e, name, fd, relative) from None
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def copy_entry(
    source_dir: int, name: str, target_dir: int, target_name: str, where: str | None
) -> None:
    """Copy the entry `name` of the directory `source_dir` to `target_name` in `target_dir`:
    a directory with what it holds, a file with its data, a link as a link. Both sides are
    reached by descriptor, so neither follows a link; what was in the target's place goes
    (a directory's contents are merged into one that is there, as `cp -a dir/.` merges).

    `where` is the entry's directory within the copy on its way out of a trial ("" for the
    copy's top, which may not be a link): a link that may lead outside the copy (`leads_out`)
    is left out, as Python's `tarfile` leaves it out of an archive unpacked as data, since
    whatever reads the copy on the host (Harbor reading `reward.txt`) would follow it there.
    None (into a trial): every link goes, to be followed inside it."""
    info = os.stat(name, dir_fd=source_dir, follow_symlinks=False)
    mode = stat.S_IMODE(info.st_mode) & PERMISSIONS
    if stat.S_ISLNK(info.st_mode):
        link = os.readlink(name, dir_fd=source_dir)
        if where == "":
            raise OSError(errno.ELOOP, f"{name} is a link, which is not followed here")
        if where is not None and leads_out(link):
            return
        make_room(target_dir, target_name)
        os.symlink(link, target_name, dir_fd=target_dir)
    elif stat.S_ISREG(info.st_mode):
        copy_file(source_dir, name, target_dir, target_name, mode)
    elif stat.S_ISDIR(info.st_mode):
        inner_where = where and posixpath.join(where, target_name)  # "" (the top): "."
        inner_where = "." if where == "" else inner_where
        if inner_where is not None and inner_where.count("/") >= DEPTH:
            raise OSError(errno.ELOOP, f"{name}: directories deeper than {DEPTH} levels")
        inner = os.open(name, DIRECTORY, dir_fd=source_dir)
        try:
            into = opened_directory(target_dir, target_name)
            try:
                copy_children(inner, into, inner_where)
                os.chmod(into, mode | 0o700)  # its owner may go on writing into it
            finally:
                os.close(into)
        finally:
            os.close(inner)
    # a device, a fifo or a socket: not copied


def copy_children(source_dir: int, target_dir: int, where: str | None) -> None:
    """Every entry of the directory `source_dir` into `target_dir` (`copy_entry`'s)."""
    for child in sorted(os.listdir(source_dir)):
        copy_entry(source_dir, child, target_dir, child, where)


def leads_out(link: str) -> bool:
    """Whether a link may name something outside the copy it is in: an absolute one, or one
    with `..` in it (lexically inside, `d/../x` leaves the copy where `d` is a link to `.`).
    A link down from where it is, through links that go down too, stays inside."""
    return link.startswith("/") or ".." in link.split("/")


def copy_file(source_dir: int, name: str, target_dir: int, target_name: str, mode: int) -> None:
    try:
        source = os.open(name, READ, dir_fd=source_dir)
    except OSError as e:
        raise refused_link(e, name, source_dir, name) from None
    try:
        info = os.fstat(source)
        if not stat.S_ISREG(info.st_mode):  # swapped since it was looked at
            return
        make_room(target_dir, target_name)
        target = os.open(target_name, WRITE, 0o600, dir_fd=target_dir)
        try:
            while chunk := os.read(source, 1 << 20):
                os.write(target, chunk)
            os.chmod(target, mode)
            os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(target)
    finally:
        os.close(source)


def make_room(directory_fd: int, name: str) -> None:
    """Remove what is at `name` unless it is a directory (a file or link is replaced)."""
    try:
        info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"{name} is a directory")
    os.unlink(name, dir_fd=directory_fd)


def opened_directory(parent: int, name: str) -> int:
    """The directory `name` in `parent`, made if missing, a file or link there replaced."""
    try:
        return os.open(name, DIRECTORY, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=parent)
    os.mkdir(name, 0o700, dir_fd=parent)
    return os.open(name, DIRECTORY, dir_fd=parent)


def split(relative: str) -> tuple[str, str]:
    names = parts(relative)
    if not names:
        raise ValueError(f"{relative!r}: names no entry")
    return "/".join(names[:-1]), names[-1]


def copy_out(root: Path, relative: str, target: Path, contents: bool = False) -> None:
    """Copy `relative` in the trial's `root` to the host path `target` (made by this process,
    the caller's); with `contents`, a directory's entries into `target` (made if missing)."""
    parent, name = split(relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    with directory(root, parent) as source_dir:
        host = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not contents:
                return copy_entry(source_dir, name, host, target.name, "")
            try:
                inner = os.open(name, DIRECTORY, dir_fd=source_dir)
            except OSError as e:
                raise refused_link(e, name, source_dir, relative) from None
            try:
                into = opened_directory(host, target.name)
                try:
                    copy_children(inner, into, ".")
                finally:
                    os.close(into)
            finally:
                os.close(inner)
        finally:
            os.close(host)


def copy_in(source: Path, root: Path, relative: str, contents: bool = False) -> None:
    """Copy the host path `source` to `relative` in the trial's `root` (its parents made, no
    link of the trial's followed on the way: one in the way is an error); the source's own
    links go as links. With `contents`, a directory's entries into `relative`."""
    parent, name = split(relative)
    host = os.open(source.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with directory(root, parent, create=True) as target_dir:
            if not contents:
                return copy_entry(host, source.name, target_dir, name, None)
            inner = os.open(source.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=host)
            try:
                try:
                    into = os.open(name, DIRECTORY, dir_fd=target_dir)
                except FileNotFoundError:
                    os.mkdir(name, 0o755, dir_fd=target_dir)
                    into = os.open(name, DIRECTORY, dir_fd=target_dir)
                except OSError as e:
                    raise refused_link(e, name, target_dir, relative) from None
                try:
                    copy_children(inner, into, None)
                finally:
                    os.close(into)
            finally:
                os.close(inner)
    finally:
        os.close(host)
