"""What the processes on one store say to each other as it happens, so that each can keep a
copy of what rarely changes and read the store again only when told it did.

Two things are said: the rates table changed (`RATES`: a pause a server asked for, a rate set
or cleared; `rates.py`), and a message was put in a run's inbox (`MAIL`: `tether send`,
`RunHandle.send`; `ledger.py`). Nearly every endpoint has no rate and nearly every run is never
sent a message, yet asking the store before each model call cost a query each (on Postgres a
round trip and a hop to a thread, about 0.35 ms of the client's CPU and some of the server's).

- On Postgres a change is said by a notification on its channel, sent in the transaction
  that makes it (`Ledger.saying`: so it is heard once it commits), and heard on one
  connection of this process's own (`Notices.listen`, a task the process runs while its store
  is open). While that connection is down nothing can be known: every reader reads the store
  as before.
- On SQLite, whose processes share one machine, by a byte added to a file beside the store
  (`stamp`), once the change has committed; a reader compares the file's size (a `stat`,
  about 3 µs) with the size when it last read.

Readers keep a mark (`Notices.mark`) from before their last read: the same mark now means
nothing of that kind was said since. A notification takes a moment to arrive, so a message
sent by another process at the very moment of a model call goes with the next one, as one
sent a moment later would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..journal import private_file
from .outage import POSTGRES_CONNECT_ARGS

RATES = "tether_rates"
MAIL = "tether_mail"
CHANNELS = (RATES, MAIL)
"""The Postgres channels, each also the suffix of its SQLite stamp file (`-rates`, `-mail`)."""

RETRY_S = 1.0
"""How long the listening connection waits before it connects again after it was lost."""


class Notices:
    """What this process has heard of each channel, for a store's readers (see the module
    docstring). Owned by the store's `Ledger`; its listening task by the process."""

    def __init__(self, file: Path | None) -> None:
        """`file`: a SQLite store's file (its stamps lie beside it); None for Postgres."""
        self.heard = dict.fromkeys(CHANNELS, 0)
        """Postgres: how many notifications of each channel were heard, and one more each
        time the connection is made (what was said while nobody listened)."""
        self.listening = False  # Postgres: the connection is up and LISTENs on every channel
        self.sent = dict.fromkeys(CHANNELS, 0)  # said by this process: known at once
        self.stamps: dict[str, Path] = {}
        if file is not None:
            suffix = {RATES: "-rates", MAIL: "-mail"}
            self.stamps = {c: private_file(file.with_name(file.name + suffix[c])) for c in CHANNELS}

    def mark(self, channel: str) -> int | None:
        """What has been said on `channel` so far, as a number that changes whenever something
        is said; None when it cannot be known (Postgres, not listening now): read the store."""
        stamp = self.stamps.get(channel)
        if stamp is not None:
            try:
                return stamp.stat().st_size
            except OSError:  # removed by hand: the next change makes it again, the size differs
                return -2
        if not self.listening:
            return None
        return self.heard[channel] + self.sent[channel]

    def said(self, channel: str) -> None:
        """A change on `channel` committed by this process (on Postgres its notification went
        with the transaction): stamped on SQLite, and known here at once."""
        self.sent[channel] += 1
        stamp = self.stamps.get(channel)
        if stamp is not None:
            with stamp.open("ab") as f:
                f.write(b".")

    async def listen(self, url: str) -> None:
        """Postgres: hear every channel's notifications as they commit, on a connection of this
        task's own, for as long as the process's store is open (cancelled with it)."""
        import psycopg
        from psycopg.conninfo import make_conninfo

        while True:
            try:
                conninfo = make_conninfo(url, **POSTGRES_CONNECT_ARGS)
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    for channel in CHANNELS:
                        await conn.execute(f"LISTEN {channel}")
                    for channel in CHANNELS:
                        self.heard[channel] += 1
                    self.listening = True
                    async for note in conn.notifies():
                        self.heard[note.channel] = self.heard.get(note.channel, 0) + 1
            except psycopg.Error:
                pass
            finally:
                self.listening = False
            await asyncio.sleep(RETRY_S)
