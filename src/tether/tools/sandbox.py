"""bash inside bubblewrap, a boundary rather than a convention: on by default where bubblewrap
works (`--sandbox` requires it, `--no-sandbox` turns it off; see `for_options`).

A sandboxed call sees the system's directories read-only (`SYSTEM`, with `/etc`'s secrets
hidden), its workspace read-write, and a private `/tmp` and home; nothing else of the host
(no users' homes, no stores); it has no network unless `net` is set; it runs in PID, IPC and
UTS namespaces of its own, so every process it starts dies with it (the namespace's first
process is bubblewrap's, and when it goes the kernel kills the rest, whatever they did to
their session or environment); it holds no capability, for root too, and no host Unix socket
(see `hardening`); it makes no file setuid or setgid (`seccomp.py`: as root such a file on
the host's disk was a way to root for every local user); its environment is bash's clean one
(see `bash.py`); its address space and CPU time are bounded. Where bubblewrap is missing or
cannot make namespaces here, asking for the sandbox (`--sandbox`) is an error at start, and a
call never runs unsandboxed instead; by default bash then runs unsandboxed, and a line at start
says so.

Not bounded: the number of processes (`RLIMIT_NPROC` counts a user's processes machine-wide,
and a cgroup needs privileges the CLI should not ask for); the PID namespace still ends them
all with the call.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ..errors import ConfigError
from .seccomp import descriptor as filter_descriptor


@dataclass(frozen=True)
class Sandbox:
    net: bool = False
    """Share the host's network (off: the call has only its own loopback)."""
    memory_mb: int = 4096
    """The most address space a process may map (`RLIMIT_AS`)."""
    cpu_seconds: int = 600
    """The most CPU time a process may use (`RLIMIT_CPU`)."""
    protect: tuple[str, ...] = ()
    """Files read-only inside the sandbox where they are in its workspace: the run's tools and
    guardrails files, which the next `tether` process imports unsandboxed, with the keys (a
    sandboxed command rewrote one there). Bound over themselves, they cannot be written,
    replaced, renamed or removed from inside."""

    def argv(self, command: str, workspace: str, seccomp: int) -> list[str]:
        """The command line that runs `command` with bash in the sandbox, under the limits:
        a first bash sets them, then becomes the bash that runs `command` (exactly as
        `bash -c COMMAND`). Set there rather than in the child before it becomes bubblewrap
        (`preexec_fn`), which made Python fork the whole interpreter for every call instead
        of spawning: +12.4 ms a call over a plain one then, +8.1 to +9.3 ms now
        (`bench/sandbox_cost.py`). `seccomp` is a descriptor of `filter_descriptor()`'s,
        passed to the process (no file is made setuid or setgid)."""
        net = ["--share-net"] if self.net else []
        limits = f"ulimit -v {self.memory_mb << 10} -t {self.cpu_seconds}"
        return [
            bwrap(),
            *system_view(),
            *hardening(),
            "--seccomp", str(seccomp),
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--tmpfs", "/var/tmp",
            "--tmpfs", os.path.expanduser("~"),
            "--bind", workspace, workspace,
            *self.protected(workspace),
            "--chdir", workspace,
            "--unshare-all", *net,
            "--die-with-parent",
            "--new-session",
            "--",
            "bash", "-c", f'{limits}; exec bash -c "$1"', "bash", command,
        ]  # fmt: skip

    def protected(self, workspace: str) -> list[str]:
        """bubblewrap's read-only binds of `protect`'s files that are in `workspace` (those
        elsewhere the sandbox does not see)."""
        top = os.path.realpath(workspace)
        inside = [os.path.realpath(p) for p in self.protect]
        inside = [p for p in inside if p.startswith(top + os.sep) and os.path.isfile(p)]
        return [a for p in inside for a in ("--ro-bind", p, p)]


SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""What a sandboxed command sees of the host, read-only: the programs and their libraries,
and the system's configuration. Not the users' homes, Tether's data directory and stores,
`/opt`, `/srv`, `/var` or `/mnt`: a command could read other runs' transcripts in a store, or
`~/.ssh`, as it could everything its user can."""
SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
"""Files of `/etc` hidden all the same (root could read them)."""
SECRET_DIRS = ("/etc/sudoers.d", "/etc/ssh", "/etc/ssl/private")


@functools.cache
def system_view() -> tuple[str, ...]:
    """bubblewrap's arguments for `SYSTEM`, the way this host has it (a merged /usr has
    /bin and /lib as links), with `SECRETS` over-mounted by an empty file and `SECRET_DIRS`
    by an empty directory. Looked at once a process."""
    argv: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return (*argv, *secrets_hidden())


def secrets_hidden() -> list[str]:
    """bubblewrap's arguments that cover `/etc`'s secrets: each of `SECRETS` by an empty
    file, each of `SECRET_DIRS` by an empty directory (bash's sandbox and Harbor's)."""
    files = [a for f in SECRETS if os.path.exists(f) for a in ("--ro-bind", "/dev/null", f)]
    return files + [a for d in SECRET_DIRS if os.path.isdir(d) for a in ("--tmpfs", d)]


def hardening() -> list[str]:
    """What bash's sandbox adds (Harbor's does the same in its root's first step,
    `harbor/rootfs.py`). `--cap-drop ALL`: bubblewrap keeps every
    capability for uid 0 unless told, and as root a command could then `mount -o remount,rw /`
    and write anywhere on the host, or unmount `/proc` and see the host's processes. An empty
    `/run` (and `/var/run` where it is a directory of its own): the host's Unix sockets live
    there (Postgres, Docker, D-Bus, the user's runtime directory), and a connect to one is a
    way out that no network namespace closes."""
    argv = ["--cap-drop", "ALL", "--tmpfs", "/run"]
    if os.path.isdir("/var/run") and not os.path.islink("/var/run"):
        argv += ["--tmpfs", "/var/run"]
    return argv


def bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise ConfigError(
            "--sandbox needs bubblewrap (apt-get install bubblewrap); nothing was run unsandboxed"
        )
    return found


@functools.cache
def check(net: bool) -> None:
    """Fail now, with the reason, if bubblewrap cannot make this sandbox here (once a process:
    a user-namespace or mount restriction would otherwise fail every call)."""
    sandbox = Sandbox(net=net)
    fd = filter_descriptor()
    try:
        done = subprocess.run(
            sandbox.argv("true", "/", fd), capture_output=True, text=True, timeout=30,
            pass_fds=(fd,),
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"--sandbox: bubblewrap did not run: {e}") from None
    finally:
        os.close(fd)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no reason given"
        raise ConfigError(f"--sandbox: bubblewrap cannot make a sandbox here: {why}")


def for_options(wanted: bool | None, net: bool, protect: tuple[str, ...] = ()) -> Sandbox | None:
    """The sandbox bash runs in: with `wanted` True (`--sandbox`) bubblewrap, or an error now
    if it cannot make one here; False (`--no-sandbox`) none; None (the default) bubblewrap
    where it works, else none, said once a process in one line on stderr."""
    if wanted is False:
        return None
    if wanted:
        check(net)
        return Sandbox(net=net, protect=protect)
    why = unavailable(net)
    if why is None:
        return Sandbox(net=net, protect=protect)
    say_unsandboxed(why)
    return None


@functools.cache
def unavailable(net: bool) -> str | None:
    """Why bubblewrap cannot make a sandbox here (None: it can); tried once a process."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    try:
        check(net)
    except ConfigError as e:
        return str(e).removeprefix("--sandbox: ")
    return None


@functools.cache
def say_unsandboxed(why: str) -> None:
    print(
        f"tether: bash runs unsandboxed: {why}; --sandbox makes this an error, --no-sandbox "
        "says you mean it",
        file=sys.stderr,
        flush=True,
    )
