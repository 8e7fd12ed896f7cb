"""A trial's root, copy-on-write over the host's: what a container's file system is to a task.

A task written for Docker writes where a container lets it: `pip install` into /usr/local,
`useradd` into /etc, a tool into /opt, `mv /tests /tmp/hidden` to hide its tests. Read-only
mounts of the host failed all of these. Here each of the host's system directories (`SYSTEM`,
and `/var`) is the lower layer of a kernel overlay whose upper layer is the trial's
own (`upper/`, beside the trial's other files): a write lands there, the host never changes, and
the whole goes with the trial. Everything else is one directory on disk (`fs/`), which becomes
the sandbox's `/`: `/app`, `/tests`, `/solution`, `/logs`, `/tmp` and the homes are ordinary
directories in it, as in a container (a rename of `/tests` works; the host reads and writes them
in place, which is how uploads and downloads reach them).

What the read-only view hid stays hidden, now by the upper layer: `/etc`'s secrets are empty
files there (writable: `useradd` rewrites `/etc/shadow`), its secret directories and the
services' state in `/var` are opaque directories (the host's contents are not merged in), and
the package managers' state is merged back over them (`dpkg -l` and `apt` work).

Made in two steps, because bubblewrap 0.8 cannot mount an overlay: bubblewrap makes the
namespaces, shows the host's directories read-only under `/.host` and the trial's directory at
`/.trial`, keeping three capabilities of its user namespace; then `ROOT_SCRIPT` (Python's
standard library only) mounts the overlays, moves into `fs/` with `pivot_root` (the old root,
`/.host` with it, is detached), drops every capability, bounding set included (but for a
container's, `CONTAINER_CAPABILITIES`, where the trial's users are mapped), and becomes the
trial's first process. Overlayfs in a user namespace needs Linux 5.11; where it cannot be
mounted the trial fails at start saying so.

The three capabilities are the user namespace's, never the host's: `CAP_SYS_ADMIN` to mount,
`CAP_DAC_OVERRIDE` for overlayfs to make its work directory, `CAP_SETPCAP` to empty the bounding
set before the task's first command (without it, root in the sandbox would get `CAP_SYS_ADMIN`
back at its next `exec`, and could unmount what hides the host).

Users: run by root, a trial maps the host's first `USERS` ids, each to itself, so a user the
task adds can be switched to (`[agent] user`, `su`, `setpriv`), as in a container; bubblewrap
waits while Tether writes the map (`map_users`). Run by an ordinary user, only that user is
mapped, as root: a command asked to run as another user fails saying so.

Measured (`bench/harbor_start.py`): see the docs' benchmarks page.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..tools.sandbox import SECRET_DIRS, SECRETS, SYSTEM

SHOWN = ("/var",)
"""What a trial sees of the host beyond the system's directories: /var as a system has it
(its logs, caches, package state). Not `/opt`, which the image a `FROM` names has empty: the
host's (8 GB here) was in every trial and every built image, and a task's `find /opt -exec
touch` copied all of it into a cache entry. Not the users' homes, `/srv`,
`/mnt`, `/media` or any other top-level directory, where a store or a secret may be kept: a
task written for a container needs a system, not the host's data."""
SERVICE_STATE = ("/var/lib", "/var/backups", "/var/mail", "/var/spool")
"""Inside /var, what services keep (databases, stores, mail, queued jobs): hidden, but for the
package managers' state (`PACKAGE_STATE`), which `dpkg -l` and `apt` read."""
PACKAGE_STATE = ("/var/lib/dpkg", "/var/lib/apt")
HOMES = ("/root", "/home")
EMPTY = ("/srv", "/mnt", "/media", "/opt")
"""Directories an image has, empty: the host's are not shown (a store may be kept there)."""
CAPABILITIES = ("CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE", "CAP_SETPCAP")
CONTAINER_CAPABILITIES = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_NET_BIND_SERVICE": 10,
    "CAP_AUDIT_WRITE": 29,
}
"""What root keeps in a trial whose users are mapped (`USERS`), as in a container: to own files
and change user (`su`, `setpriv`, apt's drop to `_apt`). Each is its user namespace's; none
mounts, and `CAP_SYS_ADMIN` is never among them."""
USERS = 65536
"""How many of the host's ids a trial maps, each to itself, when Tether runs as root: the
users and groups a task adds (`useradd`) are there to switch to. An ordinary user may map only
itself (without `newuidmap`): its trial has one user, root, and keeps no capability."""
OPAQUE = "user.overlay.opaque"
"""The mark of an upper directory that hides the lower one's contents (overlayfs's `userxattr`
mode, the one a user namespace may mount)."""

ROOT_SCRIPT = r"""
import ctypes, json, os, platform, sys

libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, MNT_DETACH = 24, 47, 2, 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


def check(result, what):
    if result != 0:
        sys.stderr.write(f"the trial's root: {what}: {os.strerror(ctypes.get_errno())}\n")
        sys.exit(1)


def mount(source, target, fstype, flags, data=None):
    check(libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags,
                     data and data.encode()), f"mount {target}")


class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


spec = json.loads(sys.argv[1])
root = spec["root"]
mount(root, root, None, MS_BIND | MS_REC)  # pivot_root's new root must be a mount
for target, lower, upper, work in spec["overlays"]:
    os.makedirs(root + target, exist_ok=True)
    mount("overlay", root + target, "overlay", 0,
          f"lowerdir={lower},upperdir={upper},workdir={work},userxattr")
for target, link in spec["links"]:
    if not os.path.lexists(root + target):
        os.symlink(link, root + target)
for source, target in spec["binds"]:
    os.makedirs(root + target, exist_ok=True)
    mount(source, root + target, None, MS_BIND | MS_REC)
for source, target in spec["read_only"]:
    os.makedirs(root + target, exist_ok=True)
    mount(source, root + target, None, MS_BIND | MS_REC)
    mount("none", root + target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
for target in spec["tmpfs"]:
    os.makedirs(root + target, exist_ok=True)
    mount("tmpfs", root + target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
os.chdir(root)
check(libc.syscall(PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
check(libc.umount2(b".", MNT_DETACH), "detach the host's view")
os.chdir(spec["cwd"])
for cap in range(64):
    if cap not in spec["keep"]:  # past the last one: EINVAL, nothing to drop
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
kept = sum(1 << cap for cap in spec["keep"])  # in effect, permitted and inheritable (32 + 32)
sets = (ctypes.c_uint32 * 6)(kept & 0xFFFFFFFF, kept & 0xFFFFFFFF, kept & 0xFFFFFFFF,
                             kept >> 32, kept >> 32, kept >> 32)
check(libc.capset(ctypes.byref(Header(0x20080522, 0)), sets), "capset")
for cap in spec["keep"]:  # ambient: kept across exec (bubblewrap's securebits drop root's)
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0), "keep a capability")
os.execv(spec["argv"][0], spec["argv"])
"""


@dataclass
class Root:
    """The trial's root in the trial's directory `trial`: `fs/` (the sandbox's `/`), `upper/`
    and `work/` (one overlay's layers per host directory). Made by `prepare`, mounted by
    `ROOT_SCRIPT` inside the sandbox, removed with the trial's directory."""

    trial: Path
    image: Path | None = None
    """A built image (`build.py`): its layers lie between the trial's and the host's, and its
    root directory is the trial's first."""
    overlays: dict[str, str] = field(default_factory=dict)
    """Each container path mounted as an overlay, longest first, and its layers' name."""
    links: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path in (*SYSTEM, *SHOWN):
            if os.path.islink(path):
                self.links[path] = os.readlink(path)
            elif os.path.isdir(path):
                self.overlays[path] = path.strip("/")
        if "/var" in self.overlays:
            for path in PACKAGE_STATE:
                if os.path.isdir(path):
                    self.overlays[path] = path.strip("/").replace("/", "-")
        self.overlays = dict(sorted(self.overlays.items(), key=lambda kv: -len(kv[0])))

    @property
    def fs(self) -> Path:
        return self.trial / "fs"

    def upper(self, path: str) -> Path:
        return self.trial / "upper" / self.overlays[path]

    def overlay_of(self, path: str) -> str | None:
        """The overlay a container path is in, if it is in one."""
        return next((o for o in self.overlays if path == o or path.startswith(o + "/")), None)

    def host_path(self, path: str) -> Path:
        """Where the container's absolute `path` is on the host before the sandbox starts: in
        `fs/`, or in its overlay's upper layer (a file put there is a layer under the task's
        writes, as an image's files are; once the overlay is mounted the upper layer is the
        kernel's, and files reach it through the sandbox instead)."""
        overlay = self.overlay_of(path)
        if overlay is None:
            return self.fs / path.lstrip("/")
        return self.upper(overlay) / path[len(overlay) :].lstrip("/")

    def prepare(self) -> None:
        """The layers and masks on disk: each overlay's upper and work directory, empty files
        over `/etc`'s secrets, opaque directories over its secret directories and the
        services' state, and the container's own directories in `fs/`. A trial of a built
        image starts from a copy of the image's root directory, owners kept, and the image's
        layers already hold the masks (its build had them)."""
        for path in self.overlays:
            self.upper(path).mkdir(parents=True, exist_ok=True)
            (self.trial / "work" / self.overlays[path]).mkdir(parents=True, exist_ok=True)
        if self.image is not None:
            self.fs.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", f"{self.image / 'fs'}/.", str(self.fs)], check=True)
            return
        for secret in SECRETS:
            if os.path.exists(secret) and self.overlay_of(secret):
                hidden = self.host_path(secret)
                hidden.parent.mkdir(parents=True, exist_ok=True)
                hidden.touch(mode=0o600)
        for directory in (*SECRET_DIRS, *SERVICE_STATE):
            if os.path.isdir(directory) and self.overlay_of(directory):
                hidden = self.host_path(directory)
                hidden.mkdir(parents=True, exist_ok=True)
                os.setxattr(hidden, OPAQUE, b"y")
        for empty in (*HOMES, *EMPTY):
            (self.fs / empty.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (self.fs / "root").chmod(0o700)
        (self.fs / "tmp").mkdir(exist_ok=True)
        (self.fs / "tmp").chmod(0o1777)

    def bwrap_args(self, users: bool) -> list[str]:
        """bubblewrap's part: each overlaid host directory read-only under `/.host`, the
        trial's directory at `/.trial`, and the capabilities `ROOT_SCRIPT` needs (its
        namespace's; it drops them, but for a container's when `users` are mapped)."""
        keep = CONTAINER_CAPABILITIES if users else {}
        argv = ["--cap-drop", "ALL"]
        argv += [a for cap in sorted({*CAPABILITIES, *keep}) for a in ("--cap-add", cap)]
        argv += [a for path in self.overlays if path not in PACKAGE_STATE
                 for a in ("--ro-bind", path, "/.host" + path)]  # fmt: skip
        if self.image is not None:
            argv += ["--ro-bind", str(self.image), "/.image"]
        return [*argv, "--bind", str(self.trial), "/.trial"]

    def lower(self, path: str) -> str:
        """An overlay's lower layers, top first: the image's (if it wrote there), the host's."""
        name = self.overlays[path]
        if self.image is not None and (self.image / "upper" / name).is_dir():
            return f"/.image/upper/{name}:/.host{path}"
        return "/.host" + path

    def keep_as(self, image: Path) -> None:
        """Keep what a build wrote as the image `image`: its layers and root directory (the
        overlays' work directories are the kernel's scratch, and go)."""
        remove(self.trial / "work")
        os.rename(self.trial, image)

    def spec(self, argv: list[str], cwd: str, read_only: list[str], users: bool) -> str:
        """`ROOT_SCRIPT`'s argument: its mounts in order (the package state's overlays after
        /var's), then the command it becomes, run from `cwd`. `read_only` are host paths the
        command needs that no overlay shows (an interpreter's prefix), bound where they are;
        with `users` mapped, root keeps a container's capabilities."""
        overlays = [
            [path, self.lower(path), f"/.trial/upper/{name}", f"/.trial/work/{name}"]
            for path, name in reversed(self.overlays.items())
        ]
        tmpfs = ["/run"] + (["/var/run"] if not os.path.islink("/var/run") else [])
        return orjson.dumps(
            {
                "root": "/.trial/fs",
                "overlays": overlays,
                "links": list(self.links.items()),
                "binds": [["/proc", "/proc"], ["/dev", "/dev"]],
                "read_only": [[p, p] for p in read_only],
                "tmpfs": tmpfs,
                "cwd": cwd,
                "keep": list(CONTAINER_CAPABILITIES.values()) if users else [],
                "argv": argv,
            }
        ).decode()


def remove(trial: Path) -> None:
    """Remove a trial's directory: overlayfs leaves its work directories without permissions
    (`d---------`), which an ordinary user must open before removing what is inside."""

    def opened(function: object, path: str, error: BaseException) -> None:
        parent = os.path.dirname(path)
        try:
            os.chmod(parent, 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass

    shutil.rmtree(trial, onexc=opened)


def map_users(pid: int) -> None:
    """Map `USERS` of the host's ids, each to itself, into the user namespace of bubblewrap's
    process `pid`, which waits for it (`--userns-block-fd`). Root only."""
    for kind in ("uid_map", "gid_map"):
        Path(f"/proc/{pid}/{kind}").write_text(f"0 0 {USERS}\n")


def map_users_told(info_fd: int) -> None:
    """`map_users` once bubblewrap has told its pid on the pipe `info_fd` (it tells nothing
    when it failed before making its namespace: its stderr then says why)."""
    info = read_all(info_fd)
    if info:
        map_users(orjson.loads(info)["child-pid"])


def read_all(fd: int) -> bytes:
    """Everything written to the pipe `fd` until its writer closes it."""
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def visible(path: str) -> bool:
    """Whether `path` is in what the sandbox shows of the host."""

    def under(roots: tuple[str, ...]) -> bool:
        return any(path == r or path.startswith(r + "/") for r in roots)

    shown = under(tuple(os.path.realpath(p) for p in SYSTEM) + SHOWN)
    return shown and (not under(SERVICE_STATE) or under(PACKAGE_STATE))
