"""HTTP for model clients: one aiohttp session, timeouts, retries, provider error mapping.

A request is retried only while it is safe: the failure is retryable (429, 5xx, a dropped or
refused connection, a timeout) and nothing of the reply has yet been handed to the caller.
Secrets live in the session's headers and never enter an error message.

A reply is bounded in size and time, whatever the server does: a JSON reply is read up to
`MAX_REPLY` bytes, an error body up to `MAX_ERROR` bytes, a stream's line up to `MAX_LINE` and the
whole stream up to what the call's output budget allows (`stream_allowance`); a stream that sends
bytes but no event for the read timeout ends (dripping a byte a second would defeat a socket
timeout), and an attempt that hears nothing for the read timeout ends (its read limit, one of
`deadlines.py`'s, moved later by each read, not aiohttp's timer made again at every read). An
answer that is not what was asked for (an HTML page with status 200) is an error that says what
came: its content type and how it begins.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import os
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import orjson

from ..deadlines import Deadlines, Limit, on_loop
from ..errors import (
    ClientRequestError,
    MissingAPIKey,
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderTimeout,
    error_kind,
    error_status,
    status_error,
    stream_error,
)
from ..rates import GATE, attempt_tokens
from ..redact import scrub

RetryHook = Callable[[int, float, ProviderError], None]


@dataclass(frozen=True, slots=True)
class HTTPSettings:
    """How a model client talks HTTP: time-outs (connect, and the longest silence in a reply),
    retries of what may succeed later (429, 5xx, dropped connections) and connection pooling."""

    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    """Longest silence allowed between two reads of a reply (a stalled stream fails after it)."""
    max_retries: int = 2
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_connections: int = 0
    """0 means no limit; admission control bounds concurrent calls above this layer."""


MAX_REPLY = 64 << 20
MAX_ERROR = 64 << 10
MAX_LINE = 16 << 20
BYTES_PER_TOKEN = 400
"""Stream bytes a token may take: a token's text, JSON-escaped, inside a chunk's envelope (a
Chat Completions chunk is about 200 bytes around its delta)."""


class Progress:
    """What a reply parser is told and tells: `emitted` is set once anything was handed to the
    caller (retries stop there); `quiet` is the longest a stream may go without an event,
    `allowance` the most bytes it may bring, and `on_text` is told the text as it streams (so
    a provider's parser is a plain function, not a closure made per call). Text is handed
    over a network read at a time (`said` keeps it; `flush`, as `SSEBatches` asks for the next
    read and once the reply is parsed, hands it over): many small deltas in one read make one
    `text_delta` event, not one each (the rig's final answer: one event a run, not eight).
    Text kept when the read turns out to hold an error is never shown: the reply may be retried."""

    __slots__ = ("allowance", "emitted", "limit", "on_text", "pending", "quiet")

    def __init__(
        self,
        quiet: float = 120.0,
        allowance: int = MAX_REPLY,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        self.emitted = False
        self.quiet = quiet
        self.allowance = allowance
        self.on_text = on_text
        self.pending: list[str] | None = None  # text said since the last flush
        self.limit: Limit | None = None
        """The attempt's read limit: its task is cancelled when nothing came for `quiet` s."""

    def heard(self) -> None:
        """Bytes came: nothing need come for `quiet` s from now."""
        if self.limit is not None:
            self.limit.extend(self.quiet)

    def said(self, text: str) -> None:
        """Streamed text for the caller, handed over at the next `flush`."""
        if self.on_text is not None and text:
            if self.pending is None:
                self.pending = [text]
            else:
                self.pending.append(text)

    def flush(self) -> None:
        """Hand the text said since the last flush to the caller, as one piece (after which
        the call is not retried)."""
        pending = self.pending
        if pending is not None and self.on_text is not None:
            self.pending = None
            self.emitted = True
            self.on_text(pending[0] if len(pending) == 1 else "".join(pending))


def stream_allowance(max_output_tokens: int | None) -> int:
    """The most a stream may bring for a call with this output limit."""
    if max_output_tokens is None:
        return MAX_REPLY
    return min(MAX_REPLY, (1 << 20) + max_output_tokens * BYTES_PER_TOKEN)


if TYPE_CHECKING:  # imported when the first request is made: `tether --help` needs none (0.2 s)
    import aiohttp

Parser = Callable[["aiohttp.ClientResponse", Progress], Awaitable[Any]]


def closes_with_its_loop(session: aiohttp.ClientSession) -> AsyncGenerator[None]:
    """Close `session` when its event loop is shut down (`asyncio.run`, a `Runner`), if no one
    closed it before: a program that ran an agent and exited without `await model.aclose()`
    printed aiohttp's "Unclosed client session" (users of the OpenAI SDK never see that). A
    loop closes the async generators still open as it shuts down (`shutdown_asyncgens`), so
    a generator that holds the session, started and left at its `yield`, closes it then. The
    caller keeps the generator (the loop holds it weakly)."""

    async def holder() -> AsyncGenerator[None]:
        try:
            yield
        finally:
            if not session.closed:
                await session.close()

    started = holder()
    with contextlib.suppress(StopIteration):  # run to its `yield` now, known to the loop
        started.__anext__().send(None)
    return started


class HTTPClient:
    def __init__(
        self, base_url: str, headers: dict[str, str], settings: HTTPSettings, endpoint: str = ""
    ) -> None:
        """`endpoint` names the URL and key for rate limits (`rates.py`; empty: not gated)."""
        self.base_url = base_url.rstrip("/")
        self.endpoint = endpoint
        self.headers = headers
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._closer: AsyncGenerator[None] | None = None
        self.limits: Deadlines | None = None
        """The read limits of its attempts in flight, on the loop they run on."""

    def session(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            s = self.settings
            self._session = aiohttp.ClientSession(  # every request a JSON POST: said once
                headers={**self.headers, "Content-Type": "application/json"},
                connector=aiohttp.TCPConnector(limit=s.max_connections),
                timeout=aiohttp.ClientTimeout(  # the read timeout is each attempt's `Limit`
                    total=None, sock_connect=s.connect_timeout, sock_read=None
                ),
            )
            self._closer = closes_with_its_loop(self._session)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self,
        path: str,
        data: bytes,
        parse: Parser,
        on_retry: RetryHook | None = None,
        max_output_tokens: int | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Any:
        """POST `data` (a JSON body) and return `parse(response)`, retrying while that is safe
        (the body comes serialized: its dicts are not held while the reply is awaited); a
        streamed reply may bring what `max_output_tokens` allows (see `stream_allowance`), its
        text told to `on_text` as it comes.
        Each attempt passes the run's rate gate first, if it has one (`rates.GATE`), and a
        server's `Retry-After` pauses the endpoint for every process that shares the gate.
        (An attempt is not a coroutine of its own: a run holds this one for its whole reply,
        and a layer more was an object more a call for the garbage collector and a frame more
        that each network read passed through.)"""
        url = self.base_url + path
        gate = GATE.get() if self.endpoint else None
        tokens = attempt_tokens(data, max_output_tokens)
        allowance = stream_allowance(max_output_tokens)
        attempt = 0
        wait = self.settings.read_timeout
        while True:
            progress = Progress(wait, allowance, on_text)
            limit = None
            try:
                if gate is not None and not gate.rates.free(self.endpoint):
                    await gate.through(self.endpoint, tokens)
                if wait:
                    self.limits = on_loop(self.limits)
                    limit = progress.limit = self.limits.start(wait)
                async with self.session().post(
                    url, data=data, allow_redirects=False,  # a call and its key go where sent
                ) as resp:  # fmt: skip
                    if 300 <= resp.status < 400:
                        raise self.redirected(resp)
                    if resp.status >= 400:
                        raise await error_from_response(resp, progress)
                    reply = await parse(resp, progress)
                    progress.flush()  # what the last read said (a parser may end mid-batch)
                    return reply
            except asyncio.CancelledError:
                if limit is None or not limit.timed_out():
                    raise
                failed: Exception = TimeoutError()  # the read limit's: nothing came
            except Exception as error:
                failed = error
            finally:
                if limit is not None:
                    limit.close()
            e = self.failure(failed, progress)
            if e is None:  # not the provider's failure nor the connection's: a bug
                raise failed
            if gate is not None and e.retry_after is not None and e.retry_after > 0:
                await gate.paused(self.endpoint, e.retry_after)
            if not e.retryable or progress.emitted or attempt >= self.settings.max_retries:
                if e is failed:
                    raise failed
                raise e from None
            if e.retry_after is not None and e.retry_after > self.longest_wait():
                raise self.not_before(e) from e
            delay = self.backoff(attempt, e.retry_after)
            attempt += 1
            if on_retry is not None:
                on_retry(attempt, delay, e)
            await asyncio.sleep(delay)

    def redirected(self, resp: aiohttp.ClientResponse) -> ProviderError:
        """A redirect, not followed: followed, it carried the call's key (Anthropic's
        `x-api-key` too) to whatever address the server named."""
        where = scrub(str(resp.headers.get("Location", "")))[:300] or "another address"
        return ClientRequestError(
            f"HTTP {resp.status}: {self.base_url} redirected the call to {where}; not followed "
            "(a model call and its key go only where --base-url says: set it to the new "
            "address if that is where the API is now)",
            status=resp.status,
            retryable=False,
        )

    def longest_wait(self) -> float:
        """The longest `Retry-After` worth waiting for: beyond it the call fails at once
        (sleeping a capped time and asking again would only be refused again)."""
        return max(self.settings.backoff_max, 60.0)

    def not_before(self, e: ProviderError) -> ProviderError:
        wait = e.retry_after or 0.0
        when = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + wait))
        message = (
            f"{e.message} (the server takes requests again in {wait:.0f} s, at {when}; "
            f"not retried, as that is over {self.longest_wait():.0f} s)"
        )
        return type(e)(
            message,
            status=e.status,
            error_type=e.error_type,
            retryable=False,
            retry_after=e.retry_after,
        )

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        s = self.settings
        if retry_after is not None:
            return float(min(max(retry_after, 0.0), self.longest_wait()))
        delay: float = min(s.backoff_max, s.backoff_base * 2.0**attempt)
        return delay * random.uniform(0.5, 1.0)

    def failure(self, e: Exception, progress: Progress) -> ProviderError | None:
        """An attempt's exception as a provider error (itself, if it is one): a connection
        refused or lost, a timeout, any other HTTP failure. None for anything else (a bug,
        raised as it is)."""
        import aiohttp

        if isinstance(e, ProviderError):
            return e
        if isinstance(e, aiohttp.ClientConnectorError):
            return ProviderConnectionError(
                f"cannot connect to {self.base_url}: {e.os_error}", retryable=True
            )
        if isinstance(e, TimeoutError):
            if progress.emitted:
                return ProviderTimeout(
                    f"the reply from {self.base_url} stalled after part of it was shown: "
                    f"nothing came for {self.settings.read_timeout:g} s",
                    retryable=False,
                )
            return ProviderTimeout(
                f"no reply from {self.base_url} within the timeout", retryable=True
            )
        if isinstance(
            e, (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError)
        ):
            return ProviderConnectionError(
                f"connection to {self.base_url} lost: {type(e).__name__}", retryable=True
            )
        if isinstance(e, aiohttp.ClientError):
            return ProviderConnectionError(
                f"HTTP error talking to {self.base_url}: {type(e).__name__}", retryable=True
            )
        return None


async def error_from_response(
    resp: aiohttp.ClientResponse, progress: Progress | None = None
) -> ProviderError:
    """Map an HTTP error reply (OpenAI or Anthropic error body, or anything else) to our tree;
    only its first `MAX_ERROR` bytes are read."""
    raw = await read_up_to(resp, MAX_ERROR, progress)
    message, error_type = "", None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or "")
            error_type = err.get("code") or err.get("type")
        elif isinstance(err, str):
            message = err
        elif isinstance(body.get("message"), str):
            message = body["message"]
    if not message:
        message = raw[:300].decode("utf-8", "replace").strip() or (resp.reason or "")
    return status_error(
        resp.status,
        scrub(f"HTTP {resp.status}: {message}"),
        str(error_type) if error_type is not None else None,
        retry_after_seconds(resp.headers),
    )


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def reply_error(body: Any) -> ProviderError | None:
    """The error a server sent in place of a reply at HTTP 200 (a gateway's `{"error": ...}`),
    classed by its kind and its own status, with what it said (secrets scrubbed)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or any(k in body for k in ("choices", "content", "output")):
        return None  # a reply that carries an error of its own (a failed response) is read as one
    said = scrub(str(err.get("message") or "no message"))
    return stream_error(error_kind(err), f"error in reply: {said}", False, error_status(err))


async def json_reply(resp: aiohttp.ClientResponse, progress: Progress | None = None) -> Any:
    """A non-streamed reply's JSON, read up to `MAX_REPLY` bytes (each read told to
    `progress`); an error object sent in its place at HTTP 200 is raised as that error
    (`reply_error`)."""
    raw = await read_up_to(resp, MAX_REPLY + 1, progress)
    if len(raw) > MAX_REPLY:
        raise ProviderProtocolError(
            f"the reply is over {MAX_REPLY >> 20} MB; it was not read further", retryable=False
        )
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise unexpected(resp, raw, "a JSON reply") from None
    if (refused := reply_error(body)) is not None:
        raise refused
    return body


async def read_up_to(
    resp: aiohttp.ClientResponse, limit: int, progress: Progress | None = None
) -> bytes:
    """The body's first `limit` bytes (all of it when shorter); the rest is never read. Each
    read is told to `progress` (the attempt's read limit starts again)."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        part = await resp.content.read(limit - size)
        if not part:
            break
        if progress is not None:
            progress.heard()
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def unexpected(resp: aiohttp.ClientResponse, raw: bytes, wanted: str) -> ProviderProtocolError:
    """An error saying what came instead of what was asked for."""
    start = raw[:200].decode("utf-8", "replace").strip()
    return ProviderProtocolError(
        scrub(
            f"expected {wanted}, got HTTP {resp.status} {resp.content_type or 'without a type'}"
            f" beginning {start!r}"
        ),
        retryable=True,
    )


class HTTPModel:
    """What every HTTP model client shares: its name, one HTTP client, streaming or not, and
    the endpoint key that admission control counts calls by (a hash, never the key)."""

    provider = "http"

    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        api_key: str,
        headers: dict[str, str],
        stream: bool,
        settings: HTTPSettings | None,
    ) -> None:
        from ..admission import endpoint_key

        self.name = name
        self.stream = stream
        self.endpoint = endpoint_key(self.provider, base_url, api_key)
        self.http = HTTPClient(base_url, headers, settings or HTTPSettings(), self.endpoint)

    async def aclose(self) -> None:
        """Close its connections now (they close with their event loop anyway)."""
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def credentials(
    provider: str, api_key: str | None, base_url: str | None, vendor: str, default_url: str
) -> tuple[str, str]:
    """The key and base URL a model uses: those given, else the provider's usual environment
    variables (`{VENDOR}_API_KEY`, `{VENDOR}_BASE_URL`), as every peer reads them. The
    provider's own endpoint without a key is `MissingAPIKey`, raised when the model is built
    (not at its first call, minutes into a run); a server of one's own (Ollama, vLLM, a
    gateway at another URL) may need none."""
    variable = f"{vendor}_API_KEY"
    url = base_url or os.environ.get(f"{vendor}_BASE_URL") or default_url
    key = api_key or os.environ.get(variable)
    if key:
        return key, url
    if url.rstrip("/").removesuffix("/v1") == default_url.rstrip("/").removesuffix("/v1"):
        raise MissingAPIKey(variable, provider)
    return "none", url  # local compatible servers (Ollama, llama.cpp) take any key


class OpenAIModel(HTTPModel):
    """An OpenAI-style endpoint: bearer-token auth, https://api.openai.com/v1 by default.
    The key and URL default to `OPENAI_API_KEY` and `OPENAI_BASE_URL` (see `credentials`)."""

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        stream: bool = True,
        settings: HTTPSettings | None = None,
    ) -> None:
        api_key, base_url = credentials(
            self.provider, api_key, base_url, "OPENAI", "https://api.openai.com/v1"
        )
        super().__init__(
            name,
            base_url=base_url,
            api_key=api_key,
            headers={"Authorization": f"Bearer {api_key}"},
            stream=stream,
            settings=settings,
        )
