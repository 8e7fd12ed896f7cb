"""The server inside a trial's sandbox: it runs each command it is sent and replies with its
output and status (`SandboxEnvironment` speaks to it over a pipe in JSON lines).

It is Python source run with `python -I -c` inside the sandbox, on the standard library only
(the sandbox's Python may be the system's, without Tether's dependencies). A request names
its command, working directory, environment, time limit and user; the reply carries the
output, each stream's head and tail at most (`KEEP`, so a reply stays readable), and the exit
status: 124 on a time-out (the command's process group killed), 126 for a user the trial's
`/etc/passwd` does not have, 127 for a command that could not start. `{"kill": ID}` kills a
running command's process group (a call cancelled outside). It is named `tether-exec` and
shrugs off termination signals, so a task's `pkill python3` does not end its own trial.
"""

from __future__ import annotations

SERVER = r"""
import asyncio, base64, json, os, pwd, signal, sys

DRAIN = 1.0  # seconds to keep reading after the command exits (a job it left may hold a pipe)
KEEP = 512 * 1024  # bytes of a stream's head, and as many of its tail, that a reply carries


class Capped:  # the head and tail of a stream, and how much between them was cut
    def __init__(self):
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk):
        self.total += len(chunk)
        room = KEEP - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - KEEP)]

    def data(self):
        cut = self.total - len(self.head) - len(self.tail)
        middle = b"\n[... %d bytes of output cut ...]\n" % cut if cut > 0 else b""
        return bytes(self.head) + middle + bytes(self.tail)


async def drain(stream, into):
    while chunk := await stream.read(65536):
        into.add(chunk)


def kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def as_user(user, env):  # what `docker exec -u USER` does: its ids, its groups, its home
    if user is None:
        return {}
    try:
        entry = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
    except KeyError:
        if not str(user).isdigit():
            raise LookupError(f"unable to find user {user}: no matching entries in passwd file")
        return {"user": int(user), "group": int(user), "extra_groups": []}
    if env.get("HOME") == "/root":
        env["HOME"] = entry.pw_dir
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}


async def run(req, running, send):
    try:
        who = as_user(req.get("user"), req["env"])
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", req["command"], cwd=req["cwd"], env=req["env"],
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, **who)
    except LookupError as e:
        send({"id": req["id"], "stdout": "", "stderr": base64.b64encode(str(e).encode()).decode(),
              "code": 126})
        return
    except OSError as e:
        send({"id": req["id"], "stdout": "", "stderr": base64.b64encode(str(e).encode()).decode(),
              "code": 127})
        return
    running[req["id"]] = proc
    out, err = Capped(), Capped()
    readers = [asyncio.ensure_future(drain(proc.stdout, out)),
               asyncio.ensure_future(drain(proc.stderr, err))]
    try:
        code = await asyncio.wait_for(proc.wait(), req["timeout"])
    except asyncio.TimeoutError:
        kill(proc)
        code = 124
    await asyncio.wait(readers, timeout=DRAIN)
    for r in readers:
        r.cancel()
    running.pop(req["id"], None)
    send({"id": req["id"], "stdout": base64.b64encode(out.data()).decode(),
          "stderr": base64.b64encode(err.data()).decode(), "code": code})


def unkillable_by_name(loop):
    # a task's `pkill python3` (or a SIGTERM to every process) ended the trial with its
    # server: renamed, it is no `python3` to pkill, and a termination signal does nothing
    # (caught, so each command it starts gets the default action back at its exec)
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, b"tether-exec", 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        loop.add_signal_handler(sig, lambda: None)


async def main():
    loop = asyncio.get_running_loop()
    unkillable_by_name(loop)
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = os.fdopen(sys.stdout.fileno(), "wb", buffering=0)

    def send(reply):
        out.write(json.dumps(reply).encode() + b"\n")

    running, tasks = {}, set()
    send({"ready": True})
    while line := await reader.readline():
        req = json.loads(line)
        if "kill" in req:
            proc = running.get(req["kill"])
            if proc is not None:
                kill(proc)
            continue
        task = asyncio.ensure_future(run(req, running, send))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


asyncio.run(main())
"""
