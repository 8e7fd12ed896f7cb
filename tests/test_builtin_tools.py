"""Built-in tools: bash with process-tree kills, file tools confined to the workspace, weather."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import warm
from helpers import alive, cli_env, holders, probe_sandbox, running, until, wait_until
from tether import BUILTINS, RunContext, Toolbox, ToolCall
from tether.approvals import approve_all
from tether.tools.bash import CappedOutput

TOOLS = Toolbox(BUILTINS.values())


async def run(name: str, ctx: RunContext, **args: object) -> tuple[str, bool]:
    r = await TOOLS.run(ToolCall("c", name, dict(args)), ctx, approve_all)
    return r.output, r.is_error


async def test_bash_exit_status_and_combined_output(tmp_path: Path) -> None:
    out, err = await run(
        "bash", RunContext(workspace=tmp_path), command="echo out; echo err >&2; pwd; exit 3"
    )
    assert not err
    assert out.startswith("exit status 3\n")
    assert "out\n" in out and "err\n" in out and str(tmp_path) in out


async def test_bash_long_output_keeps_head_and_tail(tmp_path: Path) -> None:
    out, _ = await run(
        "bash", RunContext(workspace=tmp_path), command="echo FIRST; seq 1 200000; echo LAST"
    )
    assert "FIRST" in out and "LAST" in out
    assert "bytes of output cut" in out
    assert len(out) < 20_000


def test_capped_output_counts_what_it_cuts() -> None:
    c = CappedOutput(head=4, tail=4)
    for chunk in (b"abcdef", b"ghijkl", b"mn"):
        c.add(chunk)
    assert c.text() == "abcd\n[... 6 bytes of output cut ...]\nklmn"


async def test_bash_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    """The call's process group is killed: `env -i` leaves a child no cookie, so only the
    group's kill reaches it (the sweep for strays cannot)."""
    box = Toolbox([dataclasses.replace(BUILTINS["bash"], timeout=0.5)])
    cmd = "env -i sleep 30 & echo $! > child.pid; (sleep 30; echo x) & echo $! > sub.pid; sleep 30"
    t0 = time.monotonic()
    r = await box.run(
        ToolCall("c", "bash", {"command": cmd}), RunContext(workspace=tmp_path), approve_all
    )
    assert r.is_error and "timed out" in r.output
    assert time.monotonic() - t0 < 2
    pids = [int((tmp_path / f).read_text()) for f in ("child.pid", "sub.pid")]
    await until(
        lambda: not any(alive(p) for p in pids), "the timed-out command's children to end", 5
    )


async def test_bash_cancel_kills_the_whole_tree(tmp_path: Path) -> None:
    command = "env -i sleep 30 & echo $! > child.pid; wait"  # no cookie: the group's kill ends it
    task = asyncio.create_task(run("bash", RunContext(workspace=tmp_path), command=command))
    pid_file = tmp_path / "child.pid"
    await until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the child's pid")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int(pid_file.read_text())
    await until(lambda: not alive(pid), "the cancelled command's child to end", 5)


async def test_bash_cancel_while_the_command_starts_kills_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell runs before asyncio has connected its pipes; a cancel in that window (seen
    under load) used to kill the shell alone and leave its children running."""
    loop = asyncio.get_running_loop()
    connect = loop.connect_read_pipe
    connecting, go_on = asyncio.Event(), asyncio.Event()

    async def held_connect(*args: Any, **kwargs: Any) -> Any:
        connecting.set()
        await go_on.wait()
        return await connect(*args, **kwargs)

    monkeypatch.setattr(loop, "connect_read_pipe", held_connect)
    task = asyncio.create_task(
        run("bash", RunContext(workspace=tmp_path), command="sleep 30 & echo $! > child.pid; wait")
    )
    pid_file = tmp_path / "child.pid"
    await connecting.wait()
    await until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the child's pid")
    task.cancel()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)  # not when the child would have ended by itself
    pid = int(pid_file.read_text())
    await until(lambda: not alive(pid), "the child of the command cancelled as it started", 5)


async def test_bash_background_child_holding_the_pipe_does_not_hang(tmp_path: Path) -> None:
    t0 = time.monotonic()
    out, _ = await run("bash", RunContext(workspace=tmp_path), command="(sleep 3 &) ; echo quick")
    assert "quick" in out and time.monotonic() - t0 < 2.5


async def test_file_tools_round_trip(tmp_path: Path) -> None:
    ctx = RunContext(workspace=tmp_path)
    out, err = await run("write_file", ctx, path="src/app.py", content="x = 1\ny = 2\n")
    assert not err and (tmp_path / "src/app.py").read_text() == "x = 1\ny = 2\n"
    out, err = await run("read_file", ctx, path="src/app.py")
    assert out == "x = 1\ny = 2\n"
    out, err = await run("edit_file", ctx, path="src/app.py", old_text="y = 2", new_text="y = 3")
    assert not err and (tmp_path / "src/app.py").read_text() == "x = 1\ny = 3\n"
    out, err = await run("list_files", ctx, recursive=True)
    assert out.splitlines() == ["src/", "src/app.py"]


async def test_edit_file_needs_a_unique_exact_match(tmp_path: Path) -> None:
    ctx = RunContext(workspace=tmp_path)
    (tmp_path / "f.txt").write_text("a a a")
    out, err = await run("edit_file", ctx, path="f.txt", old_text="a", new_text="b")
    assert err and "occurs 3 times" in out
    out, err = await run("edit_file", ctx, path="f.txt", old_text="zzz", new_text="b")
    assert err and "not found" in out
    out, err = await run(
        "edit_file", ctx, path="f.txt", old_text="a", new_text="b", replace_all=True
    )
    assert not err and (tmp_path / "f.txt").read_text() == "b b b"


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.txt", "a/../../outside.txt", "~/x"])
async def test_file_tools_refuse_paths_outside_the_workspace(tmp_path: Path, path: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    ctx = RunContext(workspace=ws)
    for name, args in [
        ("read_file", {}),
        ("write_file", {"content": "pwned"}),
        ("edit_file", {"old_text": "secret", "new_text": "x"}),
    ]:
        out, err = await run(name, ctx, path=path, **args)
        assert err and ("outside the workspace" in out or "absolute path" in out), out
    assert (tmp_path / "outside.txt").read_text() == "secret"


async def test_symlink_leading_outside_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (ws / "link.txt").symlink_to(tmp_path / "secret.txt")
    (ws / "linkdir").symlink_to(tmp_path)
    ctx = RunContext(workspace=ws)
    out, err = await run("read_file", ctx, path="link.txt")
    assert err and "outside the workspace" in out
    out, err = await run("list_files", ctx, path="linkdir")
    assert err and "outside the workspace" in out
    out, err = await run("write_file", ctx, path="linkdir/secret.txt", content="x")
    assert err and (tmp_path / "secret.txt").read_text() == "secret"


async def test_get_weather_against_a_local_service() -> None:
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.query["city"])
        return web.json_response({"city": request.query["city"], "temp_c": 4})

    app = web.Application()
    app.router.add_get("/weather", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        ctx = RunContext(config={"weather_url": f"http://127.0.0.1:{port}/weather"})
        out, err = await run("get_weather", ctx, city="São Paulo")
        assert not err and '"temp_c": 4' in out.replace('":4', '": 4')
        assert seen == ["São Paulo"]
        bad = RunContext(config={"weather_url": f"http://127.0.0.1:{port}/missing"})
        out, err = await run("get_weather", bad, city="Oslo")
        assert err and "HTTP 404" in out
    finally:
        await runner.cleanup()


def dead_soon(pid: int) -> bool:
    """Whether `pid` is dead, allowing the kernel a moment to finish a SIGKILL already sent."""
    for _ in range(500):
        if not alive(pid):
            return True
        time.sleep(0.01)
    return False


async def test_processes_a_call_starts_end_with_the_call(tmp_path: Path) -> None:
    cmd = (
        "setsid sh -c 'echo $$ > setsid.pid; exec sleep 300' & "
        "nohup sleep 301 > /dev/null 2>&1 & echo $! > nohup.pid; "
        "(sleep 302 & echo $! > bg.pid); "
        "for f in setsid.pid nohup.pid bg.pid; do until [ -s $f ]; do :; done; done; echo started"
    )
    out, err = await run("bash", RunContext(workspace=tmp_path), command=cmd)
    assert not err and "started" in out, out
    for name in ("setsid.pid", "nohup.pid", "bg.pid"):
        pid = int((tmp_path / name).read_text())
        assert dead_soon(pid), f"the {name[:-4]} child outlived its bash call"


async def test_calls_cancelled_together_each_lose_every_process_they_started(
    tmp_path: Path,
) -> None:
    """Calls that end in one turn of the loop share one look at /proc for their strays (a
    tree of runs cancelled at its root ends many at once): each call's still go."""
    bash = BUILTINS["bash"]
    box = Toolbox([bash])
    ctx = RunContext(workspace=tmp_path)
    cmd = "setsid sh -c 'echo $$ > {n}.pid; exec sleep 300' & sleep 300"
    calls = [ToolCall(f"c{n}", "bash", {"command": cmd.format(n=n)}) for n in range(6)]
    tasks = [asyncio.create_task(box.run(c, ctx, approve_all)) for c in calls]
    files = [tmp_path / f"{n}.pid" for n in range(6)]
    await until(lambda: all(f.exists() and f.read_text().strip() for f in files), "six strays")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    pids = [int(f.read_text()) for f in files]
    await until(lambda: not any(alive(p) for p in pids), "every call's stray to end", 5)


async def test_bash_sees_no_secrets_but_what_the_user_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-abcdefghijklmnop")
    monkeypatch.setenv("GITHUB_PAT", "ghp_" + "a" * 36)
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:hunter22@db/x")
    monkeypatch.setenv("PROJECT_NAME", "tether")
    cmd = "env; echo $OPENAI_API_KEY | base64; echo $GITHUB_PAT | rev"
    out, _ = await run("bash", RunContext(workspace=tmp_path), command=cmd)
    assert "PATH=" in out and "HOME=" in out
    for leak in ("abcdefghijklmnop", "aaaaaaaa", "hunter22", "c2stcHJvai", "PROJECT_NAME"):
        assert leak not in out, leak
    from tether.tools.bash import bash_tool

    box = Toolbox([bash_tool(["PROJECT_NAME"])])
    r = await box.run(
        ToolCall("c", "bash", {"command": "echo $PROJECT_NAME"}),
        RunContext(workspace=tmp_path),
        approve_all,
    )
    assert r.output == "exit status 0\ntether\n"


def test_redaction_finds_url_passwords_github_tokens_and_json_escaped_secrets() -> None:
    import orjson

    from tether.redact import Redactor

    r = Redactor({"SERVICE_TOKEN": 'ab/cd"efgh\\ijkl', "HOME": "/root"})
    text = orjson.dumps({"out": 'ab/cd"efgh\\ijkl'}).decode()
    assert "efgh" not in r.scrub(text) and "efgh" not in r.scrub_bytes(text.encode()).decode()
    line = "db postgresql://app:hunter22@db:5432/x and ghp_" + "Z" * 36 + " github_pat_" + "1" * 30
    clean = r.scrub(line)
    assert "hunter22" not in clean and "ZZZZ" not in clean and "1111" not in clean
    assert "postgresql://app:[redacted]@db:5432/x" in clean
    assert r.scrub("see https://example.com/a:b@c and /root") == (
        "see https://example.com/a:b@c and /root"
    )


@pytest.mark.parametrize(
    "said",
    [
        "authorization: bearer abcdefghijklmnop1234",
        "AUTHORIZATION: BEARER abcdefghijklmnop1234",
        "X-API-KEY: abcdefghijklmnop1234",
        "Authorization: Bearer abcdefghijklmnop1234",
    ],
)
def test_a_credential_is_redacted_however_its_header_is_written(said: str) -> None:
    """The shapes match in any case, and so do the hints that let a text be looked at: a
    lowercase `bearer` (as some clients write it) was left whole."""
    from tether.redact import Redactor

    r = Redactor({})
    assert "abcdefghijklmnop1234" not in r.scrub(said)
    assert b"abcdefghijklmnop1234" not in r.scrub_bytes(said.encode())


async def test_read_file_reads_only_what_it_returns(tmp_path: Path) -> None:
    """A 1 GB (sparse) file read with limit 10, in a process that may not map 1 GB."""
    (tmp_path / "big.bin").write_bytes(b"0123456789abcdef")
    os.truncate(tmp_path / "big.bin", 1 << 30)
    script = (
        "import asyncio, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (900 << 20, 900 << 20))\n"
        "from tether import BUILTINS, RunContext, Toolbox, ToolCall\n"
        "from tether.approvals import approve_all\n"
        "call = ToolCall('c', 'read_file', {'path': 'big.bin', 'limit': 10})\n"
        f"ctx = RunContext(workspace={str(tmp_path)!r})\n"
        "r = asyncio.run(Toolbox(BUILTINS.values()).run(call, ctx, approve_all))\n"
        "print(r.is_error, repr(r.output))\n"
    )  # fmt: skip
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, env=cli_env()
    )
    out, _ = await p.communicate()
    expected = "False '0123456789\\n[... more follows; read on with offset=10]'"
    assert out.decode().strip() == expected, out


@pytest.mark.parametrize("tool_name", ["read_file", "write_file", "edit_file"])
async def test_file_tools_refuse_a_fifo_at_once(tmp_path: Path, tool_name: str) -> None:
    os.mkfifo(tmp_path / "pipe")
    args = {"read_file": {}, "write_file": {"content": "x"}}.get(
        tool_name, {"old_text": "a", "new_text": "b"}
    )
    out, err = await asyncio.wait_for(
        run(tool_name, RunContext(workspace=tmp_path), path="pipe", **args), 10
    )
    assert err and "not a regular file" in out, out


async def test_the_file_tools_refuse_a_hard_link_to_a_file_outside(tmp_path: Path) -> None:
    """Written through, it wrote the outside file; read through, it showed it (a link made by
    a command outside the sandbox: `ln /etc/shadow notes`)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("keep")
    os.link(tmp_path / "secret.txt", ws / "inside.txt")
    for name, args in [
        ("write_file", {"content": "pwned"}),
        ("edit_file", {"old_text": "keep", "new_text": "pwned"}),
        ("read_file", {}),
    ]:
        out, err = await run(name, RunContext(workspace=ws), path="inside.txt", **args)
        assert err and "hard link" in out and "keep" not in out, out
    assert (tmp_path / "secret.txt").read_text() == "keep"


async def test_a_directory_swapped_for_a_link_never_leads_outside(tmp_path: Path) -> None:
    """A thread swaps `ws/d` between a directory and a link to the outside while the model
    reads `d/f.txt`: every read gets the inside file or an error, never the outside one."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "f.txt").write_text("SECRET")
    real = tmp_path / "ws" / "real"
    real.mkdir()
    (real / "f.txt").write_text("inside")
    link_to_real, link_out = ws / "tmp_real", ws / "tmp_out"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.rename(real, ws / "d")  # d is the real directory
                os.rename(ws / "d", real)
                os.symlink(outside, link_out)
                os.rename(link_out, ws / "d")  # d is a link to the outside
                os.unlink(ws / "d")

    del link_to_real
    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: set[str] = set()
    try:
        for _ in range(3000):
            out, err = await run("read_file", RunContext(workspace=ws), path="d/f.txt")
            seen.add("error" if err else out)
    finally:
        stop.set()
        swapper.join()
    assert "SECRET" not in seen
    assert "inside" in seen  # the race was run: some reads found the directory


needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("TETHER_REQUIRE_SANDBOX"),
    reason="needs bubblewrap (apt-get install bubblewrap; scripts/test installs it)",
)


async def sandboxed(command: str, workspace: Path, net: bool = False) -> str:
    from tether.tools.bash import bash_tool
    from tether.tools.sandbox import Sandbox

    box = Toolbox([bash_tool((), Sandbox(net=net))])
    r = await box.run(
        ToolCall("c", "bash", {"command": command}), RunContext(workspace=workspace), approve_all
    )
    assert not r.is_error, r.output
    return r.output


@needs_bwrap
async def test_a_sandboxed_call_writes_only_its_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "beside.txt").write_text("host")
    escape = Path(f"/usr/tether-escape-{os.getpid()}-{tmp_path.name}")  # this run's own
    try:
        out = await sandboxed(
            f"echo made > made.txt; touch {escape}; cat ../beside.txt; "
            "echo private > ../beside.txt; echo end",
            ws,
        )
        escaped = await asyncio.to_thread(escape.exists)
    finally:  # an escape fails this run, not every later one
        await asyncio.to_thread(escape.unlink, missing_ok=True)
    assert (ws / "made.txt").read_text() == "made\n"
    assert "Read-only file system" in out and not escaped
    assert "host" not in out  # the host's /tmp is not the sandbox's
    assert (tmp_path / "beside.txt").read_text() == "host"


@needs_bwrap
async def test_a_sandboxed_call_has_no_network_unless_asked(tmp_path: Path) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5); "
        "print('connected')\" 2>&1 | tail -1"
    )
    try:
        assert "connected" not in await sandboxed(probe, tmp_path)
        assert "connected" in await sandboxed(probe, tmp_path, net=True)
    finally:
        server.close()


@needs_bwrap
async def test_every_process_of_a_sandboxed_call_ends_with_it(tmp_path: Path) -> None:
    marker = f"{os.getpid() % 1000 + 7000}.{time.time_ns() % 1000}"
    await sandboxed(
        f"setsid sh -c 'exec sleep {marker}' & env -i sleep {marker}1 & echo ok", tmp_path
    )
    pgrep = await asyncio.create_subprocess_exec(
        "pgrep", "-f", f"sleep {marker}", stdout=asyncio.subprocess.PIPE
    )
    left, _ = await pgrep.communicate()
    assert left == b"", f"still running: {left!r}"


@needs_bwrap
def test_a_sandboxed_command_dies_with_a_killed_tether(wire: Any, tmp_path: Path) -> None:
    """bubblewrap runs in a session of its own, so nothing signals it when `tether` is killed
    with SIGKILL: it must end itself (`--die-with-parent`), and its pid namespace with it."""
    mark = f"tether-orphan-{os.getpid()}-{time.time_ns()}"
    wire.add(calls=[("bash", {"command": f"exec -a {mark} sleep 300"})]).add(text="never")
    proc = warm.Popen(
        [sys.executable, "-m", "tether", "run", "go", "--base-url", wire.url, "--tools", "bash",
         "--yolo", "--sandbox", "--workspace", str(tmp_path), "--store", "memory"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env(OPENAI_API_KEY="k"),
    )  # fmt: skip
    try:
        # the command itself, not bubblewrap's arguments naming it: killed before bubblewrap
        # has asked to die with its parent, bubblewrap outlives tether (a window of its
        # start-up that is bubblewrap's own)
        wait_until(lambda: running(mark, named=True), "the sandboxed command to run", 30)
        proc.kill()
        proc.wait()
        try:
            wait_until(lambda: not running(mark), "the sandboxed command to end with tether", 10)
        except AssertionError as e:  # seen once under load: say what was left (pid ppid state)
            raise AssertionError(f"{e}; left: {holders(mark)}") from None
    finally:  # nothing left behind when it fails
        proc.kill()
        proc.wait()
        subprocess.run(["pkill", "-KILL", "-f", mark], check=False)


@needs_bwrap
async def test_a_sandboxed_call_cannot_take_all_memory(tmp_path: Path) -> None:
    out = await sandboxed(
        "python3 -c 'x = bytearray(8 << 30); print(\"took 8 GB\")' 2>&1 | tail -1", tmp_path
    )
    assert "MemoryError" in out and "took 8 GB" not in out


@needs_bwrap
async def test_a_sandboxed_call_runs_its_command_as_given_under_a_cpu_limit(
    tmp_path: Path,
) -> None:
    """The limits are set by a shell of their own, and the command runs as `bash -c` runs it:
    its own $0 and no arguments, quotes and a syntax error as they are."""
    out = await sandboxed("ulimit -t; ulimit -v; echo \"$0 [$1] 'q'\"; echo $#", tmp_path)
    assert out.split("\n") == ["exit status 0", "600", "4194304", "bash [] 'q'", "0", ""]
    broken = await sandboxed("echo before; if then", tmp_path)
    assert broken.startswith("exit status 2\nbash: -c: line 1: syntax error")
    assert "\nbefore\n" not in broken  # nothing of it ran


def test_the_sandbox_never_runs_a_call_unsandboxed(wire: Any, tmp_path: Path) -> None:
    """Without bubblewrap, --sandbox is an error at start, and bash never ran."""
    wire.add(calls=[("bash", {"command": "touch ran.txt"})]).add(text="ran")
    p = warm.run(
        [sys.executable, "-m", "tether", "run", "go", "--base-url", wire.url, "--tools", "bash",
         "--yolo", "--sandbox", "--workspace", str(tmp_path), "--store", "memory"],
        capture_output=True, text=True, timeout=60,
        env=cli_env(OPENAI_API_KEY="k", PATH=str(tmp_path / "no-bin")),
    )  # fmt: skip
    assert p.returncode == 2 and "--sandbox needs bubblewrap" in p.stderr, p.stderr
    assert not (tmp_path / "ran.txt").exists() and wire.requests == []


ESCAPES = """
echo out > "$OUTSIDE" 2>/dev/null && echo wrote-outside
python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)" \
    "$PORT" 2>/dev/null && echo reached-host
cat "$SECRET" 2>/dev/null
echo kept > note.txt && echo wrote-workspace
"""


def escape_attempts(wire: Any, tmp_path: Path, *flags: str) -> str:
    """What `ESCAPES` printed in a `tether run --tools bash` with `flags`: a write outside the
    workspace, a connect to a host port on 127.0.0.1, a read of a secret in the home."""
    outside, secret = tmp_path / "outside.txt", Path.home() / f".tether-secret-{os.getpid()}"
    secret.write_text("planted-home-secret\n")
    try:
        command = ESCAPES.replace("$OUTSIDE", str(outside)).replace("$SECRET", str(secret))
        command = command.replace("$PORT", wire.url.rsplit(":", 1)[1].split("/")[0])
        wire.add(calls=[("bash", {"command": command})]).add(text="done")
        (tmp_path / "ws").mkdir()
        p = warm.run(
            [sys.executable, "-m", "tether", "run", "go", "--base-url", wire.url, "--tools",
             "bash", "--yolo", "--workspace", str(tmp_path / "ws"), "--store", "memory",
             "--json", *flags],
            capture_output=True, text=True, timeout=60, env=cli_env(OPENAI_API_KEY="k"),
        )  # fmt: skip
    finally:
        secret.unlink(missing_ok=True)
    assert p.returncode == 0, p.stderr
    (out,) = [
        e["output"] for e in map(json.loads, p.stdout.splitlines()) if e["type"] == "tool_result"
    ]
    assert "wrote-workspace" in out and (tmp_path / "ws" / "note.txt").exists(), out
    if outside.exists():  # the host's file, not a private /tmp's
        out += "\nhost-file-written"
    return str(out)


@needs_bwrap
def test_bash_is_sandboxed_by_default_where_bubblewrap_works(wire: Any, tmp_path: Path) -> None:
    """With no flag, bash cannot write outside its workspace, reach the host's 127.0.0.1 or
    read a secret in the home; with --no-sandbox it can (as before: on purpose)."""
    out = escape_attempts(wire, tmp_path)
    assert not {"host-file-written", "reached-host", "planted-home-secret"} & set(out.split()), out


def test_no_sandbox_runs_bash_with_the_users_power(wire: Any, tmp_path: Path) -> None:
    out = escape_attempts(wire, tmp_path, "--no-sandbox")
    assert {"host-file-written", "reached-host", "planted-home-secret"} <= set(out.split()), out


FAILING_BWRAP = "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"


@pytest.mark.parametrize("flag", [None, "--sandbox"])
def test_where_bubblewrap_cannot_work_bash_runs_unsandboxed_and_says_so(
    wire: Any, tmp_path: Path, flag: str | None
) -> None:
    """A bubblewrap that cannot make namespaces here (as in some containers): by default one
    line says bash runs unsandboxed, and the run goes on; with --sandbox it is an error at
    start and nothing ran."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text(FAILING_BWRAP)
    fake.chmod(0o755)
    wire.add(calls=[("bash", {"command": "touch ran.txt"})]).add(text="ran")
    p = warm.run(
        [sys.executable, "-m", "tether", "run", "go", "--base-url", wire.url, "--tools", "bash",
         "--yolo", "--workspace", str(tmp_path), "--store", "memory", *([flag] if flag else [])],
        capture_output=True, text=True, timeout=60,
        env=cli_env(OPENAI_API_KEY="k", PATH=f"{fake.parent}:{os.environ['PATH']}"),
    )  # fmt: skip
    cannot = "bubblewrap cannot make a sandbox here: bwrap: No permissions to create new namespace"
    if flag is None:
        assert p.returncode == 0, p.stderr
        said = [line for line in p.stderr.splitlines() if "unsandboxed" in line]
        assert said == [
            f"tether: bash runs unsandboxed: {cannot}; --sandbox makes this an error, "
            "--no-sandbox says you mean it"
        ], p.stderr
        assert (tmp_path / "ran.txt").exists()
    else:
        assert p.returncode == 2 and f"--sandbox: {cannot}" in p.stderr, p.stderr
        assert not (tmp_path / "ran.txt").exists() and wire.requests == []


def test_a_secret_of_eight_characters_is_redacted_and_one_of_seven_is_not() -> None:
    """Eight characters are enough for a secret; shorter values would redact ordinary words."""
    from tether.redact import Redactor

    r = Redactor({"MY_API_KEY": "8chars!!", "SHORT_TOKEN": "7chars!"})
    assert r.scrub("a 8chars!! b 7chars!") == "a [redacted] b 7chars!"


def test_a_secret_inside_json_is_redacted_whole() -> None:
    """In a JSON line a secret is escaped (quotes, backslashes): that form goes whole too, not
    leaving a character of it behind."""
    import orjson

    from tether.redact import Redactor

    r = Redactor({"DB_PASSWORD": 'pa"ss/word\\1'})
    line = orjson.dumps({"out": 'x pa"ss/word\\1 y'})
    assert r.scrub_bytes(line) == orjson.dumps({"out": "x [redacted] y"})


def test_a_secret_that_holds_another_is_redacted_whole() -> None:
    """The longer of two secrets goes first, so the shorter cannot leave the longer's tail."""
    from tether.redact import Redactor

    r = Redactor({"A_TOKEN": "abcdefgh12", "B_TOKEN": "abcdefgh12345"})
    assert r.scrub("see abcdefgh12345 and abcdefgh12") == "see [redacted] and [redacted]"


def test_keys_in_no_environment_are_redacted_by_their_shape() -> None:
    from tether.redact import Redactor

    r = Redactor({})
    assert r.scrub("key sk-abcdefghijklmnop end") == "key [redacted] end"
    line = b'{"o": "Authorization: Bearer abcdefghijklmnop"}'
    assert r.scrub_bytes(line) == b'{"o": "Authorization: Bearer [redacted]"}'


@needs_bwrap
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_the_sandbox_holds_for_root_and_for_an_ordinary_user(user: str) -> None:
    """As root bubblewrap keeps every capability unless told to drop them: a remount of / and
    a write anywhere on the host, an unmount of /proc. A host Unix socket (here one of the
    test's own in /run, as Postgres's and Docker's are) is a way out no network namespace
    closes. A file in the user's home, a store elsewhere and /etc/shadow must not be there
    to read. Each is tried from inside, as the user running Tether and as an ordinary one;
    the system's programs stay visible."""
    from tether.tools import seccomp
    from tether.tools.sandbox import Sandbox

    if os.geteuid() != 0:
        pytest.skip("the root case and the switch to an ordinary user need root")
    ws = Path(tempfile.mkdtemp(prefix="tether-sandbox-"))  # reachable by an ordinary user
    ws.chmod(0o777)
    fd = seccomp.descriptor()
    try:
        said = probe_sandbox(lambda probe: Sandbox().argv(probe, str(ws), fd), user, pass_fds=(fd,))
    finally:
        os.close(fd)
        shutil.rmtree(ws)
    assert "ESCAPED" not in said, said


SETUID_ATTEMPTS = """
cp /bin/bash rb && chmod 4755 rb
chmod u+s,g+s rb
install -m 4755 /bin/bash rb2
python3 -c "import os; os.close(os.open('rb3', os.O_CREAT | os.O_WRONLY, 0o4755))"
python3 -c "import os; os.chmod('rb', 0o6755)"
perl -e 'chmod 04755, "rb"'
mkdir -m 2775 shared
cp -p /usr/bin/passwd passwd-copy
cp -a /usr/bin/passwd passwd-archived
mkdir unpacked && tar -cf t.tar -C /usr/bin passwd && tar -xpf t.tar -C unpacked
ln /usr/bin/passwd passwd-link
echo attempted
"""
"""Every way a shell makes a setuid or setgid file: chmod by mode and by letter, install,
an open and a mkdir with the bits, copies and an archive of a setuid-root system program
that keep its mode, a hard link to one."""


def setuid_files(top: Path) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            info = os.lstat(Path(folder) / name)
            if info.st_mode & 0o6000:
                found.append(f"{name} {oct(info.st_mode)} uid {info.st_uid}")
    return found


@needs_bwrap
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_sandboxed_command_leaves_no_setuid_or_setgid_file_on_the_host(user: str) -> None:
    """As root a sandboxed bash (no capability, but uid 0) owned what it made: `chmod 4755`
    on a copy of bash left a setuid-root shell in the workspace that any local user ran as
    root; an ordinary user's left a setuid program of theirs. Whatever way it is tried, no
    such file is made, and the commands themselves still run (the copy of bash is there)."""
    from tether.tools import seccomp
    from tether.tools.sandbox import Sandbox

    if os.geteuid() != 0:
        pytest.skip("the root case and the switch to an ordinary user need root")
    ws = Path(tempfile.mkdtemp(prefix="tether-setuid-"))  # reachable by an ordinary user
    ws.chmod(0o777)
    fd = seccomp.descriptor()
    try:
        argv = Sandbox().argv(SETUID_ATTEMPTS, str(ws), fd)
        if user == "nobody":
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        done = subprocess.run(
            argv, cwd=ws, capture_output=True, text=True, timeout=60, pass_fds=(fd,)
        )
        made = setuid_files(ws)
        copied = (ws / "rb").is_file() and os.access(ws / "rb", os.X_OK)
        owner = (ws / "rb").stat().st_uid if copied else None
    finally:
        os.close(fd)
        shutil.rmtree(ws)
    assert done.stdout.strip().endswith("attempted"), done.stdout + done.stderr
    assert made == [], made
    assert copied and owner == (0 if user == "root" else 65534)
    assert "Operation not permitted" in done.stderr


@needs_bwrap
async def test_bash_tools_sandbox_refuses_a_setuid_file(tmp_path: Path) -> None:
    """The same, through the bash tool as `tether run` runs it (sandboxed by default)."""
    out = await sandboxed("cp /bin/bash ./rb && chmod 4755 ./rb; ls -l rb", tmp_path)
    assert "Operation not permitted" in out
    assert setuid_files(tmp_path) == [] and (tmp_path / "rb").is_file()


def test_the_setuid_filter_is_a_program_for_each_machine_it_knows() -> None:
    """The filter refuses the sandbox on a machine whose calls it does not know (a sandbox
    that let setuid files through would be worse than the error), and is whole instructions
    on the ones it knows."""
    from tether.errors import ConfigError
    from tether.tools import seccomp

    for machine in seccomp.ARCHES:
        assert len(seccomp.program(machine)) % 8 == 0 and len(seccomp.program(machine)) > 64
    with pytest.raises(ConfigError, match="no seccomp filter is known for sparc"):
        seccomp.program("sparc")


@needs_bwrap
def test_a_sandboxed_command_cannot_rewrite_the_tools_file_the_next_process_imports(
    tmp_path: Path,
) -> None:
    """A `--tools-from` file inside the workspace, which the next `tether run` or worker
    imports unsandboxed with the keys: a sandboxed bash call cannot write, replace, rename or
    remove it, and a bytecode cache planted beside it is never what is loaded."""
    import importlib.util
    import py_compile

    from tether.options import RunOptions, select_tools
    from tether.tools.loading import load_module

    tools = tmp_path / "tools.py"
    honest = (
        'from tether import tool\n\n\n@tool\ndef hi() -> str:\n    """Hi."""\n    return "hi"\n'
        + "# "
        + "-" * 200
        + "\n"  # room for the planted source, padded to the same size
    )
    tools.write_text(honest)
    options = RunOptions(tools="bash", tools_from=[str(tools)], sandbox=True)
    (bash,) = [t for t in select_tools(options) if t.name == "bash"]
    attempts = (
        "echo 'import os; os.system(\"touch pwned\")' > tools.py; "
        "mv tools.py moved.py; rm -f tools.py; "
        "printf 'x' >> tools.py; ln -sf /etc/passwd tools.py; echo tried"
    )

    async def call() -> tuple[str, bool]:
        box = Toolbox([bash])
        r = await box.run(
            ToolCall("c", "bash", {"command": attempts}),
            RunContext(workspace=tmp_path),
            approve_all,
        )
        return r.output, r.is_error

    out, _ = asyncio.run(call())
    assert "tried" in out and tools.read_text() == honest, out
    assert not (tmp_path / "moved.py").exists()
    # a cache entry of another source, stamped as the file's own: never what is loaded
    evil = tmp_path / "evil.py"
    planted = f"import pathlib; pathlib.Path({str(tmp_path / 'pwned')!r}).touch()"
    evil.write_text(planted.ljust(len(honest)))
    assert evil.stat().st_size == tools.stat().st_size
    info = tools.stat()
    os.utime(evil, ns=(info.st_atime_ns, info.st_mtime_ns))
    cached = importlib.util.cache_from_source(str(tools))
    stamped = py_compile.PycInvalidationMode.TIMESTAMP
    py_compile.compile(str(evil), cfile=cached, doraise=True, invalidation_mode=stamped)
    module = load_module(str(tools))
    assert module.hi.name == "hi" and not (tmp_path / "pwned").exists()
