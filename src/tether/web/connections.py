"""The page's connections, bounded before any request is read: a slow client cannot hold them.

aiohttp waits for a request's headers as long as a client cares to send them. A client that
opened connections and sent a byte of headers now and then (slowloris) held each for ever, and
the server ran out of descriptors long before the token was even looked at. Here each
connection must finish its first request's headers within `header_timeout` seconds, and at
most `max_connections` are open at once (more are closed as they arrive). A client that is
refused (no token, another origin, another host) is answered with `Connection: close`
(`WebApp.guard`), so only a client with the token keeps a connection open past its first
request; a page's event stream is such a connection and lives as long as the page.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 512
END_OF_HEADERS = b"\r\n\r\n"


class Connections:
    """The server's open connections: counted, and each given its first headers' deadline."""

    def __init__(self, handler_factory: Any, header_timeout: float, max_connections: int) -> None:
        self.handler_factory = handler_factory
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.open = 0

    def __call__(self) -> Guarded:
        return Guarded(self, self.handler_factory())

    async def serve(self, sock: socket.socket) -> asyncio.Server:
        return await asyncio.get_running_loop().create_server(self, sock=sock)


class Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind a deadline for its first headers."""

    def __init__(self, owner: Connections, inner: Any) -> None:
        self.owner, self.inner = owner, inner
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""  # the end of what came so far: headers may end across two reads
        self.counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):  # a TCP server's always is
            transport.close()
            return
        if self.owner.open >= self.owner.max_connections:
            transport.abort()  # full: refused before it costs anything more
            return
        self.owner.open += 1
        self.counted = True
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.owner.header_timeout, transport.abort)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.timer is not None:
            seen = self.tail + data
            if END_OF_HEADERS in seen:
                self.timer.cancel()
                self.timer = None
            self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.counted:
            self.owner.open -= 1
            self.counted = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
