"""What many test files share: the CLI as a user runs it (started warm: see warm.py), free
ports, and waits.

Every wait here waits on a condition and raises, naming what it waited for, when the time is
up: a test never sleeps a fixed time hoping something has happened, and never carries on after
a wait that timed out. Each test has its own data directory (conftest sets XDG_DATA_HOME), so
tests can run in parallel (pytest-xdist) without sharing journals or a default store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

import warm
from tether import AnthropicModel, HTTPSettings, OpenAIChatModel, OpenAIResponsesModel, tool
from warm import cli_env

FIXTURES = Path(__file__).parent / "fixtures"
TETHER = [sys.executable, "-m", "tether"]


CLIENTS = {"chat": OpenAIChatModel, "responses": OpenAIResponsesModel, "anthropic": AnthropicModel}
"""The three protocols' clients, by the names tests are parametrized with."""


def wire_model(protocol: str, url: str, stream: bool = True) -> Any:
    """A client of `protocol` for the wire mock at `url`, that neither retries nor waits."""
    fast = HTTPSettings(max_retries=0, read_timeout=5)
    return CLIENTS[protocol]("m", api_key="k", base_url=url, stream=stream, settings=fast)


def tether(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 60,
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    """Run `tether ARGS` to its end, as a user would, and return what it printed. The
    environment is `env` (default: `cli_env()`) with `extra` laid over it."""
    return warm.run(
        [*TETHER, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**(cli_env() if env is None else env), **extra},
    )


def json_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects of a `--json` output, one a line."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def free_port() -> int:
    """A port nobody listens on now (for a server that cannot be told to bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Deadline:
    """The end of a wait: `check` raises, naming what was waited for, once it has passed."""

    def __init__(self, timeout: float, what: str) -> None:
        self.end, self.timeout, self.what = time.monotonic() + timeout, timeout, what

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise AssertionError(f"timed out after {self.timeout} s waiting for {self.what}")


def wait_until[T](
    predicate: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.02
) -> T:
    """Poll `predicate` until it returns something true and return that; raise
    AssertionError naming `what` if `timeout` seconds pass first."""
    deadline = Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        time.sleep(interval)
    return value


async def until[T](
    predicate: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.01
) -> T:
    """`wait_until` for a test's event loop: polls without blocking it."""
    deadline = Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        await asyncio.sleep(interval)
    return value


async def within[T](awaitable: Awaitable[T], what: str, timeout: float = 30.0) -> T:
    """Await something that must happen within `timeout` seconds."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


def alive(pid: int) -> bool:
    """Whether a process is running (a zombie waiting to be reaped counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # it may end between the two looks: then its /proc entry is gone as it is read
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:  # FileNotFoundError, or ProcessLookupError mid-read
        return False


def holders(mark: str) -> list[str]:
    """The live processes whose command line holds `mark`, as `pid ppid state comm` lines: what
    a failed wait for them to end says was left."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark.encode() in (proc / "cmdline").read_bytes():
                stat = (proc / "stat").read_text()
                comm = stat[stat.index("(") : stat.rindex(")") + 1]
                state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
                found.append(f"{proc.name} {ppid} {state} {comm}")
        except OSError:
            continue
    return found


def running(mark: str, named: bool = False) -> bool:
    """Whether a live process's command line holds `mark` (`exec -a MARK sleep 300` names
    one so), in any pid namespace this one can see; `named`: only the process whose own name
    (argv[0]) is `mark`, not one whose arguments hold it (bubblewrap's, or a shell's)."""
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (argv[0] == mark.encode()) if named else mark.encode() in b"\0".join(argv):
                return alive(int(proc.name))
        except OSError:
            continue
    return False


class Output:
    """The lines a process writes to one of its pipes, read in a thread as they come, so a
    test can wait for a line without blocking on the pipe."""

    def __init__(self, pipe: Any) -> None:
        self.lines: list[str] = []
        self.closed = threading.Event()
        self._pipe = pipe
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._pipe:
            self.lines.append(line.rstrip("\n"))
        self.closed.set()

    def wait_for(self, needle: str, timeout: float = 30.0) -> str:
        """The first line that contains `needle`, once it has been written."""

        def found() -> str | None:
            hit = next((line for line in self.lines if needle in line), None)
            if hit is None and self.closed.is_set():
                raise AssertionError(f"the output ended without {needle!r}: {self.lines[-5:]}")
            return hit

        return wait_until(found, f"a line with {needle!r}", timeout)

    def text(self) -> str:
        self.closed.wait(30)
        return "\n".join(self.lines)


@tool
async def nap(seconds: float) -> str:
    """Sleep a while (a tool that holds a run in a tool call)."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


def png(rgb: tuple[int, int, int] = (200, 30, 30), size: int = 4) -> bytes:
    """A real PNG of one colour (a square of `size` pixels), made with the standard library."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = b"\x00" + bytes(rgb) * size
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * size))
        + chunk(b"IEND", b"")
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Hostile:
    """An HTTP server on 127.0.0.1 that answers every POST with the handler a test sets; it
    notes what happened to it (e.g. that the client stopped reading)."""

    def __init__(self) -> None:
        self.handler: Handler | None = None
        self.notes: list[str] = []
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self.serve(ready),), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    async def serve(self, ready: threading.Event) -> None:
        """Serve until `stop`, then end the answers still running: a test that stops it
        while a client hangs on an answer leaves no task behind."""
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.answer)
        runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await self._stopped.wait()
        await runner.cleanup()

    async def answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        assert self.handler is not None
        return await self.handler(request)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stopped.set)
        self.thread.join(10)


async def stream(request: web.Request) -> web.StreamResponse:
    """An event stream begun in answer to `request` (a `Hostile` handler writes the rest)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


@contextmanager
def store_runs(url: str) -> Iterator[Callable[..., dict[str, dict[str, Any]]]]:
    """`runs(*states)`: the runs of the store at `url` (those in `states`, if given), by id, as
    `tether runs --json` lists them, read in this process: a wait that polled `tether runs`
    started a process every poll (half a second of CPU, taken from the runs it waited for)."""
    from tether.durable.view import client, list_runs

    reader = client(url)
    try:
        yield lambda *states: {r["id"]: r for r in list_runs(reader, list(states) or None)}
    finally:
        reader.destroy()


BREAKOUTS = """
mount -o remount,rw / 2>/dev/null && echo ESCAPED-remount
umount -l /proc 2>/dev/null && echo ESCAPED-umount
echo x > "$ESCAPE" 2>/dev/null  # a write inside is no escape; reaching the host's is checked there
eff=$(awk '/^CapEff/ {print $2}' /proc/self/status)
[ $(( 0x$eff & ~$ALLOWED_CAPS )) -eq 0 ] || echo ESCAPED-capabilities
python3 -c "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])" \
    "$HOST_SOCKET" 2>/dev/null && echo ESCAPED-socket
ls /run/postgresql /var/run/postgresql 2>/dev/null | grep -q PGSQL && echo ESCAPED-postgres
cat "$PLANTED_HOME" 2>/dev/null | grep -q planted && echo ESCAPED-home
cat $PLANTED_STORES 2>/dev/null | grep -q planted && echo ESCAPED-store
grep -q '^root:' /etc/shadow 2>/dev/null && echo ESCAPED-shadow
test -x /usr/bin/env && echo system-visible
echo probed
"""


def probe_sandbox(
    argv_for: Callable[[str], list[str]],
    user: str,
    run: Callable[[str], tuple[str, str]] | None = None,
    allowed_caps: int = 0,
    pass_fds: tuple[int, ...] = (),
) -> str:
    """What `BREAKOUTS` prints run in the sandbox `argv_for(probe)` makes, as `user` (`root`,
    or `nobody` by `setpriv`): with a Unix socket of the test's own in /run (as Postgres's
    and Docker's are), a secret planted in the user's home, stores planted in services'
    directories (0644: the case is a sandbox that shows them at all), and a path in /etc for
    a write. It fails unless the probe ran to its end with the system visible, or when the
    write reached /etc; everything planted is removed whatever happens. `run` runs the probe
    itself (its stdout and stderr) where a sandbox is not one command line; a capability
    beyond `allowed_caps` (a mask) is an escape."""
    tag = f"{os.getpid()}-{user}"
    escape = Path(f"/etc/tether-escape-{tag}")
    home = Path.home() / f".tether-planted-{tag}"
    stores = [Path(f"{d}/tether-planted-{tag}/runs.sqlite") for d in ("/var/lib", "/srv")]
    with contextlib.ExitStack() as undo:
        undo.callback(escape.unlink, missing_ok=True)
        socket_path = Path(f"/run/tether-test-{tag}.sock")
        server = undo.enter_context(socket.socket(socket.AF_UNIX))
        server.bind(str(socket_path))
        undo.callback(socket_path.unlink, missing_ok=True)
        socket_path.chmod(0o777)
        server.listen()
        for planted in (home, *stores):
            planted.parent.mkdir(exist_ok=True)
            if planted is not home:
                undo.callback(shutil.rmtree, planted.parent, ignore_errors=True)
            undo.callback(planted.unlink, missing_ok=True)
            planted.write_text("planted secret\n")
            planted.chmod(0o644)
        probe = BREAKOUTS.replace("$HOST_SOCKET", str(socket_path)).replace("$ESCAPE", str(escape))
        probe = probe.replace("$PLANTED_HOME", str(home))
        probe = probe.replace("$PLANTED_STORES", " ".join(map(str, stores)))
        probe = probe.replace("$ALLOWED_CAPS", str(allowed_caps))
        if run is not None:
            out, err = run(probe)
        else:
            argv = argv_for(probe)
            if user == "nobody":
                argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=60, check=False, pass_fds=pass_fds
            )
            out, err = done.stdout, done.stderr
        assert not escape.exists(), "a write reached /etc"
    assert out.strip().endswith("system-visible\nprobed"), out + err
    return out


def program_output(source: str, store: str) -> dict[str, Any]:
    """What a Python program of its own (a process has one store) printed last, as JSON; it
    must exit 0."""
    done = warm.run(
        [sys.executable, "-c", source, store],
        capture_output=True, text=True, timeout=60, env=cli_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen
