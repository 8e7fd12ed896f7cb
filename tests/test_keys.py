"""Keys out of the tools' reach: a run whose model asks bash to print every environment and
memory it can find, from bash up to the first process, finds none of the keys `tether` was
started with, in any tool output, event, store row, journal or log; with the sandbox and
without, as root and as an ordinary user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from warm import cli_env

KEYS = ("OPENAI_API_KEY", "GITHUB_PAT", "MY_SERVICE_TOKEN")

MEMSCAN = r"""
import re, sys
pid = sys.argv[1]
try:
    maps = open(f"/proc/{pid}/maps").read().splitlines()
    mem = open(f"/proc/{pid}/mem", "rb")
except OSError as e:
    print(f"mem of {pid}: unreadable ({type(e).__name__})")
    sys.exit()
read = 0
for line in maps:
    span, perms = line.split()[:2]
    if not perms.startswith("r"):
        continue
    start, end = (int(x, 16) for x in span.split("-"))
    try:
        mem.seek(start)
        chunk = mem.read(end - start)
    except (OSError, OverflowError, ValueError):
        continue
    read += len(chunk)
    for found in sorted(set(re.findall(rb"planted-[0-9a-f]{16}", chunk))):
        print(f"mem of {pid} holds {found.decode()[::-1]}")  # reversed: past any redaction
print(f"mem of {pid}: {read} bytes read")
"""

PROBE = """
env
p=$$
while [ "$p" -gt 1 ]; do
  echo "== $p $(tr '\\0' ' ' < /proc/$p/cmdline | head -c 60)"
  tr '\\0' '\\n' < /proc/$p/environ | rev  # reversed: past any redaction
  "$PY" "$MEMSCAN" "$p" 2>&1
  p=$(awk '{print $4}' /proc/$p/stat)
done
echo probed
"""

LAUNCH = """
# the keys are made here, so that no process above this one ever held them
for name in {names}; do
  export "$name=planted-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \\n')"
  printenv "$name" >> "$KEYS_FILE"
done
exec "$@"
"""


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder an ordinary user can read (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="tether-keys-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("sandbox", [False, True], ids=["unsandboxed", "sandboxed"])
def test_no_key_of_tethers_is_found_by_the_tools_it_runs(place: Path, sandbox: bool) -> None:
    """As the user running the tests (root here: the strongest case, for root reads any
    process's memory unless it gives that power up)."""
    if sandbox and shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    script = place / "script.json"
    call = {"name": "bash", "arguments": {"command": probe_in(place)}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "Printed."}]))
    for folder in ("ws", "data", "home"):
        (place / folder).mkdir()
    store = place / "data" / "runs.sqlite"
    argv = [
        *("sh", "-c", LAUNCH.format(names=" ".join(KEYS)), "launch"),
        *(sys.executable, "-m", "tether", "run", "print every environment you can"),
        *("--provider", "scripted", "--script", str(script), "--tools", "bash", "--yolo"),
        *("--json", "--workspace", str(place / "ws"), "--data-dir", str(place / "data")),
        *("--store", f"sqlite:///{store}", "--log", str(place / "data" / "log.jsonl")),
        "--sandbox" if sandbox else "--no-sandbox",
    ]
    env = cli_env(KEYS_FILE=str(place / "keys.txt"), HOME=str(place / "home"))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    (output,) = [e["output"] for e in events if e["type"] == "tool_result"]
    assert output.rstrip().endswith("probed"), output  # the probe ran to its end
    if not sandbox:  # it saw the tether process, and found it closed
        closed_to_the_probe(output, "-m tether run")
    written = [done.stdout, done.stderr, *read_all(place / "data")]
    no_key_in(written, (place / "keys.txt").read_text().split())


PROGRAM = """
import importlib.util, subprocess, sys
spec = importlib.util.spec_from_file_location("keys", sys.argv[1])
keys = importlib.util.module_from_spec(spec)
spec.loader.exec_module(keys)
keys.protect_process()
env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # as the bash tool's
sys.stdout.write(subprocess.run(["bash", "-c", sys.argv[2]], env=env, capture_output=True,
                                text=True, check=False).stdout)
"""


def test_an_ordinary_users_process_is_closed_to_the_commands_it_starts(place: Path) -> None:
    """As an ordinary user: a process that holds keys and protects itself as `tether` does
    (`keys.protect_process`), then runs bash as the bash tool does, is closed to it. (The
    machine's Python 3.12, under root's home, cannot run as another user; the system's
    Python runs `keys.py`, which needs nothing else of Tether.)"""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("the switch to an ordinary user needs root and setpriv")
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("needs the system's python3")
    source = Path(__file__).parent.parent / "src" / "tether" / "keys.py"
    shutil.copy(source, place / "keys.py")  # where the ordinary user can read it
    program = place / "program.py"
    program.write_text(PROGRAM)
    launch = LAUNCH.format(names=" ".join(KEYS))
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", launch]
    argv += [
        "launch",
        system_python,
        str(program),
        str(place / "keys.py"),
        probe_in(place, system_python),
    ]
    env = {"PATH": "/usr/bin:/bin", "KEYS_FILE": str(place / "keys.txt")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("probed"), done.stdout + done.stderr
    closed_to_the_probe(done.stdout, "program.py")
    no_key_in([done.stdout, done.stderr], (place / "keys.txt").read_text().split())


def probe_in(place: Path, python: str = sys.executable) -> str:
    memscan = place / "memscan.py"
    memscan.write_text(MEMSCAN)
    return PROBE.replace("$PY", python).replace("$MEMSCAN", str(memscan))


def closed_to_the_probe(output: str, holder: str) -> None:
    """The probe found the process that holds the keys (its command line has `holder`), and
    could read neither its memory nor any variable of its environment (refused, or read
    empty: root may open the file, whose block the process cleared)."""
    lines = output.splitlines()
    found = [i for i, line in enumerate(lines) if line.startswith("== ") and holder in line]
    assert found, output
    pid = lines[found[0]].split()[1]
    seen = lines[found[0] + 1 : lines.index(f"mem of {pid}: unreadable (PermissionError)")]
    assert not [line for line in seen if "=" in line], output


def no_key_in(written: list[str], keys: list[str]) -> None:
    assert len(keys) == len(KEYS)
    for key in keys:
        for shown in (key, key[::-1]):
            assert all(shown not in text for text in written), "a key was shown"


def read_all(folder: Path) -> Iterator[str]:
    """Every file under `folder` (the store, its journal, the log), as text."""
    for path in folder.rglob("*"):
        if path.is_file():
            yield path.read_bytes().decode("utf-8", "replace")
