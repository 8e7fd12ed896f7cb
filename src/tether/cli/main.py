"""The `tether` command: it parses the command line into typed options once and calls the
commands, which run on a `Runtime`; nothing below this package sees argparse.

    tether run TASK        one task to its end          (run.py)
    tether ask             a conversation               (run.py)
    tether serve           the web page                 (serve.py)
    tether mcp-serve       tools for MCP clients        (serve.py)
    tether resume|runs|send|cancel|approve|deny|worker|show    a store's runs (store.py)

Exit status: 0 done, 1 failed, 2 bad usage or configuration, 3 halted by a budget, 130 cancelled.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ..errors import ConfigError, RecordError, StoreUnavailable
from ..journal import store_url
from ..keys import protect_process
from ..options import RunOptions
from .common import default_store, error, leave
from .parser import build_parser


def check_store_settings(args: argparse.Namespace) -> str | None:
    """What is wrong with the store settings of a command line, if anything."""
    if getattr(args, "store_connections", 1) < 1:
        return "--store-connections must be at least 1"
    if not getattr(args, "store_patience", 1) > 0:
        return "--store-patience must be more than 0 seconds"
    return None


STORE_COMMANDS = (
    "resume", "fork", "runs", "send", "cancel", "upgrade", "approve", "deny", "worker", "migrate",
    "answer", "limits",
)  # fmt: skip
DURABLE_BY_DEFAULT = ("run", "ask", "serve", *STORE_COMMANDS)


def resolve_store(args: argparse.Namespace) -> None:
    """Fill in `args.store`: the option, else $TETHER_STORE, else the default SQLite file;
    `memory` (None after this) keeps a run in this process only."""
    store = args.store or ""
    if not store and args.command in DURABLE_BY_DEFAULT:
        store = default_store(args.data_dir)
        args.default_store = not os.environ.get("TETHER_STORE")  # the data directory's
    makes = args.command in ("run", "ask", "serve", "mcp-serve", "worker")  # may start a store
    args.store = None if store in ("", "memory") else store_url(store, makes)


def main(argv: list[str] | None = None) -> int:
    """The `tether` command: its exit status. The process ends when it returns."""
    if argv is None:
        hide_store_password()
    interrupt_on_sigint()
    protect_process()  # the keys it holds, out of its tools' reach (see `keys`)
    try:
        return command(build_parser().parse_args(argv))
    except StoreUnavailable as e:
        print(f"tether: {e}", file=sys.stderr)
        leave(1)
    except ConfigError as e:  # one found once the command is under way (a store's database)
        return error(str(e))
    except RecordError as e:  # a store row that is not Tether's: refused, nothing of it run
        print(f"tether: {e}", file=sys.stderr)
        leave(1)
    except BrokenPipeError:  # `tether runs | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0
    finally:
        ending()


POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
HIDDEN = "TETHER_STORE_PASSWORD_HIDDEN"


def without_password(arg: str) -> tuple[str, str | None]:
    """A command-line word with the password of a Postgres URL in it taken out, and that
    password (None: it had none)."""
    prefix, url = ("--store=", arg[len("--store=") :]) if arg.startswith("--store=") else ("", arg)
    if not url.startswith(POSTGRES_SCHEMES):
        return arg, None
    parts = urlsplit(url)
    if parts.password is None:
        return arg, None
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(unquote(user), safe='')}@{host}" if user else host
    return prefix + urlunsplit(parts._replace(netloc=netloc)), unquote(parts.password)


def hide_store_password() -> None:
    """A store URL's password on the command line (`--store postgresql://u:PASSWORD@db/x`) is
    in `/proc/PID/cmdline` for every user of the machine for as long as the command runs (a
    worker: for months). The command starts itself again at once without it, the password in
    `PGPASSWORD`, which Postgres's client reads and `keys.protect_process` keeps from other
    processes. (Better still: `PGPASSWORD` or `~/.pgpass` from the start.)"""
    if os.environ.get(HIDDEN):
        return
    words, password = [], None
    for arg in sys.argv[1:]:
        word, found = without_password(arg)
        words.append(word)
        password = found if found is not None else password
    if password is None:
        return
    env = {**os.environ, "PGPASSWORD": password, HIDDEN: "1"}
    os.execve(sys.executable, [sys.executable, "-m", "tether", *words], env)


def command_images(args: argparse.Namespace) -> int:
    """`tether images [--clear] [--json]`."""
    import json

    from ..harbor import build

    if args.clear:
        removed = build.evict(limit=0)
        left = build.kept()
        print(f"removed {len(removed)} images ({size(sum(k.size for k in removed))})"
              + (f"; {len(left)} in use stay" if left else ""))  # fmt: skip
        return 0
    entries = build.kept()
    if not entries and not args.json:
        print(f"no images are kept (in {build.images()})")
    for k in reversed(entries):  # the most recently used first
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(k.used))
        if args.json:
            print(json.dumps({"key": k.key, "bytes": k.size, "used": k.used, "path": str(k.path)}))
        else:
            print(f"{k.key}\t{size(k.size)}\tused {when}")
    return 0


def size(n: int) -> str:
    """A size on disk as a person reads it."""
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def interrupt_on_sigint() -> None:
    """Ctrl-C (SIGINT) cancels, however `tether` was started. A shell starts a background
    command (`cmd &` in a script, a CI job started so) with SIGINT ignored, and Python then
    installs no handler of its own: every Ctrl-C and every SIGINT a supervisor sent was lost,
    and the run went on. The command takes SIGINT back as Python's default handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def ending() -> None:
    """Spare the exit the garbage collector's passes over every object the process made (the
    imports' above all: DBOS, SQLAlchemy, aiohttp), which free nothing the exit would not. They
    took a fifth of a durable `tether run`: whole runs 0.83 s before, 0.68 s with this, and
    0.33 s against 0.28 s in memory (`bench/startup.py`, medians of 7, 2 cores). The rest of
    the exit (atexit, flushing, closing) is as before."""
    gc.freeze()


def preload(store: str | None, model: bool) -> None:
    """Import what the command is about to import anyway (DBOS with SQLAlchemy for a `store`,
    aiohttp for a `model` over HTTP) with the garbage collector off, and freeze what the
    imports made. During the imports the collector's passes free nothing, and frozen, their
    objects are not gone through again by a later full pass: a durable `tether run` takes 0.58
    s of CPU against 0.68 s, one in memory 0.27 against 0.30 s (medians of twelve, taking
    turns, 2 cores), and its first request leaves 25 to 40 ms sooner. The command's own
    process only (`main`)."""
    gc.disable()
    try:
        if store is not None:
            import dbos  # noqa: F401
        if model:
            import aiohttp  # noqa: F401
    finally:
        gc.freeze()
        gc.enable()


def command(args: argparse.Namespace) -> int:
    if args.command == "images":  # the Harbor image cache: no store, no model
        return command_images(args)
    try:
        if args.command == "show":  # its store only where one is named (else its journal)
            args.store = store_url(args.store, make_folder=False) if args.store else None
        else:
            resolve_store(args)
    except ConfigError as e:
        return error(str(e))
    if args.command == "show":
        from .store import command_show

        return command_show(args)
    wrong = check_store_settings(args)
    if wrong is not None:
        return error(wrong)
    if args.command in STORE_COMMANDS and not args.store:
        return error(f"{args.command} needs a store (--store URL)")
    if args.command == "limits":
        from .limits import command_limits

        return command_limits(args)
    if args.command in STORE_COMMANDS:
        from .store import command_store

        preload(args.store, model=args.command in ("resume", "fork", "worker"))
        return command_store(args)
    try:
        options = options_of(args)
    except ConfigError as e:
        return error(str(e))
    preload(args.store, model=options.provider != "scripted" and not getattr(args, "queue", False))
    if args.command == "mcp-serve":
        from .serve import command_mcp_serve

        return command_mcp_serve(args, options)
    if args.command == "serve":
        from .serve import command_serve

        return command_serve(args, options)
    from .run import command_ask, command_run

    if args.command == "run":
        return command_run(args, options)
    return command_ask(args, options)


def options_of(args: argparse.Namespace) -> RunOptions:
    """The run options of the command line (paths made absolute, the provider chosen)."""
    if getattr(args, "queue", False) and not args.store:
        raise ConfigError("--queue needs --store (the store whose workers will take the run)")
    if args.command == "run":
        if args.tasks is not None and not args.queue:
            raise ConfigError("--tasks queues runs for workers: add --queue and --store")
        if (args.task is None) == (args.tasks is None):
            raise ConfigError("give one TASK, or --tasks FILE with --queue")
        if args.image and args.queue:
            raise ConfigError("--image is for a run executed here; it cannot be queued yet")
    options = RunOptions.from_namespace(args).resolved()
    if args.provider is None and options.provider == "local":
        print(
            "tether: no OPENAI_API_KEY, so the bundled offline model SmolLM2-135M answers "
            "(small, for trying Tether); export OPENAI_API_KEY, or ANTHROPIC_API_KEY with "
            "--provider anthropic, for a real model",
            file=sys.stderr,
        )
    return options
