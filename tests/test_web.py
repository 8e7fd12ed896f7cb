"""The web page in a real browser (Debian's Chromium driven by Playwright), against `tether serve`
running as a real process, its model a wire-level mock over HTTP. Screenshots go to
test-artifacts/."""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import warm
from helpers import FIXTURES, TETHER, Output, alive, cli_env, tether, wait_until
from tether.durable.ledger import Ledger
from tether.web.http import host_name
from wire_server import WireServer, tool_results

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent.parent / "test-artifacts"
TOKEN = "test-token-6f1d"

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

if sync_playwright is None or not os.path.exists(CHROMIUM):
    reason = "needs the playwright package and Debian's chromium (scripts/test installs both)"
    if os.environ.get("TETHER_REQUIRE_BROWSER"):
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)


def script(body: dict[str, Any]) -> dict[str, Any]:
    """The mock model's replies, chosen by the run's task and how far it has got."""
    first = body["messages"][1]["content"]
    done = tool_results(body)
    if first == "stream slowly":
        words = " ".join(f"word{i}" for i in range(40))
        return {"text": words, "deltas": 40, "chunk_delay": 0.1}
    if first == "run two commands":
        if done == 0:
            return {
                "calls": [
                    ("bash", {"command": "echo yes > approved.txt"}),
                    ("bash", {"command": "echo no > denied.txt"}),
                ]
            }
        return {"text": "One command ran, the other was denied."}
    if first == "sleep in a tool":
        if done == 0:
            return {"calls": [("bash", {"command": "sleep 30 & echo $! > child.pid; wait"})]}
        return {"text": "Woke up."}
    if first == "cancel me":
        return {"text": "never ending " * 100, "deltas": 200, "chunk_delay": 0.2}
    if first == "research tides":
        if done == 0:
            return {"calls": [("research", {"task": "tides"}, "c-tides")]}
        return {"text": "The lead's answer."}
    if first == "reserve apples":
        if done == 0:
            return {"calls": [("reserve", {"item": "apples"})]}
        return {"text": "Reserved."}
    if first == "inject":
        if done == 0:
            return {"calls": [("inject", {})]}
        return {"text": '<img src=x onerror="window.pwned=2"> the tool said something odd.'}
    if first == "ask, then talk slowly":
        if done == 0:
            return {"calls": [("bash", {"command": "true"}), ("bash", {"command": "false"})]}
        return {"text": "slowly " * 40, "deltas": 40, "chunk_delay": 0.5}  # 20 s: cancelled
    if first == "refuse me":
        return {"status": 400}  # not retried: the run fails
    return {"text": "I do not know that task."}


class Server:
    """`tether serve` in a process of its own, on a port it picks (`--port 0`) and prints."""

    def __init__(self, wire: WireServer, data: Path, workspace: Path, *extra: str) -> None:
        self.wire, self.data, self.workspace = wire, data, workspace
        self.extra = extra
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Server:
        self.proc = warm.Popen(
            [
                *TETHER,
                "serve",
                "--port",
                "0",
                "--token",
                TOKEN,
                "--base-url",
                self.wire.url,
                "--tools",
                "bash",
                "--tools-from",
                str(FIXTURES / "web_tools.py"),
                "--workspace",
                str(self.workspace),
                "--data-dir",
                str(self.data),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(OPENAI_API_KEY="sk-web"),
        )
        line = Output(self.proc.stderr).wait_for("tether serve: open http://")
        self.url = line.split("open ", 1)[1].split("/?", 1)[0]
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def wait_for(self, run_id: str, status: str) -> None:
        """Wait until the page's API shows the run in `status`."""

        def shown() -> bool:
            return bool(self.api("GET", f"/api/runs/{run_id}")["status"] == status)

        wait_until(shown, f"run {run_id} to be {status}", 30, 0.1)

    def kill_mid_reply(self) -> dict[str, Any]:
        """Start a run, kill -9 the server while its model reply is on the way, and return the
        run; the model's next reply (to whoever continues the run) comes at once."""
        held = threading.Event()
        words = " ".join(f"word{i}" for i in range(40))
        self.wire.add(text=words, gate=held).add(text=words)
        run: dict[str, Any] = self.api("POST", "/api/runs", {"task": "stream slowly"})
        wait_until(lambda: self.wire.requests, "the run to ask the model")
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        held.set()
        return run

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)

    def stream(self, run_id: str) -> Output:
        """The run's Server-Sent Events from the first, read in a thread as they come."""
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        conn.request("GET", f"/api/runs/{run_id}/events?offset=0", headers=auth)
        return Output(io.TextIOWrapper(conn.getresponse(), encoding="utf-8"))

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode() if body else None,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        # a run's start connects its MCP servers first (up to their 30 s connect timeout)
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())


@pytest.fixture
def server(wire: WireServer, tmp_path: Path) -> Iterator[Server]:
    wire.rule = script
    (tmp_path / "ws").mkdir()
    s = Server(wire, tmp_path / "data", tmp_path / "ws").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, server: Server) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{server.url}/?token={TOKEN}")  # kept in the page's storage, dropped from the URL
    page.wait_for_function("() => !location.search.includes('token')")
    yield page
    context.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"web-{name}.png"), full_page=True)


def start_from_form(page: Page, task: str) -> None:
    page.fill("textarea[name=task]", task)
    page.click("button[type=submit]")
    page.wait_for_url("**/runs/*")


def test_watch_deltas_arrive_and_a_reload_loses_nothing(page: Page, server: Server) -> None:
    start_from_form(page, "stream slowly")
    streaming = page.locator(".assistant").first
    expect(streaming).to_contain_text("word3", timeout=10_000)
    seen = len(streaming.inner_text())
    page.wait_for_timeout(600)
    assert len(streaming.inner_text()) > seen  # it grows as deltas arrive
    assert page.locator("#status").inner_text() == "running"
    shot(page, "streaming")
    page.reload()  # mid-run: the page replays from the first event, then follows live
    expect(page.locator(".user").first).to_have_text("stream slowly")
    expect(page.locator(".assistant").first).to_contain_text("word0 word1 word2")
    expect(page.locator("#status")).to_have_text("done", timeout=15_000)
    expect(page.locator(".answer")).to_contain_text("word39")
    shot(page, "done")


def test_approve_one_call_and_deny_another(page: Page, server: Server) -> None:
    run = server.api("POST", "/api/runs", {"task": "run two commands"})
    page.goto(f"{server.url}/runs/{run['id']}")
    expect(page.locator(".approval")).to_have_count(2, timeout=10_000)
    approve_box = page.locator(".tool", has_text="approved.txt")
    deny_box = page.locator(".tool", has_text="denied.txt")
    expect(approve_box.locator(".approval")).to_contain_text("Approve bash")
    shot(page, "approvals")
    approve_box.locator("button.approve").click()
    deny_box.locator("button.deny").click()
    expect(page.locator("#status")).to_have_text("done", timeout=10_000)
    expect(approve_box).to_contain_text("Approved")
    expect(deny_box).to_contain_text("Denied: denied in the web page")
    expect(deny_box.locator(".result")).to_contain_text("not approved")
    calls = page.locator("#timeline .bar.tool")  # parallel calls: a row each on the timeline
    expect(calls).to_have_count(2)
    rows = {box["y"] for box in (calls.nth(0).bounding_box(), calls.nth(1).bounding_box()) if box}
    assert len(rows) == 2
    # each bar says what it was, its tooltip how long it took and how it ended; a click on one
    # goes to its step in the log; the legend says what the colours are
    expect(calls.nth(0)).to_have_text("bash")
    titles = [calls.nth(i).get_attribute("title") or "" for i in range(2)]
    assert sorted(t.rsplit(" · ", 1)[-1] for t in titles) == ["failed", "ok"], titles  # denied
    assert all(re.fullmatch(r"bash · \d+ ms · (ok|failed)", t) for t in titles), titles
    model = page.locator("#timeline .bar.model").first
    expect(model).to_have_attribute("title", re.compile(r" ms · \d+ in, \d+ out tokens$"))
    expect(page.locator("#timeline .bar.error")).to_have_count(1)
    expect(page.locator("#legend")).to_contain_text("failed tool call")
    calls.nth(1).click()
    expect(page.locator(".tool.flash")).to_have_count(1)
    assert (server.workspace / "approved.txt").read_text() == "yes\n"
    assert not (server.workspace / "denied.txt").exists()
    shot(page, "approved-and-denied")


def test_the_inbox_approves_and_denies_the_calls_of_every_run(page: Page, server: Server) -> None:
    """The inbox lists every call waiting for a person across runs, with its run and full
    arguments; one run's calls approved there and another's denied with a reason, each run
    goes on; a call decided elsewhere meanwhile leaves the inbox."""
    first = server.api("POST", "/api/runs", {"task": "run two commands"})
    second = server.api("POST", "/api/runs", {"task": "run two commands"})
    page.goto(f"{server.url}/inbox")
    items = page.locator(".inbox-item")
    expect(items).to_have_count(4, timeout=10_000)
    expect(page.locator("#inbox-count")).to_have_text(
        "4 calls wait for a person, the oldest run's first."
    )
    mine = items.filter(has=page.locator(f"a[href='/runs/{first['id']}']"))
    theirs = items.filter(has=page.locator(f"a[href='/runs/{second['id']}']"))
    expect(mine).to_have_count(2)
    runs = [a.get_attribute("href") for a in page.locator(".inbox-item > div > a").all()]
    assert runs == [f"/runs/{first['id']}"] * 2 + [f"/runs/{second['id']}"] * 2  # oldest first
    expect(mine.first.locator(".args")).to_contain_text('"command": "echo yes > approved.txt"')
    assert pages_of_approvals(server) == [[first["id"]] * 2, [second["id"]] * 2]
    shot(page, "inbox")
    # one of the second run's calls is decided on its own page (here: the API) meanwhile: it
    # leaves the inbox
    waiting = server.api("GET", f"/api/runs/{second['id']}")["approvals"]
    server.api("POST", f"/api/runs/{second['id']}/deny", {"approval_id": waiting[0]["approval_id"]})
    expect(items).to_have_count(3)
    expect(theirs).to_have_count(1)
    hashes = {a["approval_id"]: a["args_hash"] for a in server.api("GET", "/api/approvals")}
    for i in range(2):
        with page.expect_request(lambda r: r.url.endswith("/approve")) as sent:
            mine.nth(i).locator("button.approve").click()
        body = sent.value.post_data_json  # the hash of the arguments the person saw
        assert body["args_hash"] == hashes[body["approval_id"]], body
    theirs.locator("input").fill("not on a Friday")
    theirs.locator("button.deny").click()
    expect(mine.locator(".said")).to_have_text(["Approved", "Approved"])
    expect(theirs.locator(".said")).to_have_text("Denied")
    server.wait_for(first["id"], "done")
    server.wait_for(second["id"], "done")
    results = [
        p["output"]
        for m in server.api("GET", f"/api/runs/{second['id']}")["transcript"]
        for p in m.get("parts", [])
        if p.get("type") == "tool_result"
    ]
    assert any("not on a Friday" in str(r) for r in results), results
    page.reload()
    expect(page.locator("#inbox-count")).to_have_text("No call waits for a person.")


def pages_of_approvals(server: Server) -> list[list[str]]:
    """The runs of the calls on each page of `GET /api/approvals`, a run a page, following
    each page's `Link` to the next."""
    pages, url = [], "/api/approvals?limit=1"
    while url:
        request = urllib.request.Request(
            server.url + url, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            pages.append([a["run_id"] for a in json.loads(r.read())])
            link = re.fullmatch(r'<([^>]+)>; rel="next"', r.headers.get("Link") or "")
        url = link.group(1) if link else ""
    return pages


def test_a_call_decided_already_says_how_and_by_whom(server: Server) -> None:
    """An approval sent for a call that was decided meanwhile (another tab, a colleague at the
    inbox) is refused with how it was decided and where, not a bare 'not waiting'."""
    decided_twice(server, server.api("POST", "/api/runs", {"task": "ask, then talk slowly"}))


def decided_twice(server: Server, run: dict[str, Any]) -> None:
    """Approve one of the run's two calls and deny the other, then decide each again once the
    run has taken both (its reply streams): each is refused saying how it was decided."""
    events = server.stream(run["id"])

    def asked() -> list[dict[str, Any]]:
        waiting: list[dict[str, Any]] = server.api("GET", f"/api/runs/{run['id']}")["approvals"]
        return waiting if len(waiting) == 2 else []

    first, second = (a["approval_id"] for a in wait_until(asked, "both calls"))
    server.api("POST", f"/api/runs/{run['id']}/approve", {"approval_id": first})
    server.api("POST", f"/api/runs/{run['id']}/deny", {"approval_id": second, "reason": "no"})

    def both_decided() -> bool:  # then the model's reply takes 20 s: the run is still on
        return len([e for e in sse(events) if e["type"] == "approval_decided"]) == 2

    wait_until(both_decided, "both decisions to be recorded")

    def refused(path: str, body: dict[str, Any]) -> tuple[int, str]:
        try:
            server.api("POST", f"/api/runs/{run['id']}/{path}", body)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]
        raise AssertionError(f"{path} {body} was taken")

    assert refused("deny", {"approval_id": first}) == (
        409,
        f"approval {first!r} was approved already: approved in the web page",
    )
    assert refused("approve", {"approval_id": second}) == (
        409,
        f"approval {second!r} was denied already: no",
    )
    server.api("POST", f"/api/runs/{run['id']}/cancel")


def test_the_page_approves_only_the_arguments_it_showed(server: Server) -> None:
    """An approval sent with the hash of the arguments the page showed is refused when the
    call waits with other arguments (here: another call's), and nothing runs; sent with its
    own, the call runs."""
    run_id = server.api("POST", "/api/runs", {"task": "run two commands"})["id"]

    def both_waiting() -> list[dict[str, Any]]:
        approvals: list[dict[str, Any]] = server.api("GET", f"/api/runs/{run_id}")["approvals"]
        return approvals if len(approvals) == 2 else []

    approvals = wait_until(both_waiting, "both calls to wait for approval", 30)
    asked = {a["arguments"]["command"]: a for a in approvals}
    yes, no = asked["echo yes > approved.txt"], asked["echo no > denied.txt"]
    swapped = {"approval_id": yes["approval_id"], "args_hash": no["args_hash"]}
    with pytest.raises(urllib.error.HTTPError) as refused:
        server.api("POST", f"/api/runs/{run_id}/approve", swapped)
    assert refused.value.code == 409
    assert "other arguments" in json.loads(refused.value.read())["error"]
    assert len(server.api("GET", f"/api/runs/{run_id}")["approvals"]) == 2  # both still wait
    assert not (server.workspace / "approved.txt").exists()
    own = {"approval_id": yes["approval_id"], "args_hash": yes["args_hash"]}
    server.api("POST", f"/api/runs/{run_id}/approve", own)
    server.api("POST", f"/api/runs/{run_id}/deny", {"approval_id": no["approval_id"]})
    server.wait_for(run_id, "done")
    assert (server.workspace / "approved.txt").read_text() == "yes\n"


@pytest.mark.parametrize("kept", ["store", "memory"])
def test_a_servers_question_is_answered_in_a_form_on_the_page(
    browser: Browser, wire: WireServer, tmp_path: Path, kept: str
) -> None:
    """An MCP server asks in the middle of a call (elicitation): the run waits, the page shows a
    form built from the question's schema with its defaults, and the answer typed there
    reaches the server; a run that waits only on such a question is in the inbox, kept in a
    store or in memory (in memory it was missing)."""
    wire.rule = script
    (tmp_path / "ws").mkdir()
    mcp = f"{sys.executable} {FIXTURES / 'mcp_server.py'}"
    extra = ("--store", "memory") if kept == "memory" else ()
    unasked = ("--mcp-approve", "reserve=never")  # its question, not its approval, is tested
    server = Server(wire, tmp_path / "data", tmp_path / "ws", "--mcp", mcp, *extra, *unasked)
    server.start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{server.url}/?token={TOKEN}")
        page.wait_for_function("() => !location.search.includes('token')")
        run_id = server.api("POST", "/api/runs", {"task": "reserve apples"})["id"]
        page.goto(f"{server.url}/runs/{run_id}")
        form = page.locator("form.question")
        expect(form).to_contain_text("asks: How many apples should be reserved?", timeout=30_000)
        asked = server.api("GET", f"/api/runs/{run_id}")["questions"]
        assert [q["message"] for q in asked] == ["How many apples should be reserved?"]
        expect(form.locator("[name=quantity]")).to_have_value("2")  # its default
        form.locator("[name=quantity]").fill("3")
        form.locator("[name=express]").check()
        shot(page, "question")
        form.locator("button.answer").click()
        expect(page.locator("#status")).to_have_text("done", timeout=20_000)
        expect(page.locator(".tool .result")).to_have_text("reserved 3 apples by express")
        expect(page.locator(".tool .decision")).to_have_text("Answered: accept")
        assert server.api("GET", f"/api/runs/{run_id}")["questions"] == []
        # the same question of another run, answered in the inbox beside the calls
        other = server.api("POST", "/api/runs", {"task": "reserve apples"})["id"]
        page.goto(f"{server.url}/inbox")
        item = page.locator(".inbox-item.question")
        expect(item).to_contain_text("How many apples should be reserved?", timeout=30_000)
        expect(item.locator(f"a[href='/runs/{other}']")).to_have_count(1)
        expect(page.locator("#inbox-count")).to_have_text(
            "1 question waits for a person, the oldest run's first."
        )
        item.locator("[name=quantity]").fill("5")
        item.locator("button.answer").click()
        expect(item.locator(".said")).to_have_text("Answered")
        server.wait_for(other, "done")
        results = [
            p["output"]
            for m in server.api("GET", f"/api/runs/{other}")["transcript"]
            for p in m.get("parts", [])
            if p.get("type") == "tool_result"
        ]
        assert results == ["reserved 5 apples"], results
    finally:
        context.close()
        server.stop()


def test_the_pages_follow_the_system_s_dark_mode(browser: Browser, server: Server) -> None:
    """Dark mode by `prefers-color-scheme`, within the page's CSP (its one nonced style)."""
    run = server.api("POST", "/api/runs", {"task": "stream slowly"})
    server.wait_for(run["id"], "done")
    colours = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(color_scheme=scheme)
        page = context.new_page()
        page.goto(f"{server.url}/runs/{run['id']}?token={TOKEN}")
        expect(page.locator("#status")).to_have_text("done", timeout=10_000)
        colours[scheme] = page.evaluate(
            "() => [getComputedStyle(document.body).backgroundColor,"
            " getComputedStyle(document.querySelector('.item')).backgroundColor]"
        )
        shot(page, f"run-{scheme}")
        context.close()
    assert colours["light"] == ["rgb(250, 251, 252)", "rgb(255, 255, 255)"]
    assert colours["dark"] == ["rgb(20, 23, 28)", "rgb(29, 33, 40)"]


def test_every_view_reads_at_390_px_wide_and_approves_by_keyboard(
    browser: Browser, server: Server
) -> None:
    """A phone's width (390 px): the list, a run, the inbox are as wide as the screen (nothing
    to scroll sideways); a waiting call is approved with Tab and Enter alone."""
    waiting = server.api("POST", "/api/runs", {"task": "run two commands"})
    done = server.api("POST", "/api/runs", {"task": "stream slowly"})
    server.wait_for(done["id"], "done")
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    page.goto(f"{server.url}/?token={TOKEN}")
    page.wait_for_function("() => !location.search.includes('token')")
    for name, path, ready in [
        ("list", "/", "#runs tr"),
        ("run", f"/runs/{done['id']}", ".answer"),
        ("inbox", "/inbox", ".inbox-item"),
    ]:
        page.goto(server.url + path)
        expect(page.locator(ready).first).to_be_visible(timeout=10_000)
        wide = page.evaluate("() => document.documentElement.scrollWidth")
        assert wide <= 390, (path, wide)
        shot(page, f"390px-{name}")
    page.goto(f"{server.url}/runs/{waiting['id']}")
    approve = page.locator(".approval button.approve").first
    expect(approve).to_be_visible(timeout=10_000)
    for _ in range(40):  # Tab until the first Approve has the focus, then Enter
        page.keyboard.press("Tab")
        if approve.evaluate("b => b === document.activeElement"):
            break
    page.keyboard.press("Enter")
    expect(page.locator(".tool", has_text="approved.txt")).to_contain_text("Approved")
    context.close()
    left = server.api("GET", f"/api/runs/{waiting['id']}")["approvals"]
    for a in left:  # the other call: the run ends before the server stops
        server.api("POST", f"/api/runs/{waiting['id']}/deny", {"approval_id": a["approval_id"]})
    server.wait_for(waiting["id"], "done")


def test_the_runs_list_filters_by_state_and_text_and_the_link_keeps_the_filter(
    page: Page, server: Server
) -> None:
    ran = server.api("POST", "/api/runs", {"task": "stream slowly"})
    errand = server.api("POST", "/api/runs", {"task": "an unknown errand"})
    server.api("POST", "/api/runs", {"task": "run two commands"})  # waits for its approvals
    server.wait_for(ran["id"], "done")
    server.wait_for(errand["id"], "done")
    page.goto(f"{server.url}/")
    rows, text = page.locator("#runs tr"), page.locator("#filter input[name=q]")
    expect(rows).to_have_count(3)
    expect(page.locator("#counts")).to_contain_text("3 runs: ")
    expect(page.locator("#counts")).to_contain_text("done 2")
    text.fill("ERRAND")  # any case, in the task, the id or the agent's name
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(errand["id"])
    assert page.url.endswith("/?q=errand")
    text.fill("")
    page.select_option("#filter select[name=state]", "done")
    expect(rows).to_have_count(2)
    page.reload()  # the link holds the filter
    expect(page.locator("#filter select[name=state]")).to_have_value("done")
    expect(rows).to_have_count(2)
    text.fill("nothing like this")
    expect(rows).to_have_count(0)
    expect(page.locator("#none")).to_have_text("No run matches this filter.")
    shot(page, "runs-filtered")


def test_the_dashboard_shows_each_accounts_spend_and_the_api_refuses_a_run_over_its_limit(
    page: Page, server: Server
) -> None:
    """Limits set from the command line on the server's store; a run started from the API in
    the account's name is counted against them; the next is refused (409, the limit named)
    and nothing is started; a bad account name is a 400. The dashboard's Accounts table shows
    the account's spend and limits, marked over its limit, with the reason as its tooltip."""
    store = ("--data-dir", str(server.data))
    assert tether("limits", "set", "acme", "--tokens-total", "1", *store).returncode == 0
    first = server.api("POST", "/api/runs", {"task": "an unknown errand", "account": "acme"})
    server.wait_for(first["id"], "done")
    asked = len(server.wire.requests)
    for body, status, said in [
        ({"task": "an unknown errand", "account": "acme"}, 409, "account budget: acme has used"),
        ({"task": "an unknown errand", "account": "a b"}, 400, "an account is"),
    ]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            server.api("POST", "/api/runs", body)
        assert refused.value.code == status
        assert said in json.loads(refused.value.read())["error"]
    assert len(server.wire.requests) == asked  # nothing started
    listed = server.api("GET", "/api/list?account=acme")["runs"]
    assert [r["id"] for r in listed] == [first["id"]] and listed[0]["account"] == "acme"
    assert server.api("GET", "/api/list?account=beta")["runs"] == []
    (acme,) = server.api("GET", "/api/accounts")["accounts"]
    assert acme["account"] == "acme" and acme["spent"]["total"]["tokens"] > 1
    assert acme["limits"] == {"tokens_total": 1, "when_over": "refuse"}
    page.goto(f"{server.url}/dashboard")
    row = page.locator("#accounts tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text(f"{acme['spent']['total']['tokens']} tokens")
    expect(row).to_contain_text("tokens total 1; a new run over a limit: refused")
    expect(row).to_have_class("status-halted")
    expect(row).to_have_attribute("title", re.compile("account budget: acme has used"))
    rate = ("--base-url", server.wire.url, "--requests", "100", "--tokens", "90000", *store)
    assert tether("limits", "rate", *rate, env=cli_env(OPENAI_API_KEY="sk-web")).returncode == 0
    page.reload()  # and the server's endpoint's rate, from the same read
    (rated,) = server.api("GET", "/api/accounts")["rates"]
    assert rated["endpoint"].startswith(f"openai-chat {server.wire.url} key:")
    expect(page.locator("#rates tr td")).to_have_text(
        [
            rated["endpoint"],
            "at most 100 requests and 90000 tokens a minute",
            "0 requests, 0 tokens",
            "no",
        ]
    )
    page.goto(f"{server.url}/?account=acme")  # the runs list, filtered by account
    expect(page.locator("#runs tr")).to_have_count(1)
    page.fill("#filter input[name=account]", "beta")
    expect(page.locator("#none")).to_be_visible()


def test_a_run_waiting_for_its_version_is_upgraded_from_the_list(
    page: Page, server: Server, tmp_path: Path
) -> None:
    """A run of version 1 queued on the page's store while only a version-2 worker runs: the
    list says it waits for version 1 and offers an Upgrade; a click moves it, and the v2
    worker finishes it. The API refuses an upgrade of a run that has ended (409)."""
    store = f"sqlite:///{server.data / 'runs.sqlite'}"
    script = str(FIXTURES / "versioned.py")
    env = cli_env(SENT_FILE=str(tmp_path / "sent"), OPENAI_API_KEY="sk-test")
    server.wire.rule = lambda body: {"text": "At your service."}
    worker = subprocess.Popen(
        [sys.executable, script, "work", "2", store, "v2", server.wire.url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:  # the Upgrade is refused until the v2 worker has said which versions it executes
        ledger = Ledger(store, connections=1)
        wait_until(lambda: "mailer@2" in str(ledger.served()), "the v2 worker", 60, 0.1)
        queued = [sys.executable, script, "queue", "1", store, server.wire.url, "idle-old"]
        assert subprocess.run(queued, env=env, check=False).returncode == 0
        page.goto(server.url + "/")
        status = page.locator("#runs tr", has_text="idle-old").locator("td").nth(2)
        expect(status).to_contain_text("waiting for version 1", timeout=20_000)
        status.get_by_role("button", name="Upgrade").click()
        expect(status).to_have_text("upgraded to version 2")
        server.wait_for("idle-old", "done")
        expect(status).to_have_text("done")
        page.goto(server.url + "/runs/idle-old")  # read from the store: where it was upgraded
        expect(page.locator(".note.version")).to_have_text(
            ["mailer version 1", "upgraded from version 1 to 2"]
        )
        expect(page.locator("#status")).to_have_text("done")
        with pytest.raises(urllib.error.HTTPError) as refused:
            server.api("POST", "/api/runs/idle-old/upgrade", {})
        assert refused.value.code == 409
        assert "has ended" in json.loads(refused.value.read())["error"]
    finally:
        worker.kill()
        worker.wait()


def test_the_dashboard_draws_runs_of_every_outcome_with_their_reasons(
    page: Page, server: Server, browser: Browser
) -> None:
    """Runs that ended done, halted (at their step limit), failed (the model refused) and
    cancelled: the dashboard's charts have a bar of each outcome, each saying its count, the
    reasons table names the halt's and the failure's, and the model calls' latency is given.
    Read from the store that `tether serve` keeps its runs in."""
    done = server.api("POST", "/api/runs", {"task": "an unknown errand"})
    halted = server.api("POST", "/api/runs", {"task": "inject", "max_steps": 1})
    failed = server.api("POST", "/api/runs", {"task": "refuse me"})
    cancelled = server.api("POST", "/api/runs", {"task": "cancel me"})
    server.api("POST", f"/api/runs/{cancelled['id']}/cancel")
    for run, outcome in ((done, "done"), (halted, "halted"), (failed, "failed")):
        server.wait_for(run["id"], outcome)
    server.wait_for(cancelled["id"], "cancelled")
    figures = server.api("GET", "/api/dashboard?window=day")
    assert [sum(figures["ended"][o]) for o in ("done", "halted", "failed", "cancelled")] == [
        1,
        1,
        1,
        1,
    ]
    assert sum(figures["started"]) == 4 and len(figures["started"]) == 24
    page.goto(f"{server.url}/dashboard")
    for outcome in ("done", "halted", "failed", "cancelled"):
        bar = page.locator(f"#runs-chart rect.c-{outcome}")
        expect(bar).to_have_count(1)
        expect(bar.locator("title")).to_contain_text(f"{outcome} 1")
    expect(page.locator("#runs-chart rect.c-started title")).to_contain_text("started 4")
    reasons = page.locator("#reasons tr")
    expect(reasons).to_have_count(2)
    expect(reasons.filter(has_text="halted")).to_contain_text("max_steps")
    expect(reasons.filter(has_text="failed")).to_contain_text("400")
    expect(page.locator("#latency")).to_contain_text(re.compile(r"\d+ model calls: p50 [\d.]+ ms"))
    expect(page.locator("#tokens-chart rect")).not_to_have_count(0)
    shot(page, "dashboard")
    page.set_viewport_size({"width": 390, "height": 844})  # its axes are drawn again, bigger
    axis = page.locator("#runs-chart text.axis").first
    expect(axis).to_have_attribute("font-size", re.compile(r"^[23]\d$"))  # 11 px on screen
    shot(page, "dashboard-390px")
    dark = browser.new_context(color_scheme="dark")
    night = dark.new_page()
    night.goto(f"{server.url}/dashboard?window=day&token={TOKEN}")
    expect(night.locator("#runs-chart rect.c-done")).to_have_count(1)
    shot(night, "dashboard-dark")
    dark.close()
    with pytest.raises(urllib.error.HTTPError) as refused:
        server.api("GET", "/api/dashboard?window=week")
    assert refused.value.code == 400


def test_in_memory_the_list_pages_and_the_dashboard_counts_the_servers_runs(
    wire: WireServer, tmp_path: Path
) -> None:
    """`tether serve --store memory` keeps no store: the list pages and filters its own runs,
    and the dashboard folds their events."""
    wire.rule = script
    (tmp_path / "ws").mkdir()
    memory = Server(wire, tmp_path / "data", tmp_path / "ws", "--store", "memory").start()
    try:
        ids = [memory.api("POST", "/api/runs", {"task": "an unknown errand"})["id"] for _ in "ab"]
        ids.append(memory.api("POST", "/api/runs", {"task": "refuse me"})["id"])
        for run_id, outcome in zip(ids, ("done", "done", "failed"), strict=True):
            memory.wait_for(run_id, outcome)
        first = memory.api("GET", "/api/list?limit=2")
        assert [r["id"] for r in first["runs"]] == ids[:0:-1] and first["next"]
        rest = memory.api("GET", f"/api/list?limit=2&cursor={first['next']}")
        assert [r["id"] for r in rest["runs"]] == ids[:1] and rest["next"] is None
        assert first["counts"] == {"done": 2, "failed": 1}
        failed = memory.api("GET", "/api/list?state=failed")["runs"]
        assert [r["id"] for r in failed] == ids[2:]
        figures = memory.api("GET", "/api/dashboard")
        assert sum(figures["started"]) == 3 and sum(figures["ended"]["done"]) == 2
        assert [r["outcome"] for r in figures["reasons"]] == ["failed"]
        assert figures["model_ms"]["calls"] == 2
        asking = [memory.api("POST", "/api/runs", {"task": "run two commands"}) for _ in "ab"]
        wait_until(lambda: len(memory.api("GET", "/api/approvals")) == 4, "four calls to wait")
        assert pages_of_approvals(memory) == [[asking[0]["id"]] * 2, [asking[1]["id"]] * 2]
        for run in asking:
            memory.api("POST", f"/api/runs/{run['id']}/cancel")
    finally:
        memory.stop()


@pytest.mark.parametrize("kept", ["store", "memory"])
def test_the_list_filters_each_ended_state_alike_in_memory_and_on_a_store(
    wire: WireServer, tmp_path: Path, kept: str
) -> None:
    """The list's state filter, run against both of its copies (the store's paged read and the
    memory's): done, halted and failed runs each listed under their own state only (on a store
    `?state=done` also listed the halted ones, both being DBOS's SUCCESS), and counted so;
    `tether runs --state` on the store alike."""
    wire.rule = script
    (tmp_path / "ws").mkdir()
    extra = ("--store", "memory") if kept == "memory" else ()
    serving = Server(wire, tmp_path / "data", tmp_path / "ws", *extra).start()
    try:
        done = serving.api("POST", "/api/runs", {"task": "an unknown errand"})["id"]
        halted = serving.api("POST", "/api/runs", {"task": "inject", "max_steps": 1})["id"]
        failed = serving.api("POST", "/api/runs", {"task": "refuse me"})["id"]
        for run_id, outcome in ((done, "done"), (halted, "halted"), (failed, "failed")):
            serving.wait_for(run_id, outcome)
        for state, ids in (("done", [done]), ("halted", [halted]), ("failed", [failed])):
            listed = serving.api("GET", f"/api/list?state={state}")
            assert [r["id"] for r in listed["runs"]] == ids, (state, listed["runs"])
        both = serving.api("GET", "/api/list?state=done,halted")["runs"]
        assert [r["id"] for r in both] == [halted, done]
        assert serving.api("GET", "/api/list")["counts"] == {"done": 1, "halted": 1, "failed": 1}
        if kept == "store":  # and `tether runs --state`, the store's listing for the CLI
            store = f"sqlite:///{tmp_path / 'data' / 'runs.sqlite'}"
            for state, ids in (
                ("done", [done]),
                ("halted", [halted]),
                ("done,failed", [done, failed]),
            ):
                said = tether("runs", "--store", store, "--state", state)
                assert [line.split("\t")[0] for line in said.stdout.splitlines()] == ids, said
    finally:
        serving.stop()


def test_a_run_is_forked_from_a_step_on_its_page(page: Page, server: Server) -> None:
    """Each whole step has "Fork after step N": the fork's page opens, names its origin with a
    link, and the fork goes on from the step's tool result (the mock model, which answers by
    how many results it has read, answers at once); a fork that cannot be made says why."""
    run = server.api("POST", "/api/runs", {"task": "inject"})
    server.wait_for(run["id"], "done")
    page.goto(f"{server.url}/runs/{run['id']}")
    expect(page.locator("#status")).to_have_text("done", timeout=15_000)
    buttons = page.locator(".fork button")
    expect(buttons).to_have_text(["Fork after step 1", "Fork after step 2"])
    page.once("dialog", lambda dialog: dialog.accept(""))  # no message
    buttons.first.click()
    page.wait_for_url(lambda url: run["id"] not in url)
    origin = page.locator(".origin a")
    expect(origin).to_have_text(run["id"])
    expect(page.locator(".origin")).to_contain_text("after its step 1")
    expect(page.locator("#status")).to_have_text("done", timeout=15_000)
    expect(page.locator(".answer")).to_contain_text("the tool said something odd")
    assert page.locator("#log .tool").count() == 0  # the step's call was not made again
    expect(page.locator(".fork button")).to_have_text(["Fork after step 2"])  # it counts on
    shot(page, "fork")
    origin.click()
    page.wait_for_url(f"**/runs/{run['id']}")
    page.once("dialog", lambda dialog: dialog.accept(""))  # after the answer, with no message
    page.locator(".fork button").last.click()
    expect(page.locator(".fork .error").last).to_contain_text("give a message for the fork")


def test_cancel_a_run(page: Page, server: Server) -> None:
    start_from_form(page, "cancel me")
    expect(page.locator(".assistant").first).to_contain_text("never ending", timeout=10_000)
    page.click("#cancel")
    expect(page.locator("#status")).to_have_text("cancelled", timeout=5_000)
    run_id = page.url.rsplit("/", 1)[1]
    assert server.api("GET", f"/api/runs/{run_id}")["status"] == "cancelled"
    shot(page, "cancelled")


def test_injected_markup_stays_text(page: Page, server: Server) -> None:
    start_from_form(page, "inject")
    expect(page.locator("#status")).to_have_text("done", timeout=10_000)
    result = page.locator(".tool .result")
    expect(result).to_contain_text("<script>window.pwned=1</script>")
    expect(page.locator(".answer")).to_contain_text('<img src=x onerror="window.pwned=2">')
    assert page.evaluate("window.pwned") is None
    assert page.locator("#log script, #log img").count() == 0
    shot(page, "injection-as-text")


def test_the_page_links_a_child_run_and_the_list_nests_it(page: Page, server: Server) -> None:
    """An agent used as a tool (web_tools.research): its call links the child run's page,
    which links back, and the runs list shows the child under its parent."""
    run = server.api("POST", "/api/runs", {"task": "research tides"})
    child = f"{run['id']}.c-tides"
    page.goto(f"{server.url}/runs/{run['id']}")
    expect(page.locator("#status")).to_have_text("done", timeout=10_000)
    link = page.locator(".tool a.child-run")
    expect(link).to_have_text(f"child run {child}")
    expect(page.locator(".tool .result")).to_have_text("the researcher found it")
    # the timeline: two model calls on the top row, the child's call between them below
    models, tools = page.locator("#timeline .bar.model"), page.locator("#timeline .bar.tool")
    expect(models).to_have_count(2)
    expect(tools).to_have_count(1)
    expect(tools).to_have_attribute("title", re.compile(r"^research · \d+ ms · ok$"))
    first, second, call = (b.bounding_box() for b in (models.nth(0), models.nth(1), tools))
    assert first and second and call
    assert first["y"] == second["y"] < call["y"]
    assert first["x"] + first["width"] <= call["x"] + 1
    assert call["x"] + call["width"] <= second["x"] + 1
    # a bar is as wide as its time: nothing drawn around it (a tool item's border was, 4 px)
    drawn, meant = tools.evaluate(
        "e => [e.getBoundingClientRect().width,"
        " parseFloat(e.style.width) / 100 * e.parentElement.clientWidth]"
    )
    assert abs(drawn - meant) <= 1, (drawn, meant)
    shot(page, "tree-parent")
    link.click()
    expect(page.locator("#run-id")).to_have_text(child)
    expect(page.locator("#status")).to_have_text("done", timeout=10_000)
    expect(page.locator(".user").first).to_have_text("tides")
    expect(page.locator(".note.parent a")).to_have_text(run["id"])
    assert server.api("GET", f"/api/runs/{child}")["parent_run_id"] == run["id"]
    page.goto(f"{server.url}/")
    rows = page.locator("#runs tr")
    expect(rows).to_have_count(2, timeout=10_000)
    expect(rows.nth(0).locator("a")).to_have_text(run["id"])  # the parent first, though older
    expect(rows.nth(1)).to_have_class("child")
    expect(rows.nth(1)).to_contain_text(f"\u21b3 {child}")
    shot(page, "tree-list")


def test_a_page_opened_after_a_server_restart_shows_the_whole_run(
    browser: Browser, server: Server
) -> None:
    run = server.api("POST", "/api/runs", {"task": "stream slowly"})
    server.wait_for(run["id"], "done")
    server.stop()
    server.start()
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{server.url}/runs/{run['id']}?token={TOKEN}")
    expect(page.locator("#status")).to_have_text("done", timeout=10_000)
    expect(page.locator(".user").first).to_have_text("stream slowly")
    expect(page.locator(".answer")).to_contain_text("word0 word1")
    # the version the run started with, as the store recorded it, on the page and in the list
    listed = [r for r in server.api("GET", "/api/runs") if r["id"] == run["id"]]
    version = listed[0]["version"]
    assert isinstance(version, str) and len(version) == 12
    expect(page.locator(".version")).to_have_text(f"tether version {version}")
    shot(page, "after-restart")
    context.close()


def test_the_api_needs_the_token_as_a_header_and_never_takes_a_cookie(server: Server) -> None:
    """A cookie is sent by the browser to every port of 127.0.0.1, so any local server the
    user opened received the token the page used to set in one; now the token goes only as a
    header (or in a GET's query: the link, and the page's event stream), nothing sets a
    cookie, and a cookie holding the token opens nothing."""

    def status(path: str, method: str = "GET", headers: dict[str, str] | None = None) -> int:
        request = urllib.request.Request(
            server.url + path, method=method, data=b"{}", headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code

    assert status("/api/runs") == 401
    assert status("/api/runs", headers={"Authorization": "Bearer wrong"}) == 401
    assert status("/api/runs", headers={"Cookie": f"tether_token={TOKEN}"}) == 401
    assert status(f"/api/runs?token={TOKEN}") == 200  # a GET's query (an EventSource's)
    as_json = {"Content-Type": "application/json"}
    assert status(f"/api/runs?token={TOKEN}", "POST", as_json) == 401  # a write: header only
    bearer = {"Authorization": f"Bearer {TOKEN}", **as_json}
    assert status("/api/runs", "POST", bearer) == 400  # no task
    # a page of another origin (another port of this host) is refused, with the token too
    other = {"Origin": f"http://127.0.0.1:{server.port + 1}", **bearer}
    assert status("/api/runs", "POST", other) == 403
    assert status("/api/runs", "GET", other) == 403
    assert status("/api/runs", "GET", {"Origin": server.url, **bearer}) == 200
    # a refused client's connection is closed with the answer; a client let in keeps its own
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    for headers, code, kept in [
        ({}, 401, False),
        ({"Authorization": f"Bearer {TOKEN}"}, 200, True),
    ]:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("GET", "/api/runs", headers=headers)
        answer = conn.getresponse()
        answer.read()
        assert answer.status == code and answer.will_close is not kept
        conn.close()


def raw_request(
    server: Server, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """A request sent as written: its own Host header, any bytes in a header."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value.encode("utf-8"))
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_the_pages_are_shells_and_the_link_sets_no_cookie(server: Server) -> None:
    """The pages hold no data without the token (their scripts load it through the API); a
    link with a wrong token is refused; the right one is answered without a cookie."""
    run = server.api("POST", "/api/runs", {"task": "a secret task"})
    server.wait_for(run["id"], "done")
    here = {"Host": f"127.0.0.1:{server.port}"}
    for path in ("/", f"/runs/{run['id']}"):
        status, headers, body = raw_request(server, "GET", path, here)
        assert status == 200 and "set-cookie" not in headers
        assert "a secret task" not in body.decode()
    status, headers, _ = raw_request(server, "GET", "/?token=not-the-token", here)
    assert status == 401 and "set-cookie" not in headers
    status, headers, _ = raw_request(server, "GET", f"/runs/r1?token={TOKEN}&tab=events", here)
    assert status == 200 and "set-cookie" not in headers
    # a Host this server does not serve is named in the refusal, cut to 100 characters
    status, _, body = raw_request(server, "GET", "/api/runs", {"Host": "e" * 300})
    assert status == 421 and body.decode().endswith(repr("e" * 100))


def test_the_browser_keeps_the_token_per_origin_and_no_cookie(page: Page, server: Server) -> None:
    """Opened from the link, the page keeps the token in its own storage (per origin: another
    port cannot read it), the browser holds no cookie, and the list shows each task as text."""
    task = '<img src=x onerror="window.pwned=3"> and <b>bold</b>'
    run = server.api("POST", "/api/runs", {"task": task})
    server.wait_for(run["id"], "done")
    page.reload()
    expect(page.locator("#runs td", has_text="and <b>bold</b>")).to_be_visible()
    assert page.evaluate("localStorage.getItem('tether-token')") == TOKEN
    assert page.context.cookies() == []
    assert page.evaluate("window.pwned") is None
    assert page.locator("#runs b").count() == 0 and page.locator("#runs img").count() == 0


def test_a_host_header_names_a_host_without_its_port() -> None:
    assert host_name("[::1]:8000") == "::1" and host_name("[::1]") == "::1"
    assert host_name(" LocalHost:8000") == "localhost"
    assert host_name("::1") == "::1"  # a bare IPv6 address has no port to drop
    assert host_name("[::1") == "[::1"  # malformed: kept whole, so it matches no name


def test_requests_come_from_where_they_should(server: Server) -> None:
    here = f"127.0.0.1:{server.port}"
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    # DNS rebinding: a page on evil.example sends its own name, even with the token
    status, _, _ = raw_request(server, "GET", f"/?token={TOKEN}", {"Host": "evil.example"})
    assert status == 421
    assert raw_request(server, "GET", "/api/runs", {"Host": "evil.example", **bearer})[0] == 421
    # names that only begin (or end) like one of the server's are other hosts
    for name in ("localhost.evil.example", "127.0.0.1.nip.io", "evil-localhost", "localhostx"):
        for host in (name, f"{name}:{server.port}"):
            assert raw_request(server, "GET", "/api/runs", {"Host": host, **bearer})[0] == 421
    assert raw_request(server, "GET", "/api/runs", {"Host": here, **bearer})[0] == 200
    named = {"Host": f"localhost:{server.port}", **bearer}
    assert raw_request(server, "GET", "/api/runs", named)[0] == 200
    # a body another origin can send without a preflight starts nothing
    form = {"Host": here, **bearer, "Content-Type": "text/plain"}
    status, _, body = raw_request(server, "POST", "/api/runs", form, b'{"task": "t"}')
    assert status == 415 and b"application/json" in body
    assert server.api("GET", "/api/runs") == []
    # a token that is not ASCII is a wrong token, not a crash
    odd = {"Host": here, "Authorization": "Bearer t\u00f6ken"}
    assert raw_request(server, "GET", "/api/runs", odd)[0] == 401
    # no framing, no sniffing, no referrer; the page runs its own scripts only
    status, headers, page = raw_request(server, "GET", "/", {"Host": here, **bearer})
    assert status == 200
    policy = headers["content-security-policy"]
    nonce = policy.split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">'.encode() in page and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    _, api_headers, _ = raw_request(server, "GET", "/api/runs", {"Host": here, **bearer})
    assert "frame-ancestors 'none'" in api_headers["content-security-policy"]


def test_binding_beyond_loopback_needs_a_flag() -> None:
    p = warm.run(
        [*TETHER, "serve", "--host", "0.0.0.0", "--base-url", "http://x/v1"],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
    )
    assert p.returncode == 2 and "--allow-remote" in p.stderr


def test_a_port_in_use_is_a_one_line_error(server: Server) -> None:
    """A second server on a taken port says so and exits; the first one keeps serving."""
    p = tether(
        *("serve", "--port", str(server.port), "--base-url", server.wire.url),
        *("--data-dir", str(server.data)),
        OPENAI_API_KEY="sk-web",
    )
    assert p.returncode == 2, p.stderr
    assert f"cannot serve on 127.0.0.1:{server.port}" in p.stderr
    assert "Traceback" not in p.stderr
    assert server.api("GET", "/api/runs") == []


def test_a_run_the_server_lost_is_finished_by_tether_resume(server: Server) -> None:
    """Runs started from the page are recorded: kill -9 the server mid-reply, and `tether
    resume` finishes the run from the store."""
    run = server.kill_mid_reply()
    p = warm.run(
        [*TETHER, "resume", run["id"], "--json", "--data-dir", str(server.data)],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(OPENAI_API_KEY="sk-web"),
    )
    assert p.returncode == 0, p.stderr
    final = json.loads(p.stdout.splitlines()[-1])
    assert final["type"] == "run_finished" and final["outcome"] == "done"
    assert final["answer"].startswith("word0 word1")


def test_a_restarted_server_finishes_the_runs_it_lost(server: Server) -> None:
    """kill -9 the server mid-reply and start it again: it takes the run over from the store,
    and the run ends on its own."""
    run = server.kill_mid_reply()
    server.start()
    server.wait_for(run["id"], "done")
    shown = server.api("GET", f"/api/runs/{run['id']}")
    assert shown["answer"].startswith("word0 word1")


def test_a_bad_start_request_is_refused_and_registers_nothing(server: Server) -> None:
    bad = [
        {"task": "t", "run_id": 5},
        {"task": "t", "run_id": "../escape"},
        {"task": "t", "max_cost": float("nan")},
        {"task": "t", "max_cost": -1},
        {"task": "t", "max_steps": 0},
        {"task": "t", "max_steps": True},
        {"task": "t", "model": ["a"]},
        {"task": "t", "tool_choice": "nonesuch"},
        {"task": "t", "tool_choice": 5},
    ]
    for body in bad:
        request = urllib.request.Request(
            server.url + "/api/runs",
            method="POST",
            data=json.dumps(body).encode(),  # NaN goes out as the bare token NaN
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400, body
        assert "error" in json.loads(refused.value.read())
    assert server.api("GET", "/api/runs") == []
    index = urllib.request.Request(server.url + "/", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(index, timeout=10) as r:
        assert r.status == 200


def test_the_server_holds_no_file_for_a_run_that_ended(server: Server) -> None:
    ids = [server.api("POST", "/api/runs", {"task": f"chat {i}"})["id"] for i in range(30)]
    wait_until(
        lambda: all(
            r["status"] not in ("queued", "running") for r in server.api("GET", "/api/runs")
        ),
        "every run to end",
        60,
        0.1,
    )
    assert {r["id"] for r in server.api("GET", "/api/runs")} == set(ids)
    assert server.proc is not None
    fds = Path(f"/proc/{server.proc.pid}/fd")
    journals = [
        target
        for fd in fds.iterdir()
        if (target := os.path.realpath(fd)).startswith(str(server.data.resolve()))
        and target.endswith(".jsonl")
    ]
    assert journals == []


def test_runs_over_max_runs_wait_in_a_queue_the_page_shows(
    wire: WireServer, tmp_path: Path
) -> None:
    wire.rule = script
    (tmp_path / "ws").mkdir()
    server = Server(wire, tmp_path / "data", tmp_path / "ws", "--max-runs", "1").start()
    try:
        first = server.api("POST", "/api/runs", {"task": "stream slowly"})  # a 4 s reply
        second = server.api("POST", "/api/runs", {"task": "chat"})
        assert server.api("GET", f"/api/runs/{second['id']}")["status"] == "queued"
        server.api("POST", f"/api/runs/{first['id']}/cancel")
        server.wait_for(second["id"], "done")
    finally:
        server.stop()


# -- runs that workers on other machines execute ------------------------------------------------


def sse(out: Output) -> list[dict[str, Any]]:
    """The events an `Server.stream` has received so far."""
    return [json.loads(line[6:]) for line in list(out.lines) if line.startswith("data: ")]


class Fleet(Server):
    """`tether serve` on a Postgres store, and workers beside it that the store's queue
    feeds: the page's server executes none of the runs (two machines, on one)."""

    def __init__(self, wire: WireServer, tmp: Path, store: str) -> None:
        (tmp / "ws").mkdir()
        # unsandboxed: a test reads the host pid of a tool's child (a sandbox's are its own)
        super().__init__(wire, tmp / "data", tmp / "ws", "--store", store, "--no-sandbox")
        self.store = store
        self.workers: list[subprocess.Popen[str]] = []

    def worker(self, name: str = "far-worker") -> None:
        proc = warm.Popen(
            [
                *(*TETHER, "worker", "--store", self.store, "--executor-id", name),
                *("--beat", "0.5", "--allow-base-url", self.wire.url, "--no-sandbox"),
                *("--tools", "bash", "--tools-from", str(FIXTURES / "web_tools.py")),
                *("--workspace", str(self.workspace)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(OPENAI_API_KEY="sk-web"),
        )
        self.workers.append(proc)
        Output(proc.stderr).wait_for("taking queued runs")

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for proc in self.workers:
                proc.kill()
                proc.wait()


@pytest.fixture
def fleet(wire: WireServer, tmp_path: Path, postgres: str) -> Iterator[Fleet]:
    wire.rule = script
    fleet = Fleet(wire, tmp_path, postgres)
    fleet.start()
    yield fleet
    fleet.stop()


def test_the_page_follows_and_answers_a_run_a_worker_executes(
    fleet: Fleet, wire: WireServer
) -> None:
    queued = fleet.api("POST", "/api/runs", {"tasks": ["run two commands"], "run_id": "far"})
    assert queued == {"ids": ["far"], "status": "queued"}
    events = fleet.stream("far")
    assert fleet.api("GET", "/api/runs/far")["status"] == "queued"
    fleet.worker()  # after the server has been up with the run queued: it never takes it
    wait_until(
        lambda: [e for e in sse(events) if e["type"] == "approval_requested"][1:],
        "both approval requests on the page's stream",
    )
    run = fleet.api("GET", "/api/runs/far")
    assert run["status"] == "waiting" and run["worker"] == "far-worker"
    listed = {r["id"]: r for r in fleet.api("GET", "/api/runs")}
    assert listed["far"]["status"] == "waiting" and listed["far"]["task"] == "run two commands"
    fleet.api("POST", "/api/runs/far/messages", {"text": "and say thanks"})
    asked = {a["arguments"]["command"]: a for a in run["approvals"]}
    yes, no = asked["echo yes > approved.txt"], asked["echo no > denied.txt"]
    fleet.api(
        "POST",
        "/api/runs/far/approve",
        {"approval_id": yes["approval_id"], "args_hash": yes["args_hash"]},
    )
    fleet.api("POST", "/api/runs/far/deny", {"approval_id": no["approval_id"]})
    events.wait_for('"run_finished"')
    seen = sse(events)
    types = [e["type"] for e in seen]
    assert types[-1] == "end" and types[-2] == "run_finished"
    assert seen[-2]["outcome"] == "done"
    assert types.index("approval_decided") < types.index("tool_result")
    decided = {e["approval_id"]: e for e in seen if e["type"] == "approval_decided"}
    assert decided[yes["approval_id"]]["approved"] is True
    assert decided[no["approval_id"]]["reason"] == "denied in the web page"
    assert (fleet.workspace / "approved.txt").read_text() == "yes\n"
    assert not (fleet.workspace / "denied.txt").exists()
    last = wire.requests[-1]["messages"]
    assert last[-1] == {"role": "user", "content": "and say thanks"}
    assert fleet.api("GET", "/api/runs/far")["status"] == "done"


def test_a_call_a_worker_decided_already_says_how_and_by_whom(fleet: Fleet) -> None:
    fleet.worker()
    body = {"task": "ask, then talk slowly", "queue": True, "run_id": "slow"}
    assert fleet.api("POST", "/api/runs", body)["ids"] == ["slow"]
    decided_twice(fleet, {"id": "slow"})


def test_the_page_cancels_a_run_a_worker_executes_at_once(fleet: Fleet) -> None:
    fleet.worker()
    fleet.api("POST", "/api/runs", {"task": "sleep in a tool", "queue": True, "run_id": "nap"})
    ask = wait_until(lambda: fleet.api("GET", "/api/runs/nap")["approvals"], "the approval")
    fleet.api("POST", "/api/runs/nap/approve", {"approval_id": ask[0]["approval_id"]})
    pid_file = fleet.workspace / "child.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the tool's child")
    answer = fleet.api("POST", "/api/runs/nap/cancel")
    assert answer == {"cancelled": True, "status": "cancelled"}
    # the worker stops the tool now, not at the run's next step 30 s later
    pid = int(pid_file.read_text())
    wait_until(lambda: not alive(pid), "the worker to stop the cancelled tool", 10)
    ended = fleet.stream("nap")
    ended.wait_for('"end"')
    finished = [e for e in sse(ended) if e["type"] == "run_finished"]
    assert [e["outcome"] for e in finished] == ["cancelled"]
    assert fleet.api("POST", "/api/runs/nap/cancel") == {"cancelled": False, "status": "cancelled"}


def test_a_queue_request_that_cannot_be_met_queues_nothing(fleet: Fleet) -> None:
    def refused(body: dict[str, Any]) -> tuple[int, str]:
        try:
            fleet.api("POST", "/api/runs", body)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]
        raise AssertionError(f"{body} was queued")

    assert refused({"tasks": []})[0] == 400
    assert refused({"tasks": ["ok", ""]})[0] == 400
    assert refused({"tasks": "one"})[0] == 400
    fleet.api("POST", "/api/runs", {"tasks": ["chat"], "run_id": "taken"})
    code, message = refused({"tasks": ["a", "b"], "run_id": "taken", "max_steps": "x"})
    assert code == 400
    code, message = refused({"task": "again", "queue": True, "run_id": "taken"})
    assert code == 400 and "taken" in message and "nothing queued" in message
    ids = {r["id"] for r in fleet.api("GET", "/api/runs")}
    assert "taken" in ids and not {"taken-1", "taken-2"} & ids


def test_the_page_shows_a_worker_s_run_live_and_approves_it_in_a_browser(
    browser: Browser, fleet: Fleet
) -> None:
    fleet.worker()
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{fleet.url}/?token={TOKEN}")
    page.fill("textarea[name=task]", "run two commands")
    page.check("input[name=queue]")
    page.click("button[type=submit]")
    page.wait_for_url("**/runs/*")
    expect(page.locator(".approval")).to_have_count(2, timeout=15_000)
    approve_box = page.locator(".tool", has_text="approved.txt")
    deny_box = page.locator(".tool", has_text="denied.txt")
    approve_box.locator("button.approve").click()
    deny_box.locator("button.deny").click()
    expect(page.locator("#status")).to_have_text("done", timeout=15_000)
    expect(approve_box).to_contain_text("Approved")
    expect(deny_box.locator(".result")).to_contain_text("not approved")
    assert (fleet.workspace / "approved.txt").read_text() == "yes\n"
    run_id = page.url.rsplit("/", 1)[1]
    page.goto(fleet.url)
    expect(page.locator("#runs tr", has_text=run_id)).to_contain_text("done", timeout=5_000)
    shot(page, "worker-run-listed")
    context.close()


def test_the_list_pages_and_filters_two_thousand_stored_runs(
    browser: Browser, fleet: Fleet
) -> None:
    """2,000 runs queued in the store (no worker takes them): the API pages through every one
    once, newest first, by cursor; the page shows 50, then 50 older at a click; a filter finds
    one run among them, and a state no run is in says so."""
    tasks = [f"errand {i:04d}" for i in range(2000)]
    ids = fleet.api("POST", "/api/runs", {"tasks": tasks, "run_id": "bulk"})["ids"]
    first = fleet.api("GET", "/api/list")
    assert first["counts"] == {"queued": 2000} and len(first["runs"]) == 50
    rows, page_after = first["runs"], first["next"]
    while page_after:
        more = fleet.api("GET", f"/api/list?limit=500&cursor={page_after}")
        rows += more["runs"]
        page_after = more["next"]
    assert sorted(r["id"] for r in rows) == sorted(ids) and len(rows) == 2000  # each once
    queued_at = [r["queued_at"] for r in rows]
    assert queued_at == sorted(queued_at, reverse=True)  # newest first
    found = fleet.api("GET", "/api/list?q=ERRAND%201234&state=queued,running")
    assert [r["id"] for r in found["runs"]] == [ids[1234]] and found["next"] is None
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{fleet.url}/?token={TOKEN}")
    rows = page.locator("#runs tr")
    expect(rows).to_have_count(50)
    expect(page.locator("#counts")).to_have_text("2000 runs: queued 2000")
    page.click("#more")
    expect(rows).to_have_count(100)
    page.fill("#filter input[name=q]", "errand 0042")
    expect(rows).to_have_count(1)
    expect(page.locator("#more")).to_be_hidden()
    page.fill("#filter input[name=q]", "")
    page.select_option("#filter select[name=state]", "done")
    expect(page.locator("#none")).to_be_visible()
    assert "state=done" in page.url
    context.close()
    for bad in ("limit=0", "limit=x", "cursor=nonsense"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            fleet.api("GET", f"/api/list?{bad}")
        assert refused.value.code == 400


def test_the_inbox_decides_for_three_runs_on_two_workers(browser: Browser, fleet: Fleet) -> None:
    """Three runs queued for two workers, each waiting for two approvals: the inbox lists all
    six with their runs, and the calls approved and denied there let each run go on, on
    whichever worker holds it."""
    fleet.worker("worker-a")
    fleet.worker("worker-b")
    ids = fleet.api("POST", "/api/runs", {"tasks": ["run two commands"] * 3, "run_id": "ask"})[
        "ids"
    ]
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{fleet.url}/inbox?token={TOKEN}")
    items = page.locator(".inbox-item")
    expect(items).to_have_count(6, timeout=20_000)
    workers = {fleet.api("GET", f"/api/runs/{i}")["worker"] for i in ids}
    assert workers <= {"worker-a", "worker-b"} and None not in workers
    for run_id in ids:
        run_items = items.filter(has=page.locator(f"a[href='/runs/{run_id}']"))
        expect(run_items).to_have_count(2)
        run_items.filter(has_text="approved.txt").locator("button.approve").click()
        run_items.filter(has_text="denied.txt").locator("button.deny").click()
    for run_id in ids:
        fleet.wait_for(run_id, "done")
    page.reload()
    expect(page.locator("#inbox-count")).to_have_text("No call waits for a person.")
    context.close()
    assert (fleet.workspace / "approved.txt").read_text() == "yes\n"
    assert not (fleet.workspace / "denied.txt").exists()


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed this connection (reading waits up to the socket's timeout,
    which fails the test if the server keeps it)."""
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True
    finally:
        s.close()


def test_slow_clients_cannot_hold_the_page_s_connections(wire: WireServer, tmp_path: Path) -> None:
    """A client that sends a byte of headers now and then (slowloris) held each connection
    for ever, and the server ran out of descriptors before looking at a token. Now a
    connection's first headers have a deadline, the connections are capped (more are closed
    as they arrive), and a refused client's connection is closed with its answer."""
    wire.rule = script
    (tmp_path / "ws").mkdir()
    extra = ("--header-timeout", "1", "--max-connections", "4")
    server = Server(wire, tmp_path / "data", tmp_path / "ws", *extra).start()
    try:
        slow = []
        for _ in range(4):  # the cap's worth, each mid-headers
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow.append(s)
        extra_one = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        extra_one.sendall(b"GET / HTTP/1.1\r\n")
        assert closed_by_server(extra_one)  # over the cap: closed as it came
        for s in slow:  # each closed at its deadline, before it ever sent a full request
            assert closed_by_server(s)
        assert server.api("GET", "/api/runs") == []  # and the page answers again
        # a client that is refused is not kept: the answer closes its connection
        status, headers, _ = raw_request(server, "GET", "/api/runs", {"Host": "127.0.0.1"})
        assert status == 401 and headers.get("connection", "").lower() == "close"
    finally:
        server.stop()


def test_serve_starts_without_a_model_key_to_watch_a_store(
    wire: WireServer, tmp_path: Path
) -> None:
    """`tether serve --store ...` exited `OPENAI_API_KEY is not set` with no key: a person
    who only watches the store's runs (list, approve, cancel) needs none. It starts, says so,
    lists the store's runs, and a run started from it says what is missing (400)."""
    store = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    wire.rule = script
    done = tether("run", "an unknown errand", "--store", store, "--base-url", wire.url,
                  env=cli_env(OPENAI_API_KEY="sk-x"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = {k: v for k, v in cli_env().items() if k != "OPENAI_API_KEY"}
    proc = warm.Popen(
        [*TETHER, "serve", "--port", "0", "--token", TOKEN, "--store", store,
         "--model", "gpt-4.1-mini", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        said = Output(proc.stderr)
        assert "OPENAI_API_KEY is not set" in said.wait_for("the page lists, approves")
        url = said.wait_for("tether serve: open http://").split("open ", 1)[1].split("/?", 1)[0]

        def api(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
            request = urllib.request.Request(
                url + path, method=method, data=json.dumps(body).encode() if body else None,
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=30) as r:
                return json.loads(r.read())

        assert [r["status"] for r in api("GET", "/api/list")["runs"]] == ["done"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            api("POST", "/api/runs", {"task": "say hi"})
        assert refused.value.code == 400
        assert "OPENAI_API_KEY is not set" in refused.value.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)
