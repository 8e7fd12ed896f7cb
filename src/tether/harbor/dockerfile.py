"""What a task's Dockerfile says about the trial's environment, read without Docker.

A Harbor task describes its container with `environment/Dockerfile`. Tether's environments run
on the host (`LocalEnvironment`) or in a bubblewrap sandbox with a copy-on-write root over the
host's system (`SandboxEnvironment`), so of a Dockerfile they honour what shapes the trial,
taking the host's system as the `FROM` image: `ENV` (every command sees it), `ARG` (its
defaults, for substitution), `WORKDIR` (the trial's working directory), `COPY`/`ADD` of the
build context, and in the sandbox `RUN`, `USER`, `SHELL` and `ENTRYPOINT` too (`build.py`;
the entrypoint starts with the trial, given `sh -c "sleep infinity"` as Harbor's containers
give it, in `CMD`'s place), and in the sandbox multi-stage builds (`FROM ... AS build`, then
`COPY --from=build`; each stage built on its own). Substitutions see the image's environment
first (`ENV PATH="/x:${PATH}"` keeps the system's). What cannot be honoured is said, never
skipped in silence: `COPY --from` another image, `ADD` of a URL or `RUN --mount` fails the
trial at start naming the instruction (and a line that cannot be read, its line); `CMD` and
the other instructions are listed in `Image.ignored`, which the environment logs. (A task
scored 0 because a `COPY` or an `ENV` was dropped reads as the agent's failure.)
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

HONOURED = {"FROM", "ENV", "ARG", "WORKDIR", "COPY", "ADD", "LABEL", "MAINTAINER", "EXPOSE"}
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::([-+])([^}]*))?\}|(\w+))")
IMAGE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
"""What a `FROM` image's environment holds before the Dockerfile's first `ENV`, as far as a
substitution sees it: Docker's default `PATH` (`ENV PATH="/x:${PATH}"` expanded to `/x:`,
and every later step and the trial lost the system's programs)."""


class DockerfileError(ValueError):
    """A Dockerfile instruction this environment cannot honour; the message names it."""


@dataclass
class Copy:
    """One `COPY`/`ADD`: sources relative to the build context, an absolute destination."""

    sources: list[str]
    destination: str
    line: int
    instruction: str
    stage: str | None = None
    """`COPY --from=STAGE`: the earlier stage (by name or number) its sources are in."""


@dataclass
class Run:
    """One `RUN`: its command line, and the environment, directory and user it runs with (as
    the instructions before it left them; build arguments are in its environment, as in
    Docker's build)."""

    argv: list[str]
    env: dict[str, str]
    workdir: str
    user: str | None
    line: int
    instruction: str


@dataclass
class Image:
    """What the trial takes from the Dockerfile."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    """What the container starts as its first process (exec form, or the shell form run by
    `/bin/sh -c`); Harbor gives it `sh -c "sleep infinity"` as its arguments, in CMD's place."""
    base: str = ""
    copies: list[Copy] = field(default_factory=list)
    steps: list[Copy | Run] = field(default_factory=list)
    """The copies and runs in their order: a build applies them one after another."""
    ignored: list[str] = field(default_factory=list)  # "line 9: CMD ["serve"]"
    exposed: list[int] = field(default_factory=list)
    """The TCP ports of its `EXPOSE`: a trial with an entrypoint starts once they listen."""
    name: str | None = None
    """Its stage's name (`FROM ... AS NAME`), if it has one."""
    stages: dict[str, Image] = field(default_factory=dict)
    """A multi-stage build's earlier stages, by name (`FROM ... AS build`) and by number
    ("0", "1" ...): each built on its own, its files taken by `COPY --from`."""

    @property
    def from_stages(self) -> list[str]:
        """The stages its copies take files from, in the order they are first needed."""
        return list(dict.fromkeys(c.stage for c in self.copies if c.stage is not None))

    @property
    def runs(self) -> list[Run]:
        return [step for step in self.steps if isinstance(step, Run)]


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, KEYWORD, arguments) of each instruction: comments dropped, continued lines
    joined."""
    found: list[tuple[int, str, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        continued = line.endswith("\\")
        pending.append(line[:-1].strip() if continued else line)
        if not continued:
            keyword, _, rest = " ".join(p for p in pending if p).partition(" ")
            found.append((start, keyword.upper(), rest.strip()))
            pending = []
    if pending:
        keyword, _, rest = " ".join(pending).partition(" ")
        found.append((start, keyword.upper(), rest.strip()))
    return found


def substitute(value: str, known: dict[str, str]) -> str:
    """`$NAME`, `${NAME}`, `${NAME:-default}` and `${NAME:+instead}` as Docker expands them
    (an unknown name: empty); `\\$` is a dollar sign."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        how, word = m.group(2), m.group(3)
        got = known.get(name, "")
        if how == "-":
            return got or word
        if how == "+":
            return word if got else ""
        return got

    escaped = value.split("\\$")
    return "$".join(VARIABLE.sub(one, part) for part in escaped)


def pairs(arguments: str, known: dict[str, str]) -> dict[str, str]:
    """`ENV`'s two forms: `KEY=VALUE ...` (quotes allowed) and the old `KEY VALUE`."""
    words = shlex.split(arguments, posix=True)
    if words and "=" not in words[0]:
        key, _, value = arguments.partition(" ")
        return {key: substitute(value.strip(), known)}
    result: dict[str, str] = {}
    for word in words:
        key, _, value = word.partition("=")
        result[key] = substitute(value, {**known, **result})
    return result


def copy_of(
    line: int,
    keyword: str,
    arguments: str,
    known: dict[str, str],
    workdir: str,
    stages: dict[str, Image] | None = None,
) -> Copy:
    text = f"line {line}: {keyword} {arguments}"
    if arguments.startswith("["):
        words = [str(w) for w in json.loads(arguments)]
    else:
        words = shlex.split(arguments)
    flags = [w for w in words if w.startswith("--")]
    words = [substitute(w, known) for w in words if not w.startswith("--")]
    stage = next((f.partition("=")[2] for f in flags if f.startswith("--from=")), None)
    if stage is not None and stage not in (stages or {}):
        raise DockerfileError(
            f"{text}: copying from another image ({stage}) is not supported here; from an "
            "earlier stage of this Dockerfile, it is"
        )
    if len(words) < 2:
        raise DockerfileError(f"{text}: a source and a destination are needed")
    *sources, destination = words
    if keyword == "ADD" and any("://" in s for s in sources):
        raise DockerfileError(f"{text}: ADD of a URL is not supported here (no network at build)")
    absolute = posixpath.normpath(posixpath.join(workdir, destination))
    if destination.endswith("/") or destination in (".", ".."):  # a directory
        absolute = absolute.rstrip("/") + "/"
    if stage is not None:  # paths in the stage's root, relative ones from its workdir
        top = (stages or {})[stage].workdir or "/"
        sources = [s if s.startswith("/") else posixpath.join(top, s) for s in sources]
    return Copy(sources, absolute, line, text, stage)


def run_of(
    line: int,
    arguments: str,
    known: dict[str, str],
    shell: list[str],
    workdir: str,
    user: str | None,
) -> Run:
    """A `RUN` in its shell form (run by the `SHELL`, `/bin/sh -c` by default) or its exec
    form (a JSON list, run as it is)."""
    text = f"line {line}: RUN {arguments}"[:200]
    if arguments.startswith("--"):
        flag = arguments.split()[0]
        raise DockerfileError(f"{text}: RUN {flag} is not supported here")
    if arguments.startswith("["):
        argv = [str(word) for word in json.loads(arguments)]
    else:
        argv = [*shell, arguments]
    return Run(argv, dict(known), workdir, user, line, text)


def read(path: Path) -> Image:
    """The Dockerfile at `path`, read; `DockerfileError` names what cannot be honoured, and the
    line of one that cannot be read (a bad quote, exec form that is not JSON)."""
    reading = Reading()
    for line, keyword, arguments in instructions(path.read_text()):
        try:
            reading.take(line, keyword, arguments)
        except DockerfileError:
            raise
        except ValueError as e:  # shlex's and json's, said with the line they are on
            said = f"{keyword} {arguments}"[:120]
            raise DockerfileError(f"line {line}: {said}: {e}") from None
    return reading.image


@dataclass
class Reading:
    """A Dockerfile as far as it has been read: the image so far, and the build's state."""

    image: Image = field(default_factory=Image)
    args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    shell: list[str] = field(default_factory=lambda: ["/bin/sh", "-c"])
    stages: int = 0
    global_args: dict[str, str] = field(default_factory=dict)
    """The `ARG`s before the first `FROM`: every stage's `FROM` line may use them."""

    def start_stage(self, line: int, arguments: str) -> None:
        """A `FROM [--platform=P] IMAGE [AS NAME]`: the stage before it (if any) is kept under
        its name and number, and a new one begins, from that image or from an earlier stage
        (whose steps it then repeats, as Docker starts from that stage's result)."""
        if self.stages == 0:
            self.global_args = dict(self.args)
        words = [w for w in arguments.split() if not w.startswith("--")]
        if not words:
            raise DockerfileError(f"line {line}: FROM: an image is needed")
        base = substitute(words[0], {**IMAGE_ENV, **self.global_args})
        name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
        if self.stages > 0:
            done = self.image
            earlier = {**done.stages}
            done.stages = {}
            earlier[str(self.stages - 1)] = done
            if done.name:
                earlier[done.name] = done
            parent = earlier.get(base)
            self.image = copy.deepcopy(parent) if parent is not None else Image()
            self.image.stages = earlier
            self.workdir = self.image.workdir or "/"
            self.shell = ["/bin/sh", "-c"]
            self.args = dict(self.global_args)
        if base not in self.image.stages:
            self.image.base = base
        self.image.name = name
        self.stages += 1

    def take(self, line: int, keyword: str, arguments: str) -> None:
        image, known = self.image, {**IMAGE_ENV, **self.args, **self.image.env}
        if keyword == "FROM":
            self.start_stage(line, arguments)
        elif keyword == "ARG":
            name, _, default = arguments.partition("=")
            self.args[name.strip()] = substitute(default.strip().strip('"'), known)
        elif keyword == "ENV":
            image.env.update(pairs(arguments, known))
        elif keyword == "WORKDIR":
            self.workdir = posixpath.normpath(
                posixpath.join(self.workdir, substitute(arguments, known))
            )
            image.workdir = self.workdir
        elif keyword in ("COPY", "ADD"):
            image.copies.append(
                copy_of(line, keyword, arguments, known, self.workdir, image.stages)
            )
            image.steps.append(image.copies[-1])
        elif keyword == "RUN":
            image.steps.append(run_of(line, arguments, known, self.shell, self.workdir, image.user))
        elif keyword == "USER":
            image.user = substitute(arguments, known).strip() or None
        elif keyword == "SHELL":
            self.shell = [str(word) for word in json.loads(arguments)]
        elif keyword == "ENTRYPOINT":
            exec_form = arguments.startswith("[")
            image.entrypoint = (
                [str(w) for w in json.loads(arguments)] if exec_form else [*self.shell, arguments]
            )
        elif keyword == "EXPOSE":
            for word in substitute(arguments, known).split():
                port, _, proto = word.partition("/")
                if port.isdigit() and proto in ("", "tcp"):
                    image.exposed.append(int(port))
        elif keyword == "CMD":
            image.ignored.append(f"line {line}: CMD {arguments} (Harbor runs none)"[:200])
        elif keyword not in HONOURED:
            image.ignored.append(f"line {line}: {keyword} {arguments}"[:200])


ENTRYPOINT_READY_S = 30.0
"""The longest a trial waits for its entrypoint's `EXPOSE`d ports to listen."""
ENTRYPOINT_SETTLE_S = 0.5
"""With no `EXPOSE`: how long the listening sockets must stay as they are (5 s at most)."""


def ready_script(ports: list[int]) -> str:
    """A command that returns once the entrypoint's service is up, as Harbor's own set-up
    gives a container's under Docker (an oracle curled its server 20 to 60 ms before it
    listened, and scored 0): every `EXPOSE`d port listening (at most `ENTRYPOINT_READY_S`),
    or, with none, the listening sockets unchanged for `ENTRYPOINT_SETTLE_S` (5 s at most)."""
    listening = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == \"0A\" {print $2}'"
    if ports:
        wanted = " ".join(f":{p:04X}$" for p in ports)
        tries = int(ENTRYPOINT_READY_S / 0.05)
        return (
            f"for i in $(seq {tries}); do up=$({listening}); ok=1; "
            f'for p in {wanted}; do echo "$up" | grep -q "$p" || ok=0; done; '
            "[ $ok = 1 ] && exit 0; sleep 0.05; done; exit 0"
        )
    steady = int(ENTRYPOINT_SETTLE_S / 0.1)
    return (
        f"was=; same=0; for i in $(seq 50); do now=$({listening} | sort | tr '\\n' ' '); "
        f'if [ "$now" = "$was" ]; then same=$((same + 1)); [ $same -ge {steady} ] && exit 0; '
        "else same=0; was=$now; fi; sleep 0.1; done; exit 0"
    )
