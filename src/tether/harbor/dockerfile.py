"""What a task's Dockerfile says about the trial's environment, read without Docker.

A Harbor task describes its container with `environment/Dockerfile`. Tether's environments run
on the host (`LocalEnvironment`) or in a bubblewrap sandbox with a copy-on-write root over the
host's system (`SandboxEnvironment`), so of a Dockerfile they honour what shapes the trial,
taking the host's system as the `FROM` image: `ENV` (every command sees it), `ARG` (its
defaults, for substitution), `WORKDIR` (the trial's working directory), `COPY`/`ADD` of the
build context, and in the sandbox `RUN`, `USER`, `SHELL` and `ENTRYPOINT` too (`build.py`;
the entrypoint starts with the trial, given `sh -c "sleep infinity"` as Harbor's containers
give it, in `CMD`'s place). What cannot be honoured is said, never skipped in silence: a
multi-stage build, `COPY --from`, `ADD` of a URL or `RUN --mount` fails the trial at start
naming the instruction; `CMD` and the other instructions are listed in `Image.ignored`, which
the environment logs. (A task scored 0
because a `COPY` or an `ENV` was dropped reads as the agent's failure.)
"""

from __future__ import annotations

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


def copy_of(line: int, keyword: str, arguments: str, known: dict[str, str], workdir: str) -> Copy:
    text = f"line {line}: {keyword} {arguments}"
    if arguments.startswith("["):
        words = [str(w) for w in json.loads(arguments)]
    else:
        words = shlex.split(arguments)
    flags = [w for w in words if w.startswith("--")]
    words = [substitute(w, known) for w in words if not w.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        raise DockerfileError(f"{text}: copying from another stage or image is not supported here")
    if len(words) < 2:
        raise DockerfileError(f"{text}: a source and a destination are needed")
    *sources, destination = words
    if keyword == "ADD" and any("://" in s for s in sources):
        raise DockerfileError(f"{text}: ADD of a URL is not supported here (no network at build)")
    absolute = posixpath.normpath(posixpath.join(workdir, destination))
    if destination.endswith("/") or destination in (".", ".."):  # a directory
        absolute = absolute.rstrip("/") + "/"
    return Copy(sources, absolute, line, text)


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

    def take(self, line: int, keyword: str, arguments: str) -> None:
        image, known = self.image, {**IMAGE_ENV, **self.args, **self.image.env}
        if keyword == "FROM":
            self.stages += 1
            if self.stages > 1:
                raise DockerfileError(
                    f"line {line}: FROM {arguments}: multi-stage builds are not supported here"
                )
            image.base = substitute(arguments.split()[0], known) if arguments.split() else ""
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
            image.copies.append(copy_of(line, keyword, arguments, known, self.workdir))
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
