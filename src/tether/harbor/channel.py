"""The pipes to a trial's sandbox server (`server.SERVER`), spoken over in JSON lines: a
request names its command, working directory, environment and time limit and carries an id;
each reply names the id it answers, with the command's output (base64, each stream's head and
tail kept: `KEEP`) and exit status. A call cancelled here asks the server to kill its command.
One reader hands each reply to the call that waits for it.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
from typing import Any

import orjson
from harbor.environments.base import ExecResult

from ..errors import known


class Channel:
    """The sandbox server's pipes, from the moment it said it is ready until it ends."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.broken: str | None = None  # why the replies could not be read, if they could not
        self.listener = asyncio.ensure_future(self.listen())

    async def closed(self) -> None:
        """Wait for the reader to end (the server's output closed)."""
        await self.listener

    async def listen(self) -> None:
        """Hand each reply of the server to the call that waits for it. Replies are bounded
        (the server keeps each stream's head and tail, `KEEP`), and read with a line limit
        above that bound; if reading fails all the same, every waiting call fails with the
        reason, and so does every later one (they waited for ever: the reader had died on a
        reply over asyncio's 64 KiB line limit, and each later exec hung)."""
        stdout = known(self.process.stdout, "the sandbox's stdout pipe")
        why = "the trial's sandbox has ended"
        try:
            while line := await stdout.readline():
                reply = orjson.loads(line)
                waiting = self.replies.pop(reply["id"], None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(reply)
        except (ValueError, orjson.JSONDecodeError, KeyError) as e:
            why = f"the trial's sandbox sent a reply that cannot be read: {e}"
            self.broken = why
            if self.process.returncode is None:
                self.process.kill()
        finally:
            for waiting in self.replies.values():  # no reply will come
                if not waiting.done():
                    waiting.set_exception(RuntimeError(why))
            self.replies.clear()

    async def request(
        self,
        command: str,
        cwd: str,
        environ: dict[str, str],
        seconds: float | None,
        user: str | int | None,
    ) -> ExecResult:
        """One command for the sandbox's server, and its reply."""
        if self.process.stdin is None or self.process.returncode is not None:
            raise RuntimeError(self.broken or "the trial's sandbox is not running")
        call = next(self.ids)
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.replies[call] = reply
        request = {
            "id": call,
            "command": command,
            "cwd": cwd,
            "env": environ,
            "timeout": seconds,
            "user": user,
        }
        self.process.stdin.write(orjson.dumps(request) + b"\n")
        try:
            done = await reply
        except asyncio.CancelledError:
            self.process.stdin.write(orjson.dumps({"kill": call}) + b"\n")
            self.replies.pop(call, None)
            raise
        return ExecResult(
            stdout=text(done["stdout"]),
            stderr=text(done["stderr"]),
            return_code=int(done["code"]),
        )


def text(encoded: str) -> str:
    return base64.b64decode(encoded).decode("utf-8", "replace")
