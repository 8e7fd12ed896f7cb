"""A journal of events: one JSON line per event, one file per run.

`tether serve` writes every run's events here as they happen, so a page opened after a server
restart still shows the whole run from its first event. (Resuming the run itself is the durable
store's job.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

import orjson

from .errors import ConfigError
from .events import Event
from .redact import redactor


def private_dir(directory: str | Path) -> Path:
    """Create `directory` (and its parents) for this user only (0700): journals and stores
    hold transcripts. A directory that exists already keeps its mode."""
    path = Path(directory)
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
    return path


STORE_FORMS = "sqlite:///relative/path, sqlite:////absolute/path, postgresql://... or a file path"


def store_url(store: str, make_folder: bool = True) -> str:
    """A store as the URL DBOS takes, from what a user may write: `sqlite:///PATH` (three
    slashes and a relative path, four for an absolute one), `postgresql://...`, or a plain
    file path (`runs.sqlite`, `~/runs/runs.sqlite`), which is a SQLite file. A SQLite file's
    missing folder is made (0700), so a new store never fails on a folder that is not there;
    not for a command that only reads a store (`make_folder=False`), where a store that is
    not there is said so."""
    if "://" not in store:
        store = f"sqlite:///{Path(store).expanduser()}"
    scheme = store.split("://", 1)[0]
    if scheme == "sqlite":
        path = store.removeprefix("sqlite:///")
        if not path or store == path:
            raise ConfigError(f"store {store!r}: a SQLite store is sqlite:///PATH")
        if make_folder:
            private_dir(Path(path).parent)
        return store
    if scheme.split("+", 1)[0] in ("postgresql", "postgres"):
        return store
    raise ConfigError(f"store {store!r}: a store is {STORE_FORMS}")


def private_file(path: str | Path) -> Path:
    """Create `path` empty for this user only (0600) unless it exists; SQLite gives its
    write-ahead log the same mode as the database."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
    return Path(path)


def append_private(path: str | Path) -> IO[bytes]:
    """`path` opened for appending, created 0600."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")


LET_GO = frozenset({"run_finished", "queued"})
"""The events after which a run's journal file is closed (opened again at its next event)."""


class Journal:
    def __init__(self, directory: str | Path) -> None:
        self.directory = private_dir(directory)
        self.files: dict[str, IO[bytes]] = {}

    def path(self, run_id: str) -> Path:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ValueError(f"not a run id for a file name: {run_id!r}")
        return self.directory / f"{run_id}.jsonl"

    def write(self, event: Event) -> None:
        f = self.files.get(event.run_id)
        if f is None:
            f = self.files[event.run_id] = append_private(self.path(event.run_id))
        f.write(redactor().scrub_bytes(event.to_json()) + b"\n")
        f.flush()
        if event.type in LET_GO:  # a server runs thousands: no file held per ended run, nor
            f.close()  # per run queued for a slot (10,000 queued held 10,000 descriptors)
            del self.files[event.run_id]

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()

    def runs(self) -> dict[str, list[Event]]:
        """Every journaled run's events, oldest file first."""
        paths = sorted(self.directory.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        return {path.stem: self.load(path) for path in paths}

    def load(self, path: Path) -> list[Event]:
        events = []
        for line in path.read_bytes().splitlines():
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError:
                break  # a line cut short by a crash: the rest is not trusted
            events.append(Event.of(d))
        return events
