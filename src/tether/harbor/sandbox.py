"""A Harbor environment in a bubblewrap sandbox: tasks written for Docker run unchanged.

    harbor run --path examples/terminal-tasks --env tether.harbor.sandbox:SandboxEnvironment \\
        --agent tether.harbor.agent:TetherAgent --model openai/gpt-5

A trial gets one sandbox for its life, as a container would be, with a root of its own
(`rootfs.py`): the host's system directories copy-on-write (a task may install into /usr/local
or add a user; the host never changes), `/app`, `/logs`, `/tests`, `/solution`, `/tmp` and the
homes ordinary directories of the trial's, so a script that writes
`/logs/verifier/reward.txt` does so, with no mapping of paths in command lines
(`LocalEnvironment`'s way, which a task's own scripts never saw). Of the host it sees the
system: not the homes, services' state or any other directory where data may be kept, nor
`/etc`'s secrets; there is no network (only a loopback of its own); the environment holds no
variable of the host's (no secrets), only what Harbor passes; no command holds a capability.

Every command runs inside the trial's PID namespace, so a process one command leaves running
(a server, `nohup`) is still there for the next, as in a container, and `stop` ends them all at
once: the namespace's first process goes, and the kernel kills the rest. Commands reach the
sandbox through a small server inside it (`SERVER`, on the standard library), spoken to over a
pipe in JSON lines: a request names its command, working directory, environment and time
limit; the reply carries the output and exit status (124 on a time-out, the command's process
group killed). A call cancelled here kills its command there.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import posixpath
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from harbor.environments.base import ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from ..errors import known
from ..tools.sandbox import bwrap, system_view
from . import transfer
from .build import (
    BASE_ENV,
    base_commands,
    base_differs,
    base_env,
    building,
    evict,
    images,
    in_use,
    key,
)
from .channel import Channel
from .dockerfile import Copy, Image, Run, ready_script
from .environment import (
    DOCKERFILE,
    VARIABLES,
    LocalEnvironment,
    asks_for_internet,
    check_user,
    refuse_what_cannot_be_given,
)
from .rootfs import ROOT_SCRIPT, Root, map_users_told, remove, visible
from .server import SERVER

REPLY_LIMIT = 16 << 20
"""The longest reply line read: two streams' kept bytes (`KEEP`), in base64, fit with room."""
LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
OVERLAY_NEEDS = "a trial's copy-on-write root needs overlayfs in a user namespace: Linux 5.11+"


class SandboxEnvironment(LocalEnvironment):
    """Runs the trial's commands inside one bubblewrap sandbox that lives as long as the trial."""

    def __init__(self, *args: Any, network: bool | str = False, **kwargs: Any) -> None:
        """`network` (`--ek network=true`): the trials share this machine's network, loopback
        included, as a task that asks for the internet needs (by default they have none)."""
        super().__init__(*args, **kwargs)
        self.shared_network = str(network).lower() in ("true", "1", "yes")
        self.rootfs = Root(self.root)
        self.server: asyncio.subprocess.Process | None = None
        self.channel: Channel | None = None  # the server's pipes, once it is ready
        self.net = False  # the host's network: a build's only
        self.holding: int | None = None  # the image's `in_use` lock, for the trial's life

    @staticmethod
    def type() -> str:
        return "tether-sandbox"

    # -- the root -------------------------------------------------------------------------

    def absolute(self, path: str) -> str:
        """A container path as the container has it: relative to the workdir, `..` kept
        inside the container."""
        return os.path.normpath(path if path.startswith("/") else f"{self.workdir()}/{path}")

    def local(self, path: str) -> Path:
        """Where a container path is on the host: in the trial's root, or (before the
        sandbox starts) in its overlay's upper layer."""
        return self.rootfs.host_path(self.absolute(path))

    def variables(self) -> dict[str, str]:
        """$APP_DIR and the like, for tasks written for `LocalEnvironment`: the paths
        themselves, $APP_DIR the workdir (the place `LocalEnvironment` maps it to)."""
        return {name: f"/{place}" for place, name in VARIABLES.items()} | {
            "APP_DIR": self.workdir()
        }

    def image_env(self) -> dict[str, str]:
        """The Dockerfile's `ENV` as written: its paths are where they say in the sandbox."""
        return dict(self.image.env)

    def make_places(self) -> None:
        """The root's layers, then the container's directories; the logs' are writable by
        every user, as Harbor makes the directories it mounts there (the agent may run as a
        user of the task's image)."""
        self.made_root()
        self.rootfs.prepare()
        base_commands(self.image, self.rootfs)
        super().make_places()
        for logs in LOG_DIRS:
            self.local(logs).chmod(0o777)

    def argv(
        self, command: list[str] | None = None, waits: tuple[int, int] | None = None
    ) -> list[str]:
        """bubblewrap's command line: the namespaces, the host's system read-only (`/etc`'s
        secrets hidden) for the first step, then `ROOT_SCRIPT`, which makes the trial's root
        (`rootfs.Root`) and becomes `command` (by default the sandbox's server) in the
        workdir. The trial runs as root of its namespace, as a container's commands do (for an
        ordinary user, as rootless Docker's). With `waits` (the file descriptors bubblewrap
        blocks on and tells its pid through), it waits for Tether to map the trial's users
        (`rootfs.map_users`). The server's interpreter is there, wherever it lives."""
        argv = [bwrap(), "--unshare-all", "--die-with-parent", "--new-session", *system_view()]
        shared = self.net or self.shared_network
        argv += ["--proc", "/proc", "--dev", "/dev", *(["--share-net"] if shared else [])]
        if waits is None:
            argv += ["--uid", "0", "--gid", "0"]
        else:
            argv += ["--unshare-user", "--userns-block-fd", str(waits[0])]
            argv += ["--info-fd", str(waits[1])]
        python = interpreter()
        prefix = os.path.realpath(sys.base_prefix)
        outside = [prefix] if python.startswith(prefix + "/") and not visible(prefix) else []
        argv += [a for p in outside for a in ("--ro-bind", p, p)]  # e.g. a pyenv in ~
        users = waits is not None
        argv += self.rootfs.bwrap_args(users)
        then = command or [python, "-I", "-c", SERVER]
        spec = self.rootfs.spec(then, cwd=self.workdir(), read_only=outside, users=users)
        return [*argv, "--", python, "-I", "-c", ROOT_SCRIPT, spec]

    @property
    def users(self) -> bool:
        """Whether the trial maps the host's users (`rootfs.USERS`): only root may."""
        return os.geteuid() == 0

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)  # a trial has no network

    async def start(self, force_build: bool) -> None:
        refuse_what_cannot_be_given(self.environment_dir, self.task_env_config)
        if asks_for_internet(self.environment_dir.parent) and not self.shared_network:
            raise RuntimeError(
                'the task asks for the internet ([environment] network_mode = "public" or '
                "allow_internet = true); trials in this sandbox have no network unless given "
                "it (--ek network=true: this machine's network, loopback included)"
            )
        self.check_image()
        image = await self.built(force_build)
        self.rootfs = Root(self.root, image=image)
        self.make_places()
        if image is None:
            self.place_files()  # into the layers, before they are mounted
        await self.serve()
        await self.start_entrypoint()
        await self.run_setup()

    def check_image(self) -> None:
        """As `LocalEnvironment`'s, and a base that is not this host's system is named."""
        super().check_image()
        differs = base_differs(self.image.base)
        if differs and (self.environment_dir / DOCKERFILE).is_file():
            self.logger.warning(f"environment/{DOCKERFILE} {differs}")

    def not_run(self) -> list[str]:
        """Only what no container runs under Harbor either (`CMD`, `HEALTHCHECK` ...): the
        sandbox builds the image and starts its entrypoint."""
        return list(self.image.ignored)

    async def start_entrypoint(self) -> None:
        """The image's `ENTRYPOINT`, started in the background as the container's first
        process would be, with the arguments Harbor's containers give it (`sh -c "sleep
        infinity"`, in `CMD`'s place): an entrypoint that starts a service and then runs its
        arguments works as in Docker. It lives as long as the trial."""
        if not self.image.entrypoint:
            return
        argv = shlex.join([*self.image.entrypoint, "sh", "-c", "sleep infinity"])
        await self.exec(f"nohup {argv} > /dev/null 2>&1 &")
        await self.exec(ready_script(self.image.exposed), user=0)  # bounded: never fails

    async def serve(self) -> None:
        """Start the sandbox's server and wait for it to say it is ready."""
        self.server = await self.launch()
        stdout = known(self.server.stdout, "the sandbox server's stdout pipe")
        stderr = known(self.server.stderr, "the sandbox server's stderr pipe")
        first = await stdout.readline()
        if not first.startswith(b'{"ready"'):
            why = (await stderr.read()).decode(errors="replace").strip()
            raise RuntimeError(
                f"the sandbox did not start: {why or 'no reason given'}"
                + (f" ({OVERLAY_NEEDS})" if "the trial's root" in why else "")
            )
        self.channel = Channel(self.server)

    async def end(self) -> None:
        """End the sandbox, and with it every process in it."""
        if self.server is not None:
            if self.server.returncode is None:
                self.server.kill()  # bubblewrap's namespace goes with it, and all inside
            await self.server.wait()
        if self.channel is not None:
            await self.channel.closed()

    # -- the image ------------------------------------------------------------------------

    async def built(self, force: bool) -> Path | None:
        """The task's image (`build.py`), built now unless kept (or `force`d); None when its
        Dockerfile runs nothing, its copies then going straight into the trial's layers."""
        if not self.image.runs and self.image.user is None and not self.image.from_stages:
            return None
        into = images() / key(self.environment_dir)
        async with building(into):
            if into.is_dir() and not force:
                self.holding = in_use(into)
                return into
            if into.is_dir():
                remove(into)
            await self.build(into)
            self.holding = in_use(into)
        evicted = evict(keep=into)  # the cache stays within its bound, oldest out first
        if evicted:
            self.logger.info(f"image cache: removed {len(evicted)} least recently used")
        return into

    async def build(self, into: Path) -> None:
        """The Dockerfile's copies and runs in order, in a sandbox of the build's own with the
        host's network; what they wrote kept as the image `into` (nothing when one fails). A
        multi-stage build builds each stage its copies take files from first, each in a
        sandbox of its own, alive until the last stage has taken what it needs."""
        started = time.monotonic()
        deadline = started + self.task_env_config.build_timeout_sec
        stages: dict[str, SandboxEnvironment] = {}
        self.rootfs, self.net = Root(into.with_name(f"{into.name}.{uuid.uuid4().hex}")), True
        try:
            for name in self.image.from_stages:
                image = self.image.stages[name]
                same = next((s for s in stages.values() if s.image is image), None)
                stages[name] = same or await self.stage_built(image, into, deadline)
            await self.steps_built(deadline, stages)
            await self.end()
            self.rootfs.keep_as(into)
        finally:
            await self.end()
            self.net, self.server, self.channel = False, None, None
            remove(self.rootfs.trial)
            for stage in {id(s): s for s in stages.values()}.values():
                await stage.end()
                remove(stage.rootfs.trial)
        took = time.monotonic() - started
        self.logger.info(f"environment/{DOCKERFILE}: built in {took:.1f} s, kept in {into}")

    async def steps_built(self, deadline: float, stages: dict[str, SandboxEnvironment]) -> None:
        """This image's steps in its build root, its sandbox left running."""
        self.make_places()
        await self.serve()
        for step in self.image.steps:
            if isinstance(step, Copy) and step.stage is not None:
                await self.copy_from(step, stages[step.stage])
            elif isinstance(step, Copy):
                await self.copy_step(step)
            else:
                await self.run_step(step, deadline)

    async def stage_built(self, image: Image, into: Path, deadline: float) -> SandboxEnvironment:
        """An earlier stage of a multi-stage build, built in a sandbox of its own, left
        running for the copies that take files from it."""
        stage = copy.copy(self)  # the same task, environment and settings; its own root
        stage.image, stage.server, stage.channel = image, None, None
        stage.rootfs = Root(into.with_name(f"{into.name}.stage-{uuid.uuid4().hex}"))
        try:
            await stage.steps_built(deadline, {})
        except BaseException:
            await stage.end()
            remove(stage.rootfs.trial)
            raise
        return stage

    async def copy_from(self, copy: Copy, stage: SandboxEnvironment) -> None:
        """A `COPY --from=STAGE`: each source out of the stage's sandbox (a directory's
        contents, a file by its name), laid out as it lands here, then in as `copy_step`
        puts the build context's files."""
        with tempfile.TemporaryDirectory(prefix="tether-stage-") as staged:
            laid = Path(staged)
            target = laid / copy.destination.lstrip("/")
            await self.directory_there(copy.destination, laid)
            into_directory = copy.destination.endswith("/") or len(copy.sources) > 1
            into_directory = into_directory or target.is_dir()
            for source in copy.sources:
                q = shlex.quote(source)  # what it is, in one round trip
                probe = f"if [ -d {q} ]; then echo d; elif [ -e {q} ]; then echo f; fi"
                kind = ((await stage.exec(probe, user=0)).stdout or "").strip()
                if kind not in ("d", "f"):
                    raise RuntimeError(
                        f"environment/{DOCKERFILE} {copy.instruction}: {source} is not in "
                        f"stage {copy.stage}"
                    )
                if kind == "d":
                    await stage.download(source, target, contents=True)
                else:
                    name = posixpath.basename(source)
                    await stage.download(source, target / name if into_directory else target, False)
            async with self.passage() as via:
                transfer.copy_in(laid, self.rootfs.fs, f"{via}/x", contents=True)
                await self.inside(f"tar -C {via}/x -cf - . | tar -C / -xpf - --no-overwrite-dir")

    async def directory_there(self, destination: str, laid: Path) -> None:
        """A copy's destination that is a directory in the image so far, made in the layout
        too: `COPY file /app` where /app is a directory puts the file in it, as Docker does
        (laid out as a file named `app`, it replaced the directory: a real task's `RUN mkdir
        -p /app` then `COPY --chown=1000:1000 encrypted.txt /app` failed the build)."""
        there = await self.exec(f"test -d {shlex.quote(destination)}", user=0)
        if there.return_code == 0:
            (laid / destination.lstrip("/")).mkdir(parents=True, exist_ok=True)

    async def copy_step(self, copy: Copy) -> None:
        """A `COPY`/`ADD` in the build: laid out under a passage as it lands in the root,
        then unpacked over `/` inside (existing directories keep their owners and modes)."""
        with tempfile.TemporaryDirectory(prefix="tether-copy-") as staged:
            stage = Path(staged)  # laid out privately: a process a RUN left cannot meet it
            await self.directory_there(copy.destination, stage)
            self.put_in_place(copy, lambda path: stage / path.lstrip("/"))
            async with self.passage() as via:
                transfer.copy_in(stage, self.rootfs.fs, f"{via}/x", contents=True)
                await self.inside(f"tar -C {via}/x -cf - . | tar -C / -xpf - --no-overwrite-dir")

    async def run_step(self, run: Run, deadline: float) -> None:
        """A `RUN`, in its directory (made, as Docker makes a `WORKDIR`), as its user, with
        its environment, within what is left of the build's time."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(
                f"environment/{DOCKERFILE} {run.instruction}: not started, the build took "
                f"its {self.task_env_config.build_timeout_sec:.0f} s"
            )
        await self.inside(f"mkdir -p {shlex.quote(run.workdir)}")
        environ = {**base_env(self.image), **run.env}
        done = await self.request(shlex.join(run.argv), run.workdir, environ, left, run.user)
        if done.return_code != 0:
            tail = (done.stderr or done.stdout or "").strip()[-2000:]
            raise RuntimeError(
                f"environment/{DOCKERFILE} {run.instruction}: exit status {done.return_code}"
                + (f": {tail}" if tail else "")
            )

    async def launch(self, command: list[str] | None = None) -> asyncio.subprocess.Process:
        """Start the trial's sandbox running `command` (by default its server), its users
        mapped when they can be: bubblewrap says its pid on one pipe and waits on another
        while the map is written."""
        if not self.users:
            return await self.spawn(self.argv(command), ())
        block_r, block_w = os.pipe()
        info_r, info_w = os.pipe()
        try:
            process = await self.spawn(self.argv(command, (block_r, info_w)), (block_r, info_w))
        finally:
            os.close(block_r)
            os.close(info_w)
        try:
            await asyncio.to_thread(map_users_told, info_r)
        finally:
            os.close(info_r)
            os.close(block_w)  # the end of the wait (bubblewrap reads end of file)
        return process

    async def spawn(self, argv: list[str], fds: tuple[int, ...]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv,
            limit=REPLY_LIMIT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=BASE_ENV,
            start_new_session=True,
            pass_fds=fds,
        )

    async def stop(self, delete: bool) -> None:
        """End the sandbox, and with it every process of the trial."""
        await self.end()
        if self.holding is not None:
            os.close(self.holding)  # the image may go from the cache now
            self.holding = None
        if delete and self.root.exists():
            remove(self.root)

    # -- files ----------------------------------------------------------------------------
    # The trial's processes write its root as they please, links included, so the host never
    # opens a path of the trial by name (`transfer.py`). Once the sandbox runs, a file goes
    # through a passage, a fresh directory of the root that the host reaches by descriptor, and
    # is copied between the passage and its place inside the sandbox, as `docker cp` copies:
    # there a link reaches only the trial's own files, and a mounted overlay's (/usr, /etc,
    # /var) upper layer, which is the kernel's, is reached too. Before the sandbox starts
    # no process of the trial has run, and files go straight into its layers.

    def place(self, path: str) -> tuple[Path, str]:
        """The host directory a container path lies under, and the path inside it."""
        full = self.absolute(path)
        overlay = self.rootfs.overlay_of(full)
        if overlay is None:
            return self.rootfs.fs, full
        return self.rootfs.upper(overlay), full[len(overlay) :]

    @property
    def running(self) -> bool:
        return self.server is not None

    @contextlib.asynccontextmanager
    async def passage(self) -> AsyncIterator[str]:
        """A directory of the trial's root that the host (by descriptor, `transfer.py`) and
        the sandbox both reach, gone after."""
        name = f"/.tether-transfer-{uuid.uuid4().hex}"
        with transfer.directory(self.rootfs.fs, "") as root:
            os.mkdir(name[1:], 0o700, dir_fd=root)
        try:
            yield name
        finally:
            with transfer.directory(self.rootfs.fs, "") as root:
                shutil.rmtree(name[1:], dir_fd=root, ignore_errors=True)

    async def inside(self, command: str) -> None:
        """A copy made inside, as `docker cp` makes it: as root (the trial's only user, where
        its users are not mapped, whom the server cannot switch to)."""
        user = 0 if self.users else None
        done = await self.request(command, "/", dict(BASE_ENV), None, user)
        if done.return_code != 0:
            raise RuntimeError(f"{command}: {(done.stderr or done.stdout or '').strip()}")

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.upload(Path(source_path), target_path, contents=False)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.upload(Path(source_dir), target_dir, contents=True)

    async def upload(self, source: Path, target_path: str, contents: bool) -> None:
        """A host file (or a directory's contents) to a container path; the source's links
        go as links."""
        if not self.running:
            return transfer.copy_in(source, *self.place(target_path), contents=contents)
        target = shlex.quote(self.absolute(target_path))
        async with self.passage() as via:
            transfer.copy_in(source, self.rootfs.fs, f"{via}/x")
            where = target if contents else shlex.quote(os.path.dirname(self.absolute(target_path)))
            into = f"{via}/x/. {target}/" if contents else f"{via}/x {target}"
            await self.inside(f"mkdir -p {where} && cp -a {into}")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """A container file to the host, read through its links inside the sandbox."""
        await self.download(source_path, Path(target_path), contents=False)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """A container directory's contents to the host, its links kept as links."""
        await self.download(source_dir, Path(target_dir), contents=True)

    async def download(self, source_path: str, target: Path, contents: bool) -> None:
        if not self.running:
            base, inside = self.place(source_path)
            return transfer.copy_out(base, inside, target, contents=contents)
        source = shlex.quote(self.absolute(source_path))
        async with self.passage() as via:
            if contents:
                await self.inside(f"mkdir {via}/x && cp -a {source}/. {via}/x/")
            else:
                await self.inside(f"cp -L --preserve=mode,timestamps {source} {via}/x")
            transfer.copy_out(self.rootfs.fs, f"{via}/x", target, contents=contents)

    # -- commands -------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` with bash in the sandbox, in the workdir (or `cwd`); on a time-out
        its process group is killed and the status is 124, as with coreutils' `timeout`."""
        user = self._resolve_user(user)
        if user is None:
            user = self.image.user  # as `docker exec` runs as the image's USER
        if not self.users:
            check_user(user)
        environ = {
            **base_env(self.image),
            **self.image_env(),
            **(self._merge_env(env) or {}),
            **self.variables(),
        }
        return await self.request(command, cwd or self.workdir(), environ, timeout_sec, user)

    async def request(
        self,
        command: str,
        cwd: str,
        environ: dict[str, str],
        seconds: float | None,
        user: str | int | None,
    ) -> ExecResult:
        """One command for the sandbox's server, and its reply."""
        if self.channel is None:
            raise RuntimeError("the trial's sandbox is not running")
        return await self.channel.request(command, cwd, environ, seconds, user)


def interpreter() -> str:
    """A Python the sandbox can see, for its server (the standard library is all it needs):
    this one's real file, unless that is under /tmp (the sandbox has a /tmp of its own: a
    virtualenv in /tmp, as in a CI checkout, is not there), then the system's."""
    real = os.path.realpath(sys.executable)
    if not real.startswith("/tmp/"):
        return real
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if found is None or os.path.realpath(found).startswith("/tmp/"):
        raise RuntimeError(f"the sandbox needs a Python outside /tmp; this one is {real}")
    return found


def available() -> bool:
    """Whether bubblewrap is installed (whether it can make a sandbox here shows at start)."""
    return shutil.which("bwrap") is not None
