"""A task's image built without Docker: its Dockerfile's steps run once, kept as a layer that
every trial of the task starts from.

Docker builds a task's image once and starts each trial from it. The sandbox's copy-on-write
root (`rootfs.py`) lets a build do the same over the host's system: the build is a sandbox of
its own with the host's network (so `apt-get install` and `pip install` reach their
registries; its trials have none), the Dockerfile's `COPY`/`ADD` and `RUN` applied in order,
each `RUN` with the environment, directory and user it has where it stands. What the build
wrote (each overlay's upper layer, and the root's own directory with `/app`) is kept in the
cache (`images()`), keyed by everything the build read (`key`); a trial mounts that layer
between its own and the host's, and starts from a copy of the image's root directory. A
second trial of the task builds nothing.

The host's system stands for the `FROM` image: a base that is not the host's system is
named in a warning (`base_differs`). A `RUN` that fails fails the trial at start, naming the
instruction with its output's tail; nothing half-built is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from .dockerfile import Image
from .rootfs import Root

LAYOUT = "2"
"""The layout of a kept image (its directories, the overlays' names): part of the key, so a
Tether that lays images out otherwise builds anew."""
HOST_STATE = ("/etc/os-release", "/var/lib/dpkg/status")
"""What says the host's system changed (a release, a package installed or upgraded): part of
the key, so an image is never laid over a system it was not built on."""


def images() -> Path:
    """Where built images are kept: `$XDG_CACHE_HOME/tether/harbor-images` (`~/.cache/...`),
    a directory only its owner enters (`building` keeps it 0700): a build's root may have
    made a setuid program in a layer, which no other local user must reach."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "tether" / "harbor-images"


def key(environment_dir: Path) -> str:
    """What a build reads, hashed: the build context's every file (the Dockerfile among them)
    by path and content, the host's system state, the layout."""
    digest = hashlib.sha256(f"tether-image {LAYOUT}\n".encode())
    for path in sorted(p for p in environment_dir.rglob("*") if not p.is_dir()):
        digest.update(str(path.relative_to(environment_dir)).encode() + b"\0")
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        digest.update(b"\0")
    for state in HOST_STATE:
        if os.path.exists(state):
            info = os.stat(state)
            digest.update(f"{state} {info.st_size} {info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


@contextlib.asynccontextmanager
async def building(into: Path) -> AsyncIterator[None]:
    """Hold the build of the image `into`, one process at a time: trials of one task started
    together build it once, the others wait, then find it built."""
    into.parent.mkdir(parents=True, exist_ok=True)
    into.parent.chmod(0o700)  # an image's layers hold what its build's root made: its own only
    lock = os.open(into.with_name(into.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # the lock goes with it


def os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    pairs = (line.partition("=") for line in text.splitlines() if "=" in line)
    return {k: v.strip().strip('"') for k, _, v in pairs}


def base_differs(base: str) -> str | None:
    """A warning when the Dockerfile's `FROM` is not the host's system, which the trial runs
    on instead (e.g. `FROM ubuntu:24.04` on a Debian 12 host); None when it names it."""
    release = os_release()
    host = f"{release.get('NAME', 'unknown')} {release.get('VERSION_ID', '')}".strip()
    name, _, tag = base.rpartition("/")[2].partition(":")
    same = name == release.get("ID") and any(
        tag.startswith(v) for v in (release.get("VERSION_ID"), release.get("VERSION_CODENAME")) if v
    )
    if not base or base == "scratch" or same:
        return None
    return f"FROM {base}: this host's system ({host}) is taken as the image's base"


CACHE_GB = 20.0
"""How much the kept images may hold together (`$TETHER_HARBOR_CACHE_GB`): past it, the least
recently used go first, after a build (an 8.3 GB entry once stayed for ever)."""


@dataclass(frozen=True)
class Kept:
    """A built image in the cache: its key, its size on disk, when a trial last used it."""

    path: Path
    size: int
    used: float

    @property
    def key(self) -> str:
        return self.path.name


def kept() -> list[Kept]:
    """The built images in the cache, least recently used first (a build still under way, or
    one a crash cut short, is not one)."""
    top = images()
    if not top.is_dir():
        return []
    found = [
        Kept(p, size_of(p), p.stat().st_mtime)
        for p in top.iterdir()
        if p.is_dir() and not p.is_symlink() and "." not in p.name
    ]
    return sorted(found, key=lambda k: k.used)


def size_of(top: Path) -> int:
    total = 0
    for folder, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def in_use(image: Path) -> int:
    """Hold `image` for a trial's life (a shared lock on `KEY.use`; the caller closes the
    descriptor it returns), noting the use (its cache entry's age is its last use): `evict`
    removes no image a trial's overlay is laid over."""
    fd = os.open(image.with_name(image.name + ".use"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    with contextlib.suppress(OSError):
        os.utime(image)
    return fd


def limit_bytes() -> int:
    value = os.environ.get("TETHER_HARBOR_CACHE_GB", "")
    try:
        gb = float(value) if value else CACHE_GB
    except ValueError:
        gb = CACHE_GB
    return int(gb * (1 << 30))


def evict(keep: Path | None = None, limit: int | None = None) -> list[Kept]:
    """Remove the least recently used images until the cache holds at most `limit` bytes
    (`limit_bytes()`; 0: all), never `keep` nor one a build or a start holds (its lock is
    taken); what was removed."""
    from .rootfs import remove

    limit = limit_bytes() if limit is None else limit
    entries = kept()
    total = sum(k.size for k in entries)
    removed = []
    for entry in entries:
        if total <= limit:
            break
        if entry.path == keep:
            continue
        locks = [
            os.open(entry.path.with_name(entry.key + end), os.O_RDWR | os.O_CREAT, 0o600)
            for end in (".lock", ".use")
        ]
        try:
            try:
                for lock in locks:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built, or a trial is laid over it
            remove(entry.path)
            total -= entry.size
            removed.append(entry)
        finally:
            for lock in locks:
                os.close(lock)
    return removed


BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}


def base_env(image: Image) -> dict[str, str]:
    """What every command starts with: a container's environment, and where the `FROM`
    image is not this host's system, what that image allows: pip may install into the
    system's Python (`PIP_BREAK_SYSTEM_PACKAGES`), as in a `python:*` image, where
    Debian's marks it externally managed (`RUN pip install` failed in 33 of 52 real
    tasks)."""
    if not base_differs(image.base):
        return dict(BASE_ENV)
    return {**BASE_ENV, "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_ROOT_USER_ACTION": "ignore"}


def base_commands(image: Image, rootfs: Root) -> None:
    """The commands a `python:*` image has that this host may not: `python` and `pip`, as
    links to the system's `python3` and `pip3` in the root's /usr/local/bin (a task failed
    on a missing `python`). Made in the layers before they are mounted."""
    name = image.base.rpartition("/")[2]
    if not name.startswith(("python:", "python@")) and name != "python":
        return
    for command, system in (("python", "python3"), ("pip", "pip3")):
        found = shutil.which(system, path="/usr/bin:/bin")
        at = rootfs.host_path(f"/usr/local/bin/{command}")
        if found is None or os.path.lexists(f"/usr/local/bin/{command}"):
            continue
        if not os.path.lexists(at):
            at.parent.mkdir(parents=True, exist_ok=True)
            at.symlink_to(found)
