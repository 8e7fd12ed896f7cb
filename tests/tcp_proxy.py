"""A TCP proxy a test puts between Tether and its Postgres store, to make the store stop
answering the two ways a real one does: `cut()` closes every connection and refuses new ones
(the server died, or a failover), `freeze()` keeps the connections open and passes nothing
(a network that drops packets, where only a time-out notices). `restore()` brings it back on
the same port."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.frozen = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def to_url(cls, url: str) -> tuple[TcpProxy, str]:
        """A started proxy to the server of a `postgresql://` URL, and the URL through it."""
        parts = urlsplit(url)
        proxy = cls(parts.hostname or "127.0.0.1", parts.port or 5432).start()
        netloc = parts.netloc.rsplit("@", 1)
        auth = netloc[0] + "@" if len(netloc) == 2 else ""
        return proxy, urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))

    def start(self) -> TcpProxy:
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stop.clear()
        self.frozen.clear()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def cut(self) -> None:
        """Close every connection and stop listening: a new one is refused."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            for a, b in self._pairs:
                a.close()
                b.close()
            self._pairs.clear()

    def freeze(self) -> None:
        """Keep every connection open (and accept new ones) but pass no byte either way."""
        self.frozen.set()

    def restore(self) -> None:
        self.cut()
        self.start()

    def _serve(self) -> None:
        assert self._listener is not None
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept(sel, peers)
                    elif not self.frozen.is_set():
                        self._pass(sel, peers, sock)
                if self.frozen.is_set():  # the data waits, readable: do not spin on it
                    self._stop.wait(0.05)
        finally:
            sel.close()
            self._listener.close()

    def _accept(
        self, sel: selectors.BaseSelector, peers: dict[socket.socket, socket.socket]
    ) -> None:
        assert self._listener is not None
        client, _ = self._listener.accept()
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
        peers[client], peers[server] = server, client
        with self._lock:
            self._pairs.append((client, server))

    def _pass(
        self,
        sel: selectors.BaseSelector,
        peers: dict[socket.socket, socket.socket],
        sock: socket.socket,
    ) -> None:
        other = peers.get(sock)
        if other is None:  # closed with its peer earlier in this round
            return
        try:
            data = sock.recv(65536)
            if data:
                other.setblocking(True)
                other.sendall(data)
                other.setblocking(False)
                return
        except OSError:
            pass
        for s in (sock, other):  # one side closed: close both
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(s)
            s.close()
            peers.pop(s, None)
