"""The processes the tests start, started warm: `python -m tether ...` and the tests' Python
programs begin as a fork of a process that has already imported Tether, DBOS with SQLAlchemy,
aiohttp and pydantic, instead of as a new interpreter importing them all again.

Why: the suite starts about 340 of them, and a new interpreter spends most of a short run
importing. A `tether run` of the scripted weather example takes 0.53 s of CPU in memory and
1.46 s on SQLite as a new interpreter; forked warm, 0.10 s and 0.23 s (medians of five on a
2-core machine). That was most of the suite's CPU.

What stays as it was: each is a process of its own, with its own pid, pipes, environment,
working directory and exit status; signals reach it alone (kill -9 kills it and nothing else);
it runs the same `tether/__main__.py` or script with the arguments, environment and directory
the test gives. What differs: its imports ran in the warm process, before the fork. So a
command whose environment differs from the warm process's in what Python reads as it starts
(PYTHON*, the locale) starts as a new interpreter, as does anything that is not `python -m
tether`, `python -c` or `python SCRIPT.py`, and `TETHER_TEST_FRESH=1` starts every process
new, as a user's shell does. The console script and what a cold start imports are tested by
tests/test_entry.py; what importing costs is measured by bench/startup.py.

`Popen` and `run` take `subprocess`'s arguments (the ones the tests use) and give its results.
The warm process (`serve`, when this file runs as a script) forks one child a request, tells
the test its pid and, when it has reaped it, its exit status; it ends when the test process
that started it ends (its stdin closes).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from functools import cache
from pathlib import Path
from typing import IO, Any

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
SRC = str(Path(__file__).parent.parent / "src")
MESSAGE = 1 << 20  # the largest request (arguments and environment)


def startup(env: dict[str, str]) -> dict[str, str]:
    """What of an environment Python reads as it starts: a warm child whose environment
    differs from the warm process's in these would not be the process a user gets."""
    locale = ("LANG", "LC_ALL", "LC_CTYPE")
    return {k: v for k, v in env.items() if k.startswith("PYTHON") or k in locale}


def program(args: list[str]) -> list[str] | None:
    """The interpreter's arguments of `args` when a warm process can run it, else None."""
    if os.environ.get("TETHER_TEST_FRESH") or not args or args[0] != sys.executable:
        return None
    rest = list(args[1:])
    if rest[:2] == ["-m", "tether"] or (rest[:1] == ["-c"] and len(rest) > 1):
        return rest
    return rest if rest and rest[0].endswith(".py") else None


# The test's end ------------------------------------------------------------------------------


class Forkserver:
    """The warm process of one test process: started on first use, ended when the test
    process exits."""

    def __init__(self, env: dict[str, str]) -> None:
        self.address = f"\0tether-warm-{os.getpid()}-{uuid.uuid4().hex}"
        self.env = startup(env)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
            listener.bind(self.address)
            listener.listen(64)
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(listener.fileno())],
                stdin=PIPE,
                stdout=DEVNULL,
                pass_fds=[listener.fileno()],
                env=env,
            )
        atexit.register(self.close)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # the warm process ends; its children run on
        self.process.wait()


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `tether` process: this one's without the provider keys (a test
    names the keys it means), with the source tree importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@cache
def forkserver() -> Forkserver:
    return Forkserver(cli_env())


def child_end(how: Any, default: int) -> tuple[int, int | None]:
    """The descriptor a child gets for `how` (subprocess's PIPE, DEVNULL, None, a descriptor
    or a file), and the parent's end when it is a pipe."""
    if how is None:
        return default, None
    if how == PIPE:
        read, write = os.pipe()
        return (read, write) if default == 0 else (write, read)
    if how == DEVNULL:
        return os.open(os.devnull, os.O_RDWR), None
    return (how if isinstance(how, int) else how.fileno()), None


class Warm(subprocess.Popen[Any]):
    """A process forked from the warm process: a `subprocess.Popen` to the test (pid, pipes,
    poll, wait, communicate, send_signal, kill), whose exit status the warm process reports
    because it, not the test, is the parent."""

    def __init__(
        self,
        args: list[str],
        rest: list[str],
        *,
        stdin: Any = None,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        # Popen.__init__ is not called: it would start a process. What its other methods and
        # __del__ read is set here.
        self.args, self.returncode, self._child_created = args, None, False
        self.text_mode = self.universal_newlines = text
        self.encoding, self.errors = None, None
        self._lock = threading.Lock()
        self._communication: tuple[list[threading.Thread], dict[str, Any]] | None = None
        ends = [child_end(stdin, 0), child_end(stdout, 1)]
        ends.append((ends[1][0], None) if stderr == STDOUT else child_end(stderr, 2))
        request = {
            "args": rest,
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd or os.getcwd()),
        }
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._conn.connect(forkserver().address)
            socket.send_fds(self._conn, [json.dumps(request).encode()], [e[0] for e in ends])
            answer = self._conn.recv(MESSAGE)
        finally:
            for (child, parent), how in zip(ends, (stdin, stdout, stderr), strict=True):
                if parent is not None or how == DEVNULL:
                    os.close(child)
        if not answer:
            raise RuntimeError("the tests' warm process ended: see its error above")
        self.pid = json.loads(answer)["pid"]
        mode = ["wb", "rb", "rb"]
        files = [
            None if parent is None else self._file(parent, mode[i], text)
            for i, (_, parent) in enumerate(ends)
        ]
        self.stdin, self.stdout, self.stderr = files

    @staticmethod
    def _file(fd: int, mode: str, text: bool) -> IO[Any]:
        if not text:
            return open(fd, mode)
        if mode == "wb":  # as Popen's: written through to the buffer, flushed by the caller
            stdin = open(fd, "w", encoding="utf-8")  # noqa: SIM115
            stdin.reconfigure(write_through=True)
            return stdin
        return open(fd, encoding="utf-8")

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        status = self._status(timeout)
        if status is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return status

    def _status(self, timeout: float | None) -> int | None:
        """The exit status, once the warm process has reported it (waiting up to `timeout`)."""
        with self._lock:
            if self.returncode is None:
                self._conn.settimeout(timeout)
                try:
                    answer = self._conn.recv(MESSAGE)
                except (TimeoutError, BlockingIOError):
                    return None
                if not answer:
                    raise RuntimeError(f"the tests' warm process lost process {self.pid}")
                self.returncode = json.loads(answer)["returncode"]
                self._conn.close()
            return self.returncode

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Write `input`, read both outputs to their end and wait, as Popen's does; after a
        TimeoutExpired it may be called again (after kill, say) and carries on."""
        if self._communication is None:
            self._communication = self._start_communication(input)
        threads, output = self._communication
        end = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if end is None else max(0.0, end - time.monotonic()))
        return output.get("stdout"), output.get("stderr")

    def _start_communication(self, input: Any) -> tuple[list[threading.Thread], dict[str, Any]]:
        output: dict[str, Any] = {}

        def feed(pipe: IO[Any]) -> None:
            try:
                if input:
                    pipe.write(input)
                pipe.close()
            except BrokenPipeError:
                pass

        def read(name: str, pipe: IO[Any]) -> None:
            output[name] = pipe.read()
            pipe.close()

        threads = []
        if self.stdin is not None:
            threads.append(threading.Thread(target=feed, args=(self.stdin,), daemon=True))
        for name in ("stdout", "stderr"):
            if (pipe := getattr(self, name)) is not None:
                threads.append(threading.Thread(target=read, args=(name, pipe), daemon=True))
        for t in threads:
            t.start()
        return threads, output


def Popen(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(args, **kwargs)`, warm where it can be (see the module's docstring)."""
    rest = program(args)
    env = kwargs.get("env")
    if rest is None or startup(dict(os.environ if env is None else env)) != forkserver().env:
        return subprocess.Popen(args, **kwargs)
    return Warm(args, rest, **kwargs)


def run(
    args: list[str],
    *,
    input: Any = None,
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run`, warm where it can be: on a timeout the process is killed."""
    pipe = PIPE if capture_output else None
    stdin = PIPE if input is not None else kwargs.pop("stdin", None)
    with Popen(args, stdin=stdin, stdout=pipe, stderr=pipe, text=text, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


# The warm process's end ------------------------------------------------------------------------


def preload() -> None:
    """Import what the tests' processes import, and make sure no thread runs: a fork copies
    only the forking one."""
    from tether.cli.main import preload as preload_a_run

    # what a durable `tether run` over HTTP imports first, as it imports it (SQLite swapped
    # in before DBOS, the collector off, then frozen)
    preload_a_run("sqlite:///", model=True)
    import pydantic  # noqa: F401

    import tether.cli.run
    import tether.cli.serve
    import tether.cli.store
    import tether.durable.process  # noqa: F401

    gc.freeze()
    if threading.active_count() != 1:
        raise RuntimeError(f"a thread runs after the imports: {threading.enumerate()}")


def serve(listener: socket.socket) -> dict[str, Any] | None:
    """Fork a child for each request and report its pid and then its exit status. Returns
    the request in each child, set up to run it; returns None in the warm process when the
    test process has ended."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes the loop
    children: dict[int, socket.socket] = {}
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(wake_read, selectors.EVENT_READ)
        selector.register(sys.stdin, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is sys.stdin:
                    return None  # the test process has ended (nothing is ever written)
                if key.fileobj == wake_read:
                    os.read(wake_read, 4096)
                    reap(children)
                    continue
                conn, _ = listener.accept()
                data, fds, _, _ = socket.recv_fds(conn, MESSAGE, 3)
                request = json.loads(data)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for sock in (listener, conn, *children.values()):
                        sock.close()
                    os.close(wake_read)
                    os.close(wake_write)
                    become(request, fds)
                    return request  # type: ignore[no-any-return]
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                children[pid] = conn


def reap(children: dict[int, socket.socket]) -> None:
    """Tell the tests of every child that has ended, with its exit status as Popen gives it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid)
        with contextlib.suppress(OSError):  # the test may have stopped waiting for it
            conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
        conn.close()


def become(request: dict[str, Any], fds: list[int]) -> None:
    """Make this child the process the test asked for: its standard streams, environment
    and working directory. Its standard streams keep the warm process's settings (the same
    PYTHONUNBUFFERED and locale) apart from line buffering, which a terminal turns on."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    stdout = sys.stdout
    assert isinstance(stdout, io.TextIOWrapper)
    if not stdout.write_through:  # not PYTHONUNBUFFERED
        stdout.reconfigure(line_buffering=os.isatty(1))


def main(request: dict[str, Any]) -> None:
    """Run the request's program as `python ARGS` would, in this (forked) process."""
    args = request["args"]
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        module = type(sys)("__main__")
        sys.modules["__main__"] = module
        exec(compile(args[1], "<string>", "exec"), module.__dict__)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    sys.path[0] = SRC  # Tether from the source tree, nothing from tests/
    preload()
    got = serve(socket.socket(fileno=int(sys.argv[1])))
    if got is not None:
        main(got)
