"""`tether serve`: the live web page and the JSON API behind it.

The runs live in the server's Runtime (in memory, or recorded in a store, the same surface
either way); the browser is only a viewer. Closing a tab never stops
a run, and reopening it never starts another: the page replays the run's events from offset 0
over Server-Sent Events, then follows them live. On a store, the page also shows and controls
the store's runs that workers on other machines execute (followed in the store, step by step;
every request goes through the store: `store.RemoteRun`).

    GET  /                                   the list of runs and a form to start one
    GET  /runs/{id}                          a run, live
    GET  /inbox                              every call waiting for a person, across runs
    POST /api/runs                           {task, model?, tools?, max_steps?, max_cost?} -> {id}
                                             {tasks: [...] | task, queue: true, run_id?, ...}
                                               -> {ids}: queued in the store for its workers
    GET  /api/runs                           [{id, task, status, steps, usage, cost_usd, ...}]
    GET  /api/runs/{id}                      the same for one run, with its transcript
    GET  /api/runs/{id}/events?offset=N      Server-Sent Events from seq N (or Last-Event-ID)
    POST /api/runs/{id}/messages             {text}
    POST /api/runs/{id}/approve              {approval_id, args_hash?}
    POST /api/runs/{id}/deny                 {approval_id, reason?}
    POST /api/runs/{id}/answer               {question_id, action?, content?, reason?}
    POST /api/runs/{id}/cancel
    POST /api/runs/{id}/fork                 {at, message?} -> {id}: a new run from step `at`
    POST /api/runs/{id}/upgrade              {to?} -> {from, to}: a run waiting for its version
    GET  /api/approvals                      [{run_id, task, approval_id, name, arguments, ...}]

Security: every API request needs the access token, as `Authorization: Bearer TOKEN` (or, for a
GET, `?token=TOKEN`: the printed link, and the page's event stream). The pages are shells that
hold no data; their scripts keep the token in the page's own storage (per origin: an origin
includes the port) and send it as a header. There is no cookie: browsers send cookies for
127.0.0.1 to every port, so any local server would receive one. A request whose `Origin` is
another origin (another port) is refused. Everything a model or a tool
produced is inserted as text, never as HTML. A request whose `Host` is not a name this server is
served under is refused (a DNS-rebinding page sends its own name); a POST to the API must be
`application/json` (a form or a `text/plain` body from another origin can be sent without a
preflight; JSON cannot). Every response forbids framing and sniffing, sends no referrer, and a
page runs only its own scripts (a per-response nonce).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from ..accounts import check_account
from ..backends import RunHandle
from ..dashboard import figures, window_of
from ..errors import (
    AccountOverBudget,
    ApprovalError,
    ConfigError,
    NoSuchRun,
    QuestionError,
    RecordError,
    RunEnded,
    RunExists,
    StoreUnavailable,
)
from ..events import Event, Sink
from ..journal import Journal
from ..options import CLI_AGENT
from ..overview import Overview, act
from ..run_filter import RunFilter
from ..runtime import Runtime
from ..tools.tool import RunContext
from .dashboard_page import DASHBOARD_PAGE
from .http import (
    REFUSED,
    dumps,
    esc,
    host_name,
    html_page,
    js_string,
    json_body,
    json_error,
    json_http_error,
    paging,
    same,
    secure_headers,
)
from .inbox_page import INBOX_PAGE
from .pages import INDEX_PAGE, RUN_PAGE, fill


def shell(path: str) -> bool:
    """Whether `path` is a page served without the token (`/`, `/inbox`, `/dashboard` and
    `/runs/ID`): it
    holds no data, only the page's code, which loads the data through the API with the
    token."""
    return path in ("/", "/inbox", "/dashboard") or path.startswith("/runs/")


HEARTBEAT_S = 15.0
QUEUE_BOX = (
    '<label><input type="checkbox" name="queue"> for a worker (queued in the store)</label> '
)

OptionsFor = Callable[[dict[str, Any]], dict[str, Any]]
"""The run options (`options.RunOptions` as a dict) for a new run from the form's overrides
(model, tools, budgets); raises ConfigError or ValueError for a bad choice."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WebApp:
    def __init__(
        self,
        runtime: Runtime,
        token: str,
        *,
        agent: str = CLI_AGENT,
        options_for: OptionsFor | None = None,
        journal: Journal | None = None,
        defaults: dict[str, Any] | None = None,
        workspace: Path | None = None,
        hosts: set[str] | None = None,
    ) -> None:
        """Runs started from the page are runs of `agent` on `runtime`, built from
        `options_for(form)` when it is given (else the registered agent, as it is). `hosts`
        are the names a request's `Host` may give (without the port); None takes any."""
        self.runtime = runtime
        self.agent = agent
        self.options_for = options_for
        self.token = token
        self.journal = journal
        self.defaults = defaults or {}
        self.workspace = workspace or Path.cwd()
        self.archived: dict[str, list[Event]] = {}
        self.hosts = {h.lower() for h in hosts} if hosts is not None else None
        self.overview = Overview(runtime)

    def load_journal(self) -> None:
        """Runs journaled before this server started: their pages replay them."""
        if self.journal is None:
            return
        for run_id, events in self.journal.runs().items():
            if run_id in self.runtime.bus.logs:
                continue
            log = self.runtime.bus.log(run_id)
            log.extend(events)
            log.close()
            self.archived[run_id] = events

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard, self.auth])
        app.on_response_prepare.append(secure_headers)
        app.router.add_get("/", self.index)
        app.router.add_get("/runs/{id}", self.run_page)
        app.router.add_get("/inbox", self.inbox_page)
        app.router.add_get("/dashboard", self.dashboard_page)
        app.router.add_get("/api/dashboard", self.dashboard)
        app.router.add_get("/api/approvals", self.approvals)
        app.router.add_get("/api/accounts", self.accounts)
        app.router.add_get("/api/inbox", self.inbox)
        app.router.add_post("/api/runs", self.start_run)
        app.router.add_get("/api/runs", self.list_runs)
        app.router.add_get("/api/list", self.list_page)
        app.router.add_get("/api/runs/{id}", self.get_run)
        app.router.add_get("/api/runs/{id}/events", self.events)
        app.router.add_post("/api/runs/{id}/messages", self.send_message)
        app.router.add_post("/api/runs/{id}/approve", self.approve)
        app.router.add_post("/api/runs/{id}/deny", self.deny)
        app.router.add_post("/api/runs/{id}/answer", self.answer)
        app.router.add_post("/api/runs/{id}/cancel", self.cancel)
        app.router.add_post("/api/runs/{id}/fork", self.fork)
        app.router.add_post("/api/runs/{id}/upgrade", self.upgrade)
        app.on_startup.append(self.adopt)
        app.on_shutdown.append(self.shutdown)
        return app

    async def adopt(self, app: web.Application) -> None:
        """Open the runtime; with a store, finish the runs of this page that a server here was
        executing when it died, so that they end and their pages go on."""
        await self.runtime.open()
        self.load_journal()
        if self.runtime.store is not None and self.archived:
            sinks: list[Sink] = [self.journal.write] if self.journal else []
            taken = await self.runtime.take_over(list(self.archived), sinks, self.archived)
            for run_id in taken:
                self.archived.pop(run_id, None)

    async def shutdown(self, app: web.Application) -> None:
        await self.runtime.close(deadline=2.0)
        if self.journal is not None:
            self.journal.close()

    # -- security -------------------------------------------------------------------------------
    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """What a request must be before its token is even looked at (`refusal`). A client
        that is not let in, here or by `auth`, has its connection closed with the answer:
        only a client with the token keeps one open (see `connections`). A store's record
        that is not Tether's (a pickle, a row rewritten by hand) is refused in one line."""
        try:
            response = self.refusal(request) or await handler(request)
        except RecordError as e:
            response = json_error(422, str(e))
        if response.status in REFUSED:
            response.force_close()
        return response

    def refusal(self, request: web.Request) -> web.Response | None:
        """Why a request is refused before its token is looked at, if it is: not sent to a name
        this server is served under, from another origin, or a write to the API that is not
        JSON."""
        if self.hosts is not None and host_name(request.host) not in self.hosts:
            return web.Response(
                status=421,
                text=f"this server does not serve the host {request.host[:100]!r}",
                content_type="text/plain",
            )
        origin = request.headers.get("Origin")
        if origin is not None and origin not in (f"http://{request.host}", "null"):
            return json_error(403, "a request from another origin (another port) is refused")
        if (
            request.method == "POST"
            and request.path.startswith("/api/")
            and request.content_type != "application/json"
        ):
            return json_error(415, "the body must be sent as Content-Type: application/json")
        return None

    @web.middleware
    async def auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The token, as `Authorization: Bearer TOKEN` (the page's scripts send it from the
        page's own storage), or in the query of a GET (the link `tether serve` prints, and
        the page's event stream: an EventSource cannot send a header). No cookie: a browser
        sends cookies for 127.0.0.1 to every port, so any local server the user opened
        received it and could act with it. The pages themselves are shells that hold no data:
        they load it through the API with the token."""
        given = request.query.get("token")
        if given is not None and (request.method != "GET" or not same(given, self.token)):
            return self.denied(request)
        if given is not None or shell(request.path):
            return await handler(request)
        bearer = request.headers.get("Authorization", "")
        if bearer.startswith("Bearer ") and same(bearer[7:], self.token):
            return await handler(request)
        return self.denied(request)

    def denied(self, request: web.Request) -> web.Response:
        if request.path.startswith("/api/"):
            return json_error(401, "an access token is required")
        return web.Response(
            status=401,
            content_type="text/html",
            text="<!doctype html><title>Tether</title><p>Open the link that "
            "<code>tether serve</code> printed (it holds the access token).</p>",
        )

    # -- pages ----------------------------------------------------------------------------------
    async def index(self, request: web.Request) -> web.Response:
        """The list's shell: its rows come from the API, with the token."""
        nonce = secrets.token_urlsafe(16)
        page = fill(
            INDEX_PAGE,
            nonce=nonce,
            model=esc(str(self.defaults.get("model", ""))),
            tools="".join(
                f'<label><input type="checkbox" name="tools" value="{esc(t)}"'
                f"{' checked' if t in self.defaults.get('tools', []) else ''}> {esc(t)}</label> "
                for t in self.defaults.get("available_tools", [])
            ),
            max_steps=esc(str(self.defaults.get("max_steps", ""))),
            queue=QUEUE_BOX if self.runtime.store is not None else "",
        )
        return html_page(page, nonce)

    async def inbox_page(self, request: web.Request) -> web.Response:
        """The approvals inbox's shell: its calls come from the API, with the token."""
        nonce = secrets.token_urlsafe(16)
        return html_page(fill(INBOX_PAGE, nonce=nonce), nonce)

    async def dashboard_page(self, request: web.Request) -> web.Response:
        """The dashboard's shell: its figures come from the API, with the token."""
        nonce = secrets.token_urlsafe(16)
        return html_page(fill(DASHBOARD_PAGE, nonce=nonce), nonce)

    async def run_page(self, request: web.Request) -> web.Response:
        """A run's shell: what it shows comes from the API, with the token (an unknown run
        is said there, so a request without the token learns nothing of which runs exist)."""
        run_id = request.match_info["id"]
        nonce = secrets.token_urlsafe(16)
        page = fill(RUN_PAGE, nonce=nonce, run_id=esc(run_id), run_id_json=js_string(run_id))
        return html_page(page, nonce)

    # -- API ------------------------------------------------------------------------------------
    async def start_run(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if "tasks" in body or body.get("queue"):
            return await self.queue_runs(body)
        task = body.get("task")
        if not isinstance(task, str) or not task.strip():
            return json_error(400, "task: a non-empty string is required")
        run_id = body.get("run_id") or None
        if run_id is not None and not isinstance(run_id, str):
            return json_error(400, "run_id: a string is required")
        if run_id in self.archived:
            return json_error(400, f"run_id: {run_id!r} is taken")
        sinks: list[Sink] = [self.journal.write] if self.journal else []
        try:
            options = self.options_for(body) if self.options_for else None
            run = await self.runtime.start(
                self.agent,
                task.strip(),
                run_id=run_id,
                options=options,
                context=self.context_of(body),
                sinks=sinks,
            )
        except (RunExists, AccountOverBudget) as e:
            return json_error(409, str(e))
        except (ConfigError, ValueError, TypeError) as e:
            return json_error(400, str(e))
        return web.json_response({"id": run.id, "status": run.status}, status=201)

    def context_of(self, body: dict[str, Any]) -> RunContext:
        """A new run's context: this server's workspace, and the account the form names."""
        account = body.get("account") or None
        if account is not None:
            check_account(account)  # a ConfigError: 400
        return RunContext(workspace=self.workspace, account_id=account)

    async def queue_runs(self, body: dict[str, Any]) -> web.Response:
        """Runs for the store's workers, wherever they are: `tasks` (a list; `run_id`, if
        given, names them ID-1..N) or one `task` with `queue: true`. All are queued, or none."""
        tasks = body.get("tasks", [body.get("task")])
        if (
            not isinstance(tasks, list)
            or not tasks
            or not all(isinstance(x, str) and x.strip() for x in tasks)
        ):
            return json_error(400, "tasks: a non-empty list of non-empty strings is required")
        run_id = body.get("run_id") or None
        if run_id is not None and not isinstance(run_id, str):
            return json_error(400, "run_id: a string is required")
        ids = None
        if run_id is not None:
            ids = (
                [run_id] if len(tasks) == 1 else [f"{run_id}-{i}" for i in range(1, len(tasks) + 1)]
            )
        try:
            options = self.options_for(body) if self.options_for else None
            agent = await self.runtime.agent_for(self.agent, options)  # a bad option: refused
            queued = await asyncio.to_thread(
                self.runtime.enqueue_many,
                agent,
                [x.strip() for x in tasks],
                run_ids=ids,
                options=options,
                context=self.context_of(body),
            )
        except (ConfigError, ValueError, TypeError) as e:
            return json_error(400, str(e))
        return web.json_response({"ids": queued, "status": "queued"}, status=201)

    async def list_runs(self, request: web.Request) -> web.Response:
        return web.json_response(await self.overview.recent(), dumps=dumps)

    async def list_page(self, request: web.Request) -> web.Response:
        """A page of the runs, newest first, filtered (`state`, repeated or comma-separated;
        `agent`; `q`, text in the task, id or agent), `limit` at a time from `cursor` (the
        `next` of the page before), with the counts by state of every run."""
        q = request.query
        try:
            flt = RunFilter(
                states=frozenset(s for v in q.getall("state", []) for s in v.split(",") if s),
                agent=q.get("agent", ""),
                account=q.get("account", ""),
                text=q.get("q", ""),
            )
            limit, after = paging(request)
        except ConfigError as e:
            return json_error(400, str(e))
        page = await self.overview.page(flt, after, limit)
        body = {
            "runs": page.rows,
            "next": page.next.encode() if page.next is not None else None,
            "scanned": page.scanned,
            "counts": page.counts,
        }
        return web.json_response(body, dumps=dumps)

    async def dashboard(self, request: web.Request) -> web.Response:
        """The dashboard's figures over the last `window` (hour or day): of the store's runs,
        or in memory of this server's."""
        window = request.query.get("window", "hour")
        try:
            periods, length = window_of(window)
        except ConfigError as e:
            return json_error(400, str(e))
        now = time.time()
        started, ended, took = await self.overview.activity(now - periods * length)
        return web.json_response(figures(window, now, started, ended, took), dumps=dumps)

    async def accounts(self, request: web.Request) -> web.Response:
        """Every account with limits or spend: what it spent today, this month and in all,
        what its calls in flight hold, its limits, and why it has no room, if it has none;
        and every endpoint with a rate or a server's pause: its requests and tokens in its
        last window."""
        found, rated = await self.runtime.accounts(), await self.runtime.rates()
        return web.json_response(
            {"accounts": [a.to_dict() for a in found], "rates": [r.to_dict() for r in rated]},
            dumps=dumps,
        )

    async def approvals(self, request: web.Request) -> web.Response:
        """Every call waiting for a person across the runs of this server and its store,
        the oldest run's first: each with its run, task and full arguments."""
        return await self.waiting_for_people(request, questions=False)

    async def inbox(self, request: web.Request) -> web.Response:
        """The approvals inbox's items: each run's waiting calls (`kind` approval) and its
        tools' questions (`kind` question), the oldest run's first."""
        return await self.waiting_for_people(request, questions=True)

    async def waiting_for_people(self, request: web.Request, questions: bool) -> web.Response:
        """What waits for a person, the runs that wait a page at a time (`limit`, `cursor`),
        the next page named by a `Link` header."""
        try:
            limit, after = paging(request)
        except ConfigError as e:
            return json_error(400, str(e))
        found, page = await self.overview.waiting(after, limit, questions)
        response = web.json_response(found, dumps=dumps)
        if page.next is not None:
            more = f"{request.path}?limit={limit}&cursor={page.next.encode()}"
            response.headers["Link"] = f'<{more}>; rel="next"'
        return response

    async def get_run(self, request: web.Request) -> web.Response:
        run_id = request.match_info["id"]
        summary = await self.overview.describe(run_id)
        if summary is None:
            return json_error(404, f"no run {run_id!r}")
        return web.json_response(summary, dumps=dumps)

    async def events(self, request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["id"]
        if not await asyncio.to_thread(self.runtime.has, run_id):
            return json_error(404, f"no run {run_id!r}")
        try:
            offset = int(request.query.get("offset", "-1"))
            if offset < 0:
                offset = int(request.headers.get("Last-Event-ID", "-1")) + 1
        except ValueError:
            return json_error(400, "offset: a whole number is required")
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        position = max(0, offset)
        while True:
            subscription = self.runtime.events(run_id, position)
            try:
                while True:
                    async with asyncio.timeout(HEARTBEAT_S):
                        event = await anext(subscription)
                    if event.seq >= 0:
                        position = event.seq + 1
                        await response.write(b"id: %d\ndata: %s\n\n" % (event.seq, event.to_json()))
                    else:
                        await response.write(b"data: %s\n\n" % event.to_json())
            except StopAsyncIteration:
                await response.write(b'data: {"type":"end"}\n\n')
                return response
            except TimeoutError:
                await response.write(b": still here\n\n")  # keeps proxies from closing it
            except (ConnectionResetError, asyncio.CancelledError):
                return response
            finally:
                await subscription.aclose()  # type: ignore[attr-defined]

    async def send_message(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            return json_error(400, "text: a non-empty string is required")
        run = await self.live(request)
        try:
            await act(run, lambda: run.send(text.strip()))
        except RunEnded as e:
            return json_error(409, str(e))
        return web.json_response({"queued": True})

    async def approve(self, request: web.Request) -> web.Response:
        return await self.decide(request, approved=True)

    async def deny(self, request: web.Request) -> web.Response:
        return await self.decide(request, approved=False)

    async def decide(self, request: web.Request, approved: bool) -> web.Response:
        body = await json_body(request)
        approval_id = body.get("approval_id")
        if not isinstance(approval_id, str):
            return json_error(400, "approval_id: a string is required")
        run = await self.live(request)
        try:
            if approved:
                shown = body.get("args_hash")
                await act(run, lambda: run.approve(approval_id, shown, "approved in the web page"))
            else:
                reason = str(body.get("reason") or "denied in the web page")
                await act(run, lambda: run.deny(approval_id, reason))
        except ApprovalError as e:
            return json_error(409, str(e))
        except StoreUnavailable as e:  # not taken: the call still waits, the page says so
            return json_error(503, str(e))
        return web.json_response({"approval_id": approval_id, "approved": approved})

    async def answer(self, request: web.Request) -> web.Response:
        """A question the run's tool asked (`question_asked`): answered with the fields
        asked for (`content`), or declined."""
        body = await json_body(request)
        question_id, action = body.get("question_id"), body.get("action", "accept")
        content = body.get("content")
        if not isinstance(question_id, str):
            return json_error(400, "question_id: a string is required")
        if action not in ("accept", "decline", "cancel"):
            return json_error(400, "action: accept, decline or cancel")
        if content is not None and not isinstance(content, dict):
            return json_error(400, "content: an object of the fields asked for")
        run_id = request.match_info["id"]
        try:
            await self.runtime.answer(
                run_id, question_id, content, action=action, reason=str(body.get("reason") or "")
            )
        except QuestionError as e:
            return json_error(409, str(e))
        except StoreUnavailable as e:
            return json_error(503, str(e))
        return web.json_response({"question_id": question_id, "action": action})

    async def cancel(self, request: web.Request) -> web.Response:
        run = await self.live(request)
        cancelled = await act(run, run.cancel)
        if cancelled:
            await run.wait()
        status = await act(run, lambda: run.status)
        return web.json_response({"cancelled": cancelled, "status": status})

    async def fork(self, request: web.Request) -> web.Response:
        """A new run from this run's conversation after step `at` (`Runtime.fork`), with an
        optional `message`; a fork that cannot be made is 409 with the reason."""
        body = await json_body(request)
        at, message = body.get("at"), body.get("message") or None
        if not isinstance(at, int) or isinstance(at, bool):
            return json_error(400, "at: a step number is required")
        if message is not None and not isinstance(message, str):
            return json_error(400, "message: a string is required")
        sinks: list[Sink] = [self.journal.write] if self.journal else []
        source = request.match_info["id"]
        try:
            fork = await self.runtime.fork(source, at=at, message=message, sinks=sinks)
        except NoSuchRun as e:
            return json_error(404, str(e))
        except (ConfigError, RunExists) as e:
            return json_error(409, str(e))
        return web.json_response({"id": fork.id, "forked_from": source, "at": at}, status=201)

    async def upgrade(self, request: web.Request) -> web.Response:
        """Move a run that waits for its version to another (`Runtime.upgrade`; `to` None: the
        one other version live workers have); one that cannot be is 409 with the reason."""
        body = await json_body(request)
        to = body.get("to")
        if to is not None and not isinstance(to, str):
            return json_error(400, "to: a version (a string) is required")
        try:
            was, now = await self.runtime.upgrade(request.match_info["id"], to)
        except NoSuchRun as e:
            return json_error(404, str(e))
        except (ConfigError, RunEnded) as e:
            return json_error(409, str(e))
        return web.json_response({"from": was, "to": now})

    async def live(self, request: web.Request) -> RunHandle:
        """The run a request controls: executed here, or a run of the store executed
        elsewhere (its requests go through the store)."""
        run_id = request.match_info["id"]
        try:
            return await asyncio.to_thread(self.runtime.get, run_id)
        except NoSuchRun:
            status = 409 if run_id in self.archived else 404
            raise json_http_error(status, f"run {run_id!r} is not running here") from None
