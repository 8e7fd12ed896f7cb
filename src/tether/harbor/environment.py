"""A Harbor environment that runs a task on this machine, in a scratch directory, without Docker.

    harbor run --path tasks/harbor --env tether.harbor.environment:LocalEnvironment \\
        --agent tether.harbor.agent:TetherAgent --model openai/gpt-5

A container gives a task its own `/app`, `/logs`, `/tests` and `/solution`. Here each trial gets
a scratch directory holding those four, and a container path is mapped into it: in the paths
of uploads and downloads, in an exec's `cwd`, and in the command line itself wherever one of
the four appears as a path (`bash /tests/test.sh > /logs/verifier/out.txt`). Scripts see the
same places in `$APP_DIR`, `$LOGS_DIR`, `$TESTS_DIR` and `$SOLUTION_DIR`, so a test script that
writes `${LOGS_DIR:-/logs}/verifier/reward.txt` runs unchanged here and in a container.

Of the task's `environment/Dockerfile`, `ENV`, `ARG`, `WORKDIR` and `COPY`/`ADD` into those
places are honoured and the rest is logged as not run (`dockerfile.py`); a task without one has
its whole `environment/` copied into the workdir. A `setup.sh` put there runs at start (what a
Dockerfile's `RUN` would do). Every process a trial starts carries a
marker in its environment; `stop` kills whatever is still running with it, background jobs
included. Commands run as the current user: this is isolation by directory, not a sandbox, so
run only tasks you trust.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import tempfile
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.task.config import EnvironmentConfig

from ..errors import known
from ..tools.bash import kill_group, kill_strays
from .dockerfile import Copy, DockerfileError, Image, read
from .rootfs import remove

SETUP_SCRIPT = "setup.sh"
MARKER = "TETHER_HARBOR_TRIAL"
DRAIN_AFTER_EXIT = 1.0
"""Seconds to keep reading after the command exits, for output of jobs it left running."""
EMPTY_PASSES = 3
"""An environment that reads empty three looks running is taken as empty (see `kill_strays`)."""
PLACES = {"/app": "app", "/logs": "logs", "/tests": "tests", "/solution": "solution"}
CONTAINER_DIRS = ("/app", "/tests", "/solution", "/logs/agent", "/logs/verifier", "/logs/artifacts")
VARIABLES = {"app": "APP_DIR", "logs": "LOGS_DIR", "tests": "TESTS_DIR", "solution": "SOLUTION_DIR"}


DOCKERFILE = "Dockerfile"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def refuse_what_cannot_be_given(environment_dir: Path, config: EnvironmentConfig) -> None:
    """Fail the trial at start, saying why, when the task needs what runs here cannot give: a
    trial scored 0 because its database service never started reads as the agent's failure."""
    compose = [n for n in COMPOSE_FILES if (environment_dir / n).is_file()]
    if compose and not only_the_main_service(environment_dir / compose[0]):
        raise RuntimeError(
            f"the task's environment/{compose[0]} starts services, which this environment "
            "cannot start (use Harbor's docker environment for this task)"
        )
    if config.gpus:
        raise RuntimeError(f"the task asks for {config.gpus} GPU(s); this environment has none")
    if config.mcp_servers:
        names = ", ".join(s.name for s in config.mcp_servers)
        raise RuntimeError(
            f"the task declares MCP servers ({names}); this environment cannot start them"
        )


def only_the_main_service(path: Path) -> bool:
    """Whether a task's compose file starts nothing but the task's own container: one service,
    built from the task's Dockerfile, depending on none (as Harbor's template for an
    air-gapped task is: `network_mode: none`, which a trial here has anyway). Such a task
    was refused as one that starts services."""
    import yaml  # type: ignore[import-untyped,unused-ignore]  # harbor's dependency

    try:
        services = (yaml.safe_load(path.read_text()) or {}).get("services") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return False
    if not isinstance(services, dict) or len(services) != 1:
        return False
    (main,) = services.values()
    return isinstance(main, dict) and "build" in main and not main.get("depends_on")


def check_user(user: str | int | None) -> None:
    """Refuse a command Harbor asks to run as another user (a task's `[agent]` or `[verifier]`
    `user`): this environment runs every command as one user, and a verifier that drops to an
    unprivileged user to run the agent's program would otherwise run it as root, its check
    against cheating gone without a word."""
    me = {0, "root", os.getuid(), pwd.getpwuid(os.getuid()).pw_name}
    if user is not None and user not in me and str(user) not in {str(u) for u in me}:
        raise RuntimeError(
            f"the task asks to run a command as user {user!r}; this environment runs every "
            "command as one user and cannot switch (use Harbor's docker environment)"
        )


def image_of(environment_dir: Path) -> tuple[Image, str | None]:
    """What the task's Dockerfile gives the trial, and why it cannot be honoured if it
    cannot (said at start, where Harbor reports it as the trial's error)."""
    path = environment_dir / DOCKERFILE
    if not path.is_file():
        return Image(), None
    try:
        return read(path), None
    except (DockerfileError, ValueError) as e:
        return Image(), str(e)


def path_pattern(prefixes: list[str]) -> re.Pattern[str]:
    """A container path as a word of a command line: not inside another path or a name."""
    alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
    return re.compile(rf"(?<![\w./~$-])({alternatives})(?=[/\s'\";|&)<>]|$)")


class LocalEnvironment(BaseEnvironment):
    """Runs the trial's commands with bash on this machine, confined to a scratch directory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.root = Path(tempfile.gettempdir()) / f"tether-harbor-{uuid.uuid4().hex}"
        """The trial's scratch directory, made (0700) when the trial starts: Harbor makes
        environments it never starts, and each left an empty directory in /tmp."""
        self.trial_marker = uuid.uuid4().hex
        super().__init__(*args, **kwargs)
        self.image, self.image_error = image_of(self.environment_dir)
        if self.image.workdir and not self.task_env_config.workdir:
            self.task_env_config.workdir = self.image.workdir  # as Docker's WORKDIR
        workdir = self.task_env_config.workdir
        self.places = dict(PLACES)
        if workdir and workdir not in self.places:
            self.places[workdir.rstrip("/")] = "app"
        self.pattern = path_pattern(list(self.places))

    @staticmethod
    def type() -> str:
        return "tether-local"

    def _validate_definition(self) -> None:
        """Nothing is required: a task without `environment/` starts from an empty workdir."""

    # -- paths ---------------------------------------------------------------------------

    def local(self, path: str) -> Path:
        """Where a container path lives here; relative paths are relative to the workdir."""
        if not path.startswith("/"):
            return self.root / "app" / path
        for prefix, place in sorted(self.places.items(), key=lambda kv: -len(kv[0])):
            if path == prefix or path.startswith(prefix + "/"):
                return self.root / place / path[len(prefix) :].lstrip("/")
        return Path(path)

    def rewrite(self, command: str) -> str:
        def mapped(m: re.Match[str]) -> str:
            return str(self.root / self.places[m.group(1)])

        return self.pattern.sub(mapped, command)

    def variables(self) -> dict[str, str]:
        return {name: str(self.root / place) for place, name in VARIABLES.items()}

    def image_env(self) -> dict[str, str]:
        """The Dockerfile's `ENV`, its container paths mapped here (`DATA_DIR=/app/data`)."""
        return {key: self.rewrite(value) for key, value in self.image.env.items()}

    # -- lifecycle -----------------------------------------------------------------------

    def workdir(self) -> str:
        return self.task_env_config.workdir or "/app"

    async def start(self, force_build: bool) -> None:
        refuse_what_cannot_be_given(self.environment_dir, self.task_env_config)
        self.check_image()
        self.make_places()
        self.place_files()
        await self.run_setup()

    def check_image(self) -> None:
        """Fail now if the Dockerfile cannot be honoured; log what of it is not run here."""
        if self.image_error:
            raise RuntimeError(f"environment/{DOCKERFILE}: {self.image_error}")
        for instruction in self.not_run():
            self.logger.warning(f"environment/{DOCKERFILE} {instruction}: not run here")

    def not_run(self) -> list[str]:
        """The Dockerfile's instructions this environment does not honour: here `RUN`,
        `USER` and `ENTRYPOINT` too (it runs on the host, as the user that runs Harbor)."""
        not_run = [run.instruction for run in self.image.runs] + self.image.ignored
        if self.image.user is not None:
            not_run.append(f"USER {self.image.user}")
        if self.image.entrypoint:
            not_run.append(f"ENTRYPOINT {self.image.entrypoint}")
        return not_run

    def made_root(self) -> None:
        """The scratch directory, made now, the caller's alone (a fresh name: never one that
        is there already)."""
        if not self.root.is_dir():
            self.root.mkdir(mode=0o700)

    def make_places(self) -> None:
        self.made_root()
        for place in (*CONTAINER_DIRS, self.workdir()):
            self.local(place).mkdir(parents=True, exist_ok=True)

    def place_files(self) -> None:
        """The task's files put in place: what its Dockerfile copies, or without one the whole
        `environment/` into the workdir."""
        if (self.environment_dir / DOCKERFILE).is_file():
            for copy in self.image.copies:
                self.put_in_place(copy)
        elif self.environment_dir.is_dir():
            shutil.copytree(self.environment_dir, self.local(self.workdir()), dirs_exist_ok=True)

    async def run_setup(self) -> None:
        """The task's setup script, if it has one in its workdir (what a Dockerfile's `RUN`
        would do), run once and removed."""
        setup = self.local(self.workdir()) / SETUP_SCRIPT
        if not self.environment_dir.is_dir() or not setup.is_file():
            return
        script = setup.read_text()
        setup.unlink()
        timeout = int(self.task_env_config.build_timeout_sec)
        result = await self.exec(script, timeout_sec=timeout)
        if result.return_code != 0:
            raise RuntimeError(
                f"environment/{SETUP_SCRIPT} failed with status {result.return_code}: "
                f"{(result.stderr or result.stdout or '')[-2000:]}"
            )

    def put_in_place(self, copy: Copy, local: Callable[[str], Path] | None = None) -> None:
        """One `COPY`/`ADD` of the build context, as Docker makes it: a directory's contents,
        a file into a directory (a destination ending in `/`, or several sources) or to a
        name; where `local` maps the destination (by default, the trial's own files: here
        only its places, the rest of the system being the host's)."""
        if copy.stage is not None:
            raise RuntimeError(
                f"environment/{DOCKERFILE} {copy.instruction}: a multi-stage build is built "
                "in the sandbox only (tether.harbor.sandbox:SandboxEnvironment)"
            )
        target = (local or self.local)(copy.destination)
        if local is None and self.root not in target.parents and target != self.root:
            raise RuntimeError(
                f"environment/{DOCKERFILE} {copy.instruction}: this environment can only write "
                f"into {', '.join(sorted(self.places))}"
            )
        into_directory = copy.destination.endswith("/") or len(copy.sources) > 1
        for pattern in copy.sources:
            for source in self.in_context(copy, pattern):
                if source.is_dir():
                    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
                elif source.is_file():
                    to = target / source.name if into_directory or target.is_dir() else target
                    to.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, to)
                else:
                    raise RuntimeError(
                        f"environment/{DOCKERFILE} {copy.instruction}: {pattern} is not in the "
                        "build context"
                    )

    def in_context(self, copy: Copy, pattern: str) -> list[Path]:
        """What a source of a `COPY` names, each inside the build context, as Docker keeps it:
        a `..` or a link that leads out of the context is refused (it read any host file)."""
        context = self.environment_dir.resolve()
        sources = sorted(self.environment_dir.glob(pattern.lstrip("/"))) or [
            self.environment_dir / pattern.lstrip("/")
        ]
        for source in sources:
            if source.resolve() != context and context not in source.resolve().parents:
                raise RuntimeError(
                    f"environment/{DOCKERFILE} {copy.instruction}: {pattern} leads out of the "
                    "build context"
                )
        return sources

    async def stop(self, delete: bool) -> None:
        kill_marked(self.trial_marker)
        if delete and self.root.exists():
            remove(self.root)

    # -- files ---------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = self.local(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_path, target)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        shutil.copytree(source_dir, self.local(target_dir), dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.local(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        shutil.copytree(self.local(source_dir), target_dir, dirs_exist_ok=True)

    # -- commands ------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` with bash in the workdir (or `cwd`); on timeout its process group is
        killed and the status is 124, as with coreutils' `timeout`."""
        check_user(self._resolve_user(user))
        environ = {
            **os.environ,
            **self.image_env(),
            **(self._merge_env(env) or {}),
            **self.variables(),
            MARKER: self.trial_marker,
        }
        where = self.local(cwd or self.workdir())
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            self.rewrite(command),
            cwd=where,
            env=environ,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        out, err = bytearray(), bytearray()
        readers = [
            asyncio.ensure_future(drain(known(proc.stdout, "a PIPE's stdout"), out)),
            asyncio.ensure_future(drain(known(proc.stderr, "a PIPE's stderr"), err)),
        ]
        try:
            code = await asyncio.wait_for(proc.wait(), timeout_sec)
        except TimeoutError:
            kill_group(proc.pid)
            code = 124
        except asyncio.CancelledError:
            kill_group(proc.pid)
            for r in readers:
                r.cancel()
            raise
        # a background job that kept the shell's output open must not hold the call
        await asyncio.wait(readers, timeout=DRAIN_AFTER_EXIT)
        for r in readers:
            r.cancel()
        return ExecResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            return_code=code,
        )


async def drain(stream: asyncio.StreamReader, into: bytearray) -> None:
    while chunk := await stream.read(65536):
        into += chunk


def kill_marked(marker: str) -> int:
    """Kill every process whose environment carries this trial's marker; how many were. A
    process caught inside `execve` is waited for (`kill_strays`'s `settle`)."""
    return kill_strays({f"{MARKER}={marker}".encode()}, settle=EMPTY_PASSES)


def asks_for_internet(task_dir: Path) -> bool:
    """Whether a task's `task.toml` says it needs the internet: read as written, since Harbor's
    default of "public", which every task has unless it says otherwise, is taken here as no
    network."""
    try:
        config = tomllib.loads((task_dir / "task.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    environment = config.get("environment", {})
    return environment.get("network_mode") == "public" or environment.get("allow_internet") is True
