"""The seccomp filter of bash's sandbox: no command makes a file setuid or setgid.

Run as root, a sandboxed command is uid 0 with every capability dropped, yet it still owns
what it creates: `cp /bin/bash ./rb && chmod 4755 ./rb` left a setuid-root shell in the
workspace, on the host's disk, that any local user ran as root (an ordinary user's sandbox left
a setuid program of that user's the same way). A `nosuid` mount only stops the bit inside the
sandbox, not on the host, and a scan after each call leaves a window. So the kernel refuses it:
a classic BPF program, handed to bubblewrap (`--seccomp FD`), fails with `EPERM` every
`chmod` and file or directory creation whose mode has `S_ISUID` or `S_ISGID`, and with `ENOSYS`
the calls it cannot look into (`openat2`, whose mode is behind a pointer, and `io_uring`,
which would make the same calls past the filter; programs fall back from both). Nothing else
is refused. Hard links of the system's setuid programs cannot reach the workspace either: the
system is another mount (`EXDEV`). A 32-bit (or x32) call is refused outright; 64-bit x86 and
ARM are known, and elsewhere the sandbox is refused (`program` raises).

Measured: building the program once a process, a fresh descriptor for it each call (a
`memfd`, about 10 us), no cost the workspace's size decides.
"""

from __future__ import annotations

import functools
import os
import platform
import struct

from ..errors import ConfigError

LOAD = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET = 0x06  # BPF_RET | BPF_K
ALLOW = 0x7FFF0000
ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38
NR, ARCH_AT = 0, 4  # offsets in struct seccomp_data; args[i]'s low word at 16 + 8 i
SPECIAL = 0o6000  # S_ISUID | S_ISGID
CREATES = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE: an open that makes a file, with a mode
X32 = 0x40000000

Rule = tuple[int, int, int | None]
"""A syscall's number, the argument that holds the mode, and the one that holds an open's
flags (None: the call always applies its mode)."""

ARCHES: dict[str, tuple[int, list[Rule], list[int]]] = {
    # machine: (AUDIT_ARCH_*, rules, refused outright)
    "x86_64": (
        0xC000003E,
        [
            (2, 2, 1),  # open(path, flags, mode)
            (257, 3, 2),  # openat(dirfd, path, flags, mode)
            (85, 1, None),  # creat(path, mode)
            (83, 1, None),  # mkdir
            (258, 2, None),  # mkdirat
            (133, 1, None),  # mknod
            (259, 2, None),  # mknodat
            (90, 1, None),  # chmod
            (91, 1, None),  # fchmod
            (268, 2, None),  # fchmodat
            (452, 2, None),  # fchmodat2
        ],
        [437, 425],  # openat2, io_uring_setup
    ),
    "aarch64": (
        0xC00000B7,
        [
            (56, 3, 2),  # openat
            (34, 2, None),  # mkdirat
            (33, 2, None),  # mknodat
            (52, 1, None),  # fchmod
            (53, 2, None),  # fchmodat
            (452, 2, None),  # fchmodat2
        ],
        [437, 425],
    ),
}


def arg(index: int) -> int:
    return 16 + 8 * index  # the low 32 bits (both machines are little-endian)


@functools.cache
def program(machine: str | None = None) -> bytes:
    """The filter as bubblewrap reads it: `struct sock_filter` after `struct sock_filter`."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise ConfigError(f"--sandbox: no seccomp filter is known for {machine}")
    audit_arch, rules, refused = ARCHES[machine]
    code: list[tuple[int, str | int, str | int, int]] = [  # (op, jump if true, if false, k)
        (LOAD, 0, 0, ARCH_AT),
        (JEQ, 0, "nosys", audit_arch),
        (LOAD, 0, 0, NR),
    ]
    if machine == "x86_64":
        code.append((JGE, "nosys", 0, X32))
    code += [(JEQ, "nosys", 0, nr) for nr in refused]
    for nr, mode, flags in rules:
        body: list[tuple[int, str | int, str | int, int]] = []
        if flags is not None:
            body += [(LOAD, 0, 0, arg(flags)), (JSET, 0, "allow", CREATES)]
        body += [(LOAD, 0, 0, arg(mode)), (JSET, "deny", "allow", SPECIAL)]
        code += [(JEQ, 0, len(body), nr), *body]
    code += [(RET, 0, 0, ALLOW)]
    ends = {"allow": len(code) - 1, "deny": len(code), "nosys": len(code) + 1}
    code += [(RET, 0, 0, ERRNO | EPERM), (RET, 0, 0, ERRNO | ENOSYS)]

    def offset(at: int, to: str | int) -> int:
        return ends[to] - at - 1 if isinstance(to, str) else to

    return b"".join(
        struct.pack("<HBBI", op, offset(i, yes), offset(i, no), k)
        for i, (op, yes, no, k) in enumerate(code)
    )


def descriptor() -> int:
    """A fresh descriptor holding the filter, read from its start (bubblewrap reads it to its
    end, so each sandbox needs its own); the caller closes it."""
    fd = os.memfd_create("tether-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
