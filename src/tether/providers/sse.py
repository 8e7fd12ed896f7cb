"""Server-Sent Events, as the streaming clients read them: bytes parsed into events as they
arrive (`SSEParser`), and a reply's events a network read at a time (`SSEBatches`), bounded as
`http.py`'s docstring says (the bytes a call's output allows, the longest wait for an event).

`SSEBatches` is a plain async iterator, not an async generator: a run in flight holds its
reader for the whole reply, and a generator, with the `aclosing` it needs to be closed on time,
was five objects more a model call for the garbage collector (two coroutines among them), and a
frame more that each network read passed through.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ProviderProtocolError, ProviderTimeout
from .http import MAX_ERROR, MAX_LINE, Progress, read_up_to, unexpected

if TYPE_CHECKING:
    import aiohttp

STREAM_TYPES = ("text/event-stream", "application/octet-stream")

SSEEvent = tuple[str | None, bytes]

WHOLE_EVENTS = re.compile(rb"(?:data: ?[^\n]*\n\n)*")
"""The longest start of a chunk that is whole `data:` events, each one line and a blank one."""
DATA = re.compile(rb"data: ?([^\n]*)\n\n")


class SSEParser:
    """Server-Sent Events from bytes as they arrive: (event name, data) pairs. Comments and
    unknown fields are skipped; lines may end in LF or CRLF and may be split across reads."""

    __slots__ = ("data", "event", "pending", "pending_size")

    def __init__(self) -> None:
        self.pending: list[bytes] = []  # pieces of a line longer than one read, joined once
        self.pending_size = 0
        self.event: str | None = None
        self.data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by `chunk`."""
        if not (self.pending_size or self.data or self.event) and b"\r" not in chunk:
            return self.whole_events(chunk)
        return self.lines(chunk)

    def whole_events(self, chunk: bytes) -> list[SSEEvent]:
        """The events of a chunk read from a clean state: its start of whole `data:` events
        (what servers send: one line, then a blank one) by two regular expressions, the rest
        line by line. (Line by line, four checks a line, was most of the cost of parsing a
        streamed reply; block by block in Python, 0.8 µs an event, the regular expressions
        0.3.)"""
        whole = WHOLE_EVENTS.match(chunk)
        end = whole.end() if whole is not None else 0  # (it matches "" at least)
        out: list[SSEEvent] = [(None, data) for data in DATA.findall(chunk, 0, end)]
        if end < len(chunk):
            out += self.lines(chunk[end:])
        return out

    def lines(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by `chunk`, line by line. A line split over many reads is
        joined once, when it ends (joining at every read made one long line cost quadratic
        time)."""
        if b"\n" not in chunk:
            self.pending.append(chunk)
            self.pending_size += len(chunk)
            if self.pending_size > MAX_LINE:
                raise ProviderProtocolError(
                    f"a line of the reply stream is over {MAX_LINE >> 20} MB", retryable=False
                )
            return []
        if self.pending_size:
            chunk = b"".join(self.pending) + chunk
        lines = chunk.split(b"\n")
        self.pending = [lines.pop()]
        self.pending_size = len(self.pending[0])
        out: list[SSEEvent] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self.data:
                    out.append((self.event, b"\n".join(self.data)))
                self.event, self.data = None, []
            elif line.startswith(b"data:"):
                value = line[5:]
                self.data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"event:"):
                self.event = line[6:].strip().decode("utf-8", "replace")
        return out

    def close(self) -> list[SSEEvent]:
        """What is left when the stream ends (an event without its closing blank line)."""
        out = self.feed(b"\n\n") if self.pending_size or self.data else []
        return out


class SSEBatches:
    """The events of a reply stream, a batch per network read (one await a read, not one a
    line: most of the cost of reading a stream): `async for batch in SSEBatches(resp, p)`.
    The text a batch says (`Progress.said`) is handed over when the next batch is asked for,
    or by the caller once it has read the reply (`Progress.flush`). A reply that is no event
    stream is an error that says what came instead."""

    __slots__ = ("content", "ended", "last_event", "limits", "parser", "resp", "size")

    def __init__(self, resp: aiohttp.ClientResponse, progress: Progress | None = None) -> None:
        self.resp = resp
        self.content = resp.content
        self.limits = progress or Progress()
        self.parser = SSEParser()
        self.size = 0
        self.last_event = time.monotonic()
        self.ended = False

    def __aiter__(self) -> SSEBatches:
        return self

    async def __anext__(self) -> list[SSEEvent]:
        limits = self.limits
        limits.flush()  # the batch before is parsed: its text goes out as one piece
        if self.size == 0 and self.resp.content_type not in STREAM_TYPES:
            raise unexpected(
                self.resp, await read_up_to(self.resp, MAX_ERROR, limits), "an event stream"
            )
        while not self.ended:
            chunk = await self.content.readany()
            if not chunk:
                self.ended = True
                last = self.parser.close()
                if last:
                    return last
                break
            limits.heard()
            self.size += len(chunk)
            if self.size > limits.allowance:
                raise ProviderProtocolError(
                    f"the reply stream passed {limits.allowance} bytes, more than the call's "
                    "output limit allows; it was stopped",
                    retryable=False,
                )
            batch = self.parser.feed(chunk)
            if batch:
                self.last_event = time.monotonic()
                return batch
            if time.monotonic() - self.last_event > limits.quiet:
                raise ProviderTimeout(
                    f"the reply stream sent no event for {limits.quiet:g} s (only stray bytes)",
                    retryable=not limits.emitted,
                )
        raise StopAsyncIteration


def loads_event(data: bytes) -> Any:
    """An event's JSON; invalid UTF-8 in it becomes U+FFFD rather than failing the reply."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return orjson.loads(data.decode("utf-8", "replace"))
    except orjson.JSONDecodeError:
        snippet = data[:80].decode("utf-8", "replace")
        raise ProviderProtocolError(
            f"unreadable event in the reply stream: {snippet!r}", retryable=True
        ) from None
