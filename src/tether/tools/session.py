"""A shell session carried between the bash calls of one run: its working directory and its
variables, as a terminal keeps them (`cd build` in one call, `make` in the next).

Each call is still a bash of its own (so a call's time limit, its sandbox and the killing of
what it started work as before); the session is carried in the command line instead. Before the
command, the session's directory and variables are restored; after it, they are printed, after
a marker of the call's own, as one line of base64, and taken off the output the model reads:

    cd -- DIR; eval "$(base64 -d <<< STATE)"      the session so far
    eval -- COMMAND                               the model's command, as written
    printf MARK; { pwd; declare -p; } | base64    the session after it

A command that exits the shell, or is killed, leaves the session as it was. Shell options,
functions and aliases are not carried, nor bash's own variables (`SKIPPED`). The session lives
in the run's context (`RunContext.kept`), in this process: a durable run resumed elsewhere
starts a fresh one. `fresh` starts one anew: the workspace, no variables carried.

A command still running when its call's wait is up goes on as a job of the session, which
the `bash_job` tool polls or stops; the run's end stops every job (`close_kept`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import shlex
import uuid
from dataclasses import dataclass, field
from typing import Protocol

KEY = "tether.shell_session"
"""Where a run's session is kept in its context's `kept`."""

SKIPPED = re.compile(
    r"declare -\S+ (BASH\w*|BASHOPTS|SHELLOPTS|EUID|UID|PPID|SHLVL|PWD|OLDPWD|_|PIPESTATUS|"
    r"FUNCNAME|GROUPS|DIRSTACK|RANDOM|SRANDOM|SECONDS|LINENO|HISTCMD|EPOCH\w*|COMP_\w*|"
    r"__tether\w*|LD_\w*|BASH_ENV|ENV|PROMPT_COMMAND|IFS|PS4)(=|$)"
)
"""bash's own variables and the session's, which a restore must not set; nor those that
change how bash itself or every program runs (`LD_*`, `BASH_ENV`, `ENV`, `PROMPT_COMMAND`,
`IFS`, `PS4`): a state forged in a command's output could otherwise reach into the session's
own lines. `PATH` is carried (a `source .venv/bin/activate` holds for the next call), and the
session's own lines find their programs by the default path (`command -p`), never by it."""


class Job(Protocol):
    """A command that went on past its call's wait (see `bash.session_tools`)."""

    async def stop(self) -> None:
        """End it, and everything it started; return once they are gone."""
        ...

    async def wait(self, seconds: float) -> None:
        """Wait for it to end, `seconds` at most."""
        ...

    def report(self, number: int) -> str:
        """Whether it still runs, or how it ended, and its output so far."""
        ...


@dataclass
class ShellSession:
    cwd: str | None = None
    declarations: str = ""
    """`declare -p` lines of the variables the session carries."""
    jobs: dict[int, Job] = field(default_factory=dict)
    """Commands that went on in the background, by number (a job's end leaves the session
    as it was: commands may have run since it started)."""
    started_jobs: int = 0

    def add_job(self, job: Job) -> int:
        """Keep `job` under the session's next number (1, 2, ...)."""
        self.started_jobs += 1
        self.jobs[self.started_jobs] = job
        return self.started_jobs

    async def close(self) -> None:
        """Stop every job: the run is over (its context lets go of the session)."""
        jobs = list(self.jobs.values())
        self.jobs.clear()
        await asyncio.gather(*(job.stop() for job in jobs))

    def wrap(self, command: str) -> tuple[str, str]:
        """The command line that runs `command` in this session, and the marker after which
        its output holds the session's new state (see `take`)."""
        mark = f"__tether_session_{uuid.uuid4().hex}__"
        lines = []
        if self.cwd is not None:
            lines.append(f"cd -- {shlex.quote(self.cwd)} 2>/dev/null")
        if self.declarations:
            state = base64.b64encode(self.declarations.encode()).decode()
            lines.append(f'eval "$(printf %s {state} | command -p base64 -d)" 2>/dev/null')
        lines += [
            f"eval -- {shlex.quote(command)}",
            "__tether_status=$?",
            f"printf '\\n%s\\n' {mark}",
            "{ pwd; declare -p; } 2>/dev/null | command -p base64 -w0; echo",
            "exit $__tether_status",
        ]
        return "\n".join(lines), mark

    def take(self, output: str, mark: str) -> str:
        """The command's own output; the session takes the state printed after `mark` (none
        there: the command ended the shell, and the session stays as it was)."""
        head, found, state = output.rpartition(f"\n{mark}\n")
        if not found:
            return output
        try:
            text = base64.b64decode(state.strip().split("\n")[0], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return head
        cwd, _, declared = text.partition("\n")
        self.cwd = cwd or self.cwd
        self.declarations = carried(declared)
        return head


QUOTED = r'"(?:[^"\\$`]|\\[\s\S])*"'  # "..." as declare -p writes it: $ ` " \ escaped
ANSI_C = r"\$'(?:[^'\\]|\\[\s\S])*'"  # $'...': no expansion inside
VALUE = rf"(?:{QUOTED}|{ANSI_C})"
ARRAY = rf"\((?:\[(?:[A-Za-z0-9_]+|{QUOTED})\]={VALUE} ?)*\)"
DATA = re.compile(rf"declare -[A-Za-z-]+ [A-Za-z_][A-Za-z0-9_]*(?:=(?:{VALUE}|{ARRAY}))?")
"""A declaration that sets a variable and does nothing else, as `declare -p` prints one. The
state comes back in the command's output, after a marker the command can read (it is in its
shell's command line); a command that printed a forged state and then killed its shell would
have the next call `eval` whatever it liked. Restored, a state can only set variables, which a
command may do in the session anyway."""


def carried(declared: str) -> str:
    """The declarations a restore sets: each `declare` (a value may span lines) but bash's own,
    those of read-only variables, and any that is not plain data (`DATA`)."""
    kept: list[str] = []
    current: list[str] = []

    def close() -> None:
        if current and not SKIPPED.match(current[0]) and "r" not in current[0].split()[1]:
            declaration = "\n".join(current).rstrip("\n")
            if DATA.fullmatch(declaration):
                kept.append(declaration)

    for line in declared.split("\n"):
        if line.startswith("declare -"):
            close()
            current = [line]
        elif current:
            current.append(line)
    close()
    return "\n".join(kept)


def session_of(kept: dict[str, object], fresh: bool) -> ShellSession:
    """The run's session (a new one when `fresh`, or the first time; the jobs go on)."""
    found = kept.get(KEY)
    if not isinstance(found, ShellSession):
        found = kept[KEY] = ShellSession()
    elif fresh:
        found.cwd, found.declarations = None, ""
    return found


async def close_kept(kept: dict[str, object]) -> None:
    """At a run's end: stop what its tools left running (a session's jobs), and wait for it
    to be gone (a cancel of the caller does not cut this short)."""
    found = kept.get(KEY)
    if isinstance(found, ShellSession) and found.jobs:
        await asyncio.shield(found.close())
