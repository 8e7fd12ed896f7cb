"""Signing in to an MCP server behind OAuth, as a user of `tether run --mcp URL` meets it: the
browser sign-in, the tokens kept (0600, never in the output) so the next run is silent, a
refresh when they have expired, and one line with exit status 2 when the sign-in cannot be
done. The server is ours (fixtures/oauth_mcp_server.py: the mcp SDK's server behind a small
authorization server); the "browser" is conformance/browser.py, which follows the redirects as
a person's does when the sign-in is approved at once."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, cli_env, free_port, wait_until

pytest.importorskip("mcp", reason="needs the mcp extra")

BROWSER = f"{sys.executable} {Path(__file__).parent / 'conformance' / 'browser.py'} %s"
SCRIPT = [
    {"tool_calls": [{"name": "stock", "arguments": {"item": "apples"}}]},
    {"text": "12 apples."},
]


class Server:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/mcp"
        self.args = args
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FIXTURES / "oauth_mcp_server.py"), str(self.port), *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.listening, "the OAuth MCP server to listen", 30, 0.05)

    def listening(self) -> bool:
        try:
            self.stats()
        except OSError:
            return False
        return True

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.base}/stats", timeout=5) as r:
            found: dict[str, int] = json.loads(r.read())
        return found

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    s = Server(*getattr(request, "param", ()))
    yield s
    s.stop()


def run(
    tmp_path: Path, url: str, *extra: str, browser: str = BROWSER
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return warm.run(
        [*TETHER, "run", "How many apples?", "--store", "memory", "--json", "--tools", "none",
         "--provider", "scripted", "--script", str(script), "--mcp", url, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(BROWSER=browser, XDG_DATA_HOME=str(tmp_path / "data")),
    )  # fmt: skip


def tool_output(done: subprocess.CompletedProcess[str]) -> str:
    events: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    return str(next(e for e in events if e["type"] == "tool_result")["output"])


def test_a_sign_in_at_the_browser_is_kept_and_the_next_run_is_silent(
    server: Server, tmp_path: Path
) -> None:
    first = run(tmp_path, server.url)
    assert first.returncode == 0, first.stderr
    assert tool_output(first) == "12 apples in stock"
    assert f"sign in to {server.url} in your browser: {server.base}/authorize?" in first.stderr
    assert server.stats() | {"rejected": 0} == {
        "authorize": 1, "register": 1, "token": 1, "refresh": 0, "rejected": 0,
    }  # fmt: skip

    folder = tmp_path / "data" / "tether" / "mcp-tokens"
    (kept,) = folder.iterdir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    token = json.loads(kept.read_text())["tokens"]["access_token"]
    assert token not in first.stdout and token not in first.stderr

    # the next run: no browser at all (a command that fails), no new sign-in
    second = run(tmp_path, server.url, browser="false %s")
    assert second.returncode == 0, second.stderr
    assert tool_output(second) == "12 apples in stock"
    assert "sign in" not in second.stderr
    assert server.stats()["authorize"] == 1

    # another data directory keeps its own tokens: a sign-in of its own, kept there
    elsewhere = tmp_path / "elsewhere"
    third = run(tmp_path, server.url, "--data-dir", str(elsewhere))
    assert third.returncode == 0, third.stderr
    assert server.stats()["authorize"] == 2
    assert len(list((elsewhere / "mcp-tokens").iterdir())) == 1
    assert len(list(folder.iterdir())) == 1


@pytest.mark.parametrize("server", [("--expires-in", "1")], indirect=True)
def test_an_expired_token_is_refreshed_not_signed_in_again(server: Server, tmp_path: Path) -> None:
    first = run(tmp_path, server.url)
    assert first.returncode == 0, first.stderr
    (kept,) = (tmp_path / "data" / "tether" / "mcp-tokens").iterdir()
    expires_at = json.loads(kept.read_text())["tokens"]["expires_at"]
    time.sleep(max(0.0, expires_at - time.time()) + 0.1)  # the token's own clock, run out
    second = run(tmp_path, server.url, browser="false %s")
    assert second.returncode == 0, second.stderr
    stats = server.stats()
    assert (stats["authorize"], stats["refresh"]) == (1, 1)


def test_a_server_that_forgot_our_client_has_us_register_again(
    server: Server, tmp_path: Path
) -> None:
    """An authorization server restarted has forgotten the client Tether registered (and its
    tokens): the sign-in registers anew instead of sending the person to the browser with a
    client id the server refuses (it shows an error and never redirects back: the run waited
    out the sign-in time, 300 s)."""
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"sign_in_timeout": 20}))
    first = run(tmp_path, server.url)
    assert first.returncode == 0, first.stderr
    server.stop()
    server.start()  # the same address, nothing remembered
    second = run(tmp_path, server.url, "--mcp-auth", str(auth))
    assert second.returncode == 0, second.stderr
    assert tool_output(second) == "12 apples in stock"
    stats = server.stats()  # the address asked once without the person, then the browser
    assert (stats["register"], stats["authorize"], stats["token"]) == (1, 2, 1)


@pytest.mark.parametrize("server", [("--deny",)], indirect=True)
def test_a_refused_sign_in_is_one_line_and_nothing_runs(server: Server, tmp_path: Path) -> None:
    done = run(tmp_path, server.url)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"tether: error: --mcp {server.url!r}: the sign-in was refused: the user said no"
    )
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_sign_in_not_finished_in_time_is_an_error(server: Server, tmp_path: Path) -> None:
    """A browser that never comes back (here: one that does nothing)."""
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"sign_in_timeout": 0.5}))
    done = run(tmp_path, server.url, "--mcp-auth", str(auth), browser="true %s")
    assert done.returncode == 2
    assert "the sign-in was not finished within 0.5 s" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"client_secret": "s"}, "a client_secret needs its client_id"),
        ({"grant": "client_credentials"}, "the client_credentials grant needs client_id and"),
        ({"scopes": "x"}, "unknown field 'scopes'"),
        ({"sign_in_timeout": "soon"}, "'sign_in_timeout' must be a float"),
        ([], "must be a JSON object"),
    ],
)
def test_a_bad_auth_file_is_one_line_before_anything_runs(
    tmp_path: Path, settings: Any, said: str
) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(settings))
    done = run(tmp_path, "http://127.0.0.1:9/mcp", "--mcp-auth", str(auth))
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"tether: error: --mcp-auth {str(auth)!r}: {said}")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "data" / "tether" / "mcp-tokens")


def test_a_second_browser_sign_in_sends_the_redirect_its_client_was_registered_with(
    tmp_path: Path,
) -> None:
    """Not every authorization server accepts any port on 127.0.0.1: a later sign-in listens
    on the port the client was registered with (it took a new one), unless that port is taken
    now or the registered redirect is not this machine's loopback."""
    import socket as socket_module

    from tether.tools.mcp_auth import AuthSettings, TokenFile, free_port, oauth, registered_port

    server, settings = "https://mcp.example/mcp", AuthSettings()
    storage = TokenFile(None, server, settings)
    port = free_port()
    storage.held = {"client": {"redirect_uris": [f"http://127.0.0.1:{port}/callback"]}}
    assert registered_port(storage) == port
    kept = TokenFile(tmp_path, server, settings)  # as an earlier process kept its client
    kept.held = {"client": {"client_id": "c1", **storage.held["client"]}}
    kept.write()
    sent = oauth(server, settings, tmp_path).context.client_metadata.redirect_uris
    assert [str(u) for u in sent] == [f"http://127.0.0.1:{port}/callback"]
    with socket_module.socket() as taken:
        taken.bind(("127.0.0.1", port))
        assert registered_port(storage) == 0
    storage.held = {"client": {"redirect_uris": [f"http://example.test:{port}/callback"]}}
    assert registered_port(storage) == 0
    storage.held = {}
    assert registered_port(storage) == 0


def test_a_browser_sign_in_has_its_own_time_beside_the_connect_timeout() -> None:
    """A person signing in at the browser takes longer than `--connect-timeout` (10 s by
    default): the server's connection is given the sign-in's own time on top, for a remote
    server that signs in at the browser only."""
    from tether.tools.mcp import signing_in
    from tether.tools.mcp_auth import AuthSettings

    browser = AuthSettings(sign_in_timeout=300.0)
    assert signing_in("https://mcp.example/mcp", browser) == 300.0
    assert signing_in("python server.py", browser) == 0.0  # stdio: no sign-in
    machine = AuthSettings(grant="client_credentials", sign_in_timeout=300.0)
    assert signing_in("https://mcp.example/mcp", machine) == 0.0


def test_a_sign_in_longer_than_the_connect_timeout_succeeds(server: Server, tmp_path: Path) -> None:
    """The person takes 2 s at the browser, the connection may take 1 s (`--connect-timeout`):
    the sign-in has its own time (`sign_in_timeout`), so the run goes on signed in."""
    opener = BROWSER.removesuffix(" %s")
    slow = f"sh -c 'sleep 2; exec {opener} \"$0\"' %s"
    done = run(tmp_path, server.url, "--connect-timeout", "1", browser=slow)
    assert done.returncode == 0, done.stderr
    assert tool_output(done) == "12 apples in stock"


def test_a_key_that_cannot_be_read_is_said_with_its_path(tmp_path: Path) -> None:
    """A worker's key for `private_key_jwt` beside its settings file; one it cannot read is
    a ConfigError naming it, not a traceback at the first token request."""
    from tether.errors import ConfigError
    from tether.tools.mcp_auth import AuthSettings, oauth

    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps({"grant": "client_credentials", "client_id": "w", "private_key_file": "k.pem"})
    )
    settings = AuthSettings.load(auth)
    assert settings.private_key_file == str(tmp_path / "k.pem")
    with pytest.raises(ConfigError, match=r"cannot read private_key_file .*k\.pem"):
        oauth("http://127.0.0.1:9/mcp", settings, None)
