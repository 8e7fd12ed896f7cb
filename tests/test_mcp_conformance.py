"""The MCP project's own conformance suite (`@modelcontextprotocol/conformance`, from npm)
against Tether's MCP client: each client scenario starts a server of the suite's (and, for the
auth scenarios, an authorization server), runs our client with its URL, and judges every
request it saw. The client is `conformance/client.py` (the Python API, `mcp_tools`), and for a
few scenarios `conformance/cli.sh` (`tether run --mcp URL --mcp-auth FILE`, as a user types it).

Skipped without node and npm, unless TETHER_REQUIRE_MCP_SUITE is set (CI sets it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
HERE = Path(__file__).parent / "conformance"

PASSING = [
    "initialize",
    "tools_call",
    "elicitation-sep1034-client-defaults",
    "sse-retry",
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/client-credentials-basic",
    "auth/client-credentials-jwt",
]
"""Every client scenario of suite 0.1.16 but two: `auth/2025-03-26-oauth-metadata-backcompat`
(its server's metadata names an issuer other than its own, which the SDK's issuer check, after
RFC 8414 §3.3, refuses), and the `cross-app-access` extension (identity assertions, not
supported)."""


@pytest.fixture(scope="session")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's CLI, installed once (a lock: the test processes may ask at once)."""
    if not (shutil.which("node") and shutil.which("npm")):
        if os.environ.get("TETHER_REQUIRE_MCP_SUITE"):
            pytest.fail("node and npm are needed for the MCP conformance suite")
        pytest.skip("no node and npm: the MCP conformance suite cannot run")
    lock = tmp_path_factory.getbasetemp().parent / "mcp-conformance.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = subprocess.run(
            [ROOT / "scripts" / "mcp-conformance", "--install"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    if done.returncode != 0:
        if os.environ.get("TETHER_REQUIRE_MCP_SUITE"):
            pytest.fail(f"the MCP conformance suite did not install: {done.stderr[-2000:]}")
        pytest.skip("the MCP conformance suite did not install (no npm registry?)")
    return Path(done.stdout.strip())


def judge(suite: Path, tmp_path: Path, *args: str, **env: str) -> tuple[int, str]:
    """The suite run with `args` (it writes its results under its cwd): its exit status and
    its report."""
    done = subprocess.run(
        ["node", str(suite), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    return done.returncode, done.stdout + done.stderr


def scenario(suite: Path, name: str, command: str, tmp_path: Path, **env: str) -> str:
    """Run one client scenario with `command` as the client; the suite's report."""
    return judge(suite, tmp_path, "client", "--command", command, "--scenario", name, **env)[1]


def passed(report: str) -> bool:
    return "OVERALL: PASSED" in report


@pytest.mark.parametrize("name", PASSING)
def test_client_scenario(suite: Path, name: str, tmp_path: Path) -> None:
    command = f"{sys.executable} {HERE / 'client.py'}"
    report = scenario(suite, name, command, tmp_path)
    assert passed(report), report[-4000:]


@pytest.mark.parametrize(
    ("name", "tool"),
    [
        ("auth/metadata-default", ""),  # registers, signs in at the "browser"
        ("auth/pre-registration", ""),  # the --mcp-auth file's client, Basic at the token endpoint
        ("auth/client-credentials-basic", ""),  # no browser: the grant for workers
        ("elicitation-sep1034-client-defaults", "test_client_elicitation_defaults"),
    ],
)
def test_tether_run_as_the_client(suite: Path, name: str, tool: str, tmp_path: Path) -> None:
    """`tether run --mcp URL --mcp-auth FILE --approve auto`: signs in as the file says and
    answers a question whose fields have defaults with them."""
    report = scenario(suite, name, f"sh {HERE / 'cli.sh'}", tmp_path, TETHER_CONFORMANCE_TOOL=tool)
    assert passed(report), report[-4000:]


def test_a_failed_check_fails_the_scenario(suite: Path, tmp_path: Path) -> None:
    """The judge can fail: a client that connects without signing in fails an auth scenario
    (so the passes above are the client's, not the suite's leniency)."""
    report = scenario(suite, "auth/metadata-default", "true", tmp_path)
    assert not passed(report)
    assert "FAILED" in report


def test_an_authorization_server_naming_another_issuer_is_refused(
    suite: Path, tmp_path: Path
) -> None:
    """The one auth scenario left out of PASSING fails on purpose: its server's metadata names an
    issuer other than the origin it was fetched from (RFC 8414 §3.3: a mix-up), so the client
    reads the metadata and goes no further: no registration, no sign-in, no token asked."""
    command = f"{sys.executable} {HERE / 'client.py'}"
    report = scenario(suite, "auth/2025-03-26-oauth-metadata-backcompat", command, tmp_path)
    assert "Expected Check Missing: token-request" in report, report[-4000:]
    assert "Expected Check Missing: client-registration" in report
    assert "Expected Check Missing: authorization-server-metadata" not in report


SERVER_SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    "dns-rebinding-protection",
    "logging-set-level",
    "completion-complete",
    "resources-list",
]


@pytest.fixture(scope="module")
def mcp_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`tether mcp-serve --http --no-token --port 0` (the suite sends no token), its URL."""
    work = tmp_path_factory.mktemp("mcp-serve")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "mcp-serve", "--http", "--no-token", "--port", "0",
         "--tools", "read_file,list_files", "--workspace", str(work),
         "--provider", "scripted", "--script", str(ROOT / "examples" / "weather_script.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "XDG_DATA_HOME": str(work / "data")},
    )  # fmt: skip
    assert proc.stderr is not None
    url = ""
    for line in proc.stderr:
        if line.startswith("tether mcp-serve: http://"):
            url = line.split()[2]
            break
    try:
        assert url, f"mcp-serve did not start: {proc.poll()}"
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("name", SERVER_SCENARIOS)
def test_server_scenario(suite: Path, mcp_serve: str, name: str, tmp_path: Path) -> None:
    status, report = judge(suite, tmp_path, "server", "--url", mcp_serve, "--scenario", name)
    assert status == 0 and "0 failed" in report, report[-4000:]
