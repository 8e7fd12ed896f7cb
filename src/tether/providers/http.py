"""HTTP for model clients: one aiohttp session, timeouts, retries, provider error mapping.

A request is retried only while it is safe: the failure is retryable (429, 5xx, a dropped or
refused connection, a timeout) and nothing of the reply has yet been handed to the caller.
Secrets live in the session's headers and never enter an error message.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ..errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderTimeout,
    status_error,
)
from ..redact import scrub

RetryHook = Callable[[int, float, ProviderError], None]


@dataclass(frozen=True, slots=True)
class HTTPSettings:
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    """Longest silence allowed between two reads of a reply (a stalled stream fails after it)."""
    max_retries: int = 2
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_connections: int = 0
    """0 means no limit; admission control bounds concurrent calls above this layer."""


class Progress:
    """Set by a reply parser once it has handed anything to the caller; retries stop there."""

    __slots__ = ("emitted",)

    def __init__(self) -> None:
        self.emitted = False


Parser = Callable[[aiohttp.ClientResponse, Progress], Awaitable[Any]]


class HTTPClient:
    def __init__(self, base_url: str, headers: dict[str, str], settings: HTTPSettings) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = headers
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            s = self.settings
            self._session = aiohttp.ClientSession(
                headers=self.headers,
                connector=aiohttp.TCPConnector(limit=s.max_connections),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=s.connect_timeout, sock_read=s.read_timeout
                ),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self, path: str, body: dict[str, Any], parse: Parser, on_retry: RetryHook | None = None
    ) -> Any:
        """POST `body` as JSON and return `parse(response)`, retrying while that is safe."""
        url = self.base_url + path
        data = orjson.dumps(body)
        attempt = 0
        while True:
            progress = Progress()
            try:
                return await self._once(url, data, parse, progress)
            except ProviderError as e:
                if not e.retryable or progress.emitted or attempt >= self.settings.max_retries:
                    raise
                if e.retry_after is not None and e.retry_after > self.longest_wait():
                    raise self.not_before(e) from e
                delay = self.backoff(attempt, e.retry_after)
                attempt += 1
                if on_retry is not None:
                    on_retry(attempt, delay, e)
                await asyncio.sleep(delay)

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

    async def _once(self, url: str, data: bytes, parse: Parser, progress: Progress) -> Any:
        try:
            async with self.session().post(
                url, data=data, headers={"Content-Type": "application/json"}
            ) as resp:
                if resp.status >= 400:
                    raise await error_from_response(resp)
                return await parse(resp, progress)
        except ProviderError:
            raise
        except aiohttp.ClientConnectorError as e:
            raise ProviderConnectionError(
                f"cannot connect to {self.base_url}: {e.os_error}", retryable=True
            ) from None
        except TimeoutError:
            raise ProviderTimeout(
                f"no reply from {self.base_url} within the timeout", retryable=True
            ) from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError) as e:
            raise ProviderConnectionError(
                f"connection to {self.base_url} lost: {type(e).__name__}", retryable=True
            ) from None
        except aiohttp.ClientError as e:
            raise ProviderConnectionError(
                f"HTTP error talking to {self.base_url}: {type(e).__name__}", retryable=True
            ) from None


async def error_from_response(resp: aiohttp.ClientResponse) -> ProviderError:
    """Map an HTTP error reply (OpenAI or Anthropic error body, or anything else) to our tree."""
    raw = await resp.read()
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


SSEEvent = tuple[str | None, bytes]


class SSEParser:
    """Server-Sent Events from bytes as they arrive: (event name, data) pairs. Comments and
    unknown fields are skipped; lines may end in LF or CRLF and may be split across reads."""

    __slots__ = ("data", "event", "rest")

    def __init__(self) -> None:
        self.rest = b""
        self.event: str | None = None
        self.data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        lines = (self.rest + chunk if self.rest else chunk).split(b"\n")
        self.rest = lines.pop()
        out: list[SSEEvent] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self.data:
                    out.append((self.event, b"\n".join(self.data)))
                self.event, self.data = None, []
            elif line.startswith(b"data:"):
                value = line[5:]
                self.data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"event:"):
                self.event = line[6:].strip().decode()
        return out

    def close(self) -> list[SSEEvent]:
        """What is left when the stream ends (an event without its closing blank line)."""
        out = self.feed(b"\n\n") if self.rest or self.data else []
        return out


async def sse_batches(resp: aiohttp.ClientResponse) -> AsyncIterator[list[SSEEvent]]:
    """The events of a reply stream, a batch per network read: one await per read, not per line,
    which is most of the cost of reading a stream."""
    parser = SSEParser()
    async for chunk in resp.content.iter_any():
        batch = parser.feed(chunk)
        if batch:
            yield batch
    last = parser.close()
    if last:
        yield last


def loads_event(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        snippet = data[:80].decode("utf-8", "replace")
        raise ProviderProtocolError(
            f"unreadable event in the reply stream: {snippet!r}", retryable=True
        ) from None


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
        self.http = HTTPClient(base_url, headers, settings or HTTPSettings())

    async def aclose(self) -> None:
        await self.http.aclose()


class OpenAIModel(HTTPModel):
    """An OpenAI-style endpoint: bearer-token auth, https://api.openai.com/v1 by default."""

    def __init__(
        self,
        name: str,
        *,
        api_key: str,
        base_url: str = "https://api.openai.com/v1",
        stream: bool = True,
        settings: HTTPSettings | None = None,
    ) -> None:
        super().__init__(
            name,
            base_url=base_url,
            api_key=api_key,
            headers={"Authorization": f"Bearer {api_key}"},
            stream=stream,
            settings=settings,
        )
