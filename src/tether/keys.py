"""Keys out of the tools' reach: what the `tether` process does so that a command it runs cannot
read the keys it holds.

bash gets a clean environment (`tools.bash.environment`), but the `tether` process itself holds
every key it was started with: in its environment, which any process of the same user reads at
`/proc/PID/environ`, and in its memory (`/proc/PID/mem`, a debugger). A model told by a web page
to "print your environment" would run `cat /proc/$PPID/environ`. So the command makes itself
non-dumpable (`PR_SET_DUMPABLE` 0): the kernel then lets no process of the same user read its
environment, memory or open files, unless it holds `CAP_SYS_PTRACE`. Root holds that, so a
`tether` running as root also drops it (and `CAP_SYS_RAWIO`, which reads memory through
`/dev/mem`, and `CAP_SYS_MODULE`) from the capabilities any program it starts can have (the
bounding set); it keeps the rest, which bubblewrap needs to sandbox a command as root. Root
without them still reads a non-dumpable process's `/proc/PID/environ` (Linux 6.18 here), so the
process also clears the block that file shows: the environment it was started with, at the top
of its stack. Its variables live on in copies the C library makes (`putenv`), which
`os.environ` and every library still read; only the start-up block is cleared.

What stays out of reach here: another root process, or the user's own shell that started
`tether` with the keys in its environment. The sandbox (`--sandbox`) shows a command no other
process at all. This changes the process for good, so the `tether` commands do it; a program
that embeds a `Runtime` decides for itself (`protect_process`).
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
DROPPED = {"CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_PTRACE": 19}
"""The capabilities that read another process's memory or the machine's: out of the bounding
set, no program `tether` starts can have them, even as root."""


def protect_process() -> list[str]:
    """Make this process's environment and memory unreadable to the commands it starts (Linux;
    elsewhere nothing is done). Returns what was done, for a log line."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return []
    done: list[str] = []
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
        done.append("not dumpable")
    if clear_startup_environment():
        done.append("its start-up environment cleared")
    if os.geteuid() == 0:
        for name, number in DROPPED.items():
            if libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0) == 0:
                done.append(f"no {name} for its children")
    return done


def clear_startup_environment() -> bool:
    """Zero the environment block the process was started with (what `/proc/PID/environ`
    reads), once every variable has a copy of the C library's own, so that nothing points
    into the block any more."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()  # from field 3, the state, on
        start, end = int(fields[47]), int(fields[48])  # fields 50 and 51: env_start, env_end
    except (OSError, ValueError, IndexError):
        return False
    if not 0 < start < end:
        return False
    for name, value in os.environb.items():
        os.putenv(name, value)  # setenv: the C library's environ now points at its copies
    ctypes.memset(start, 0, end - start)
    return True
