"""The page's HTTP pieces that hold no state: JSON answers and errors, a request's paging,
the security headers every response carries (a content policy that lets a page run only the
scripts it names by nonce), and the escapes that keep what a model wrote text.
"""

from __future__ import annotations

import hmac
import html
from typing import Any

import orjson
from aiohttp import web

from ..errors import ConfigError
from ..run_filter import Cursor, check_limit


def paging(request: web.Request) -> tuple[int, Cursor | None]:
    """A page's `limit` (50 by default) and `cursor` (the `next` of the page before), or a
    ConfigError that says what is wrong with them."""
    try:
        limit = int(request.query.get("limit", "50"))
    except ValueError:
        raise ConfigError("limit: a whole number is required") from None
    cursor = request.query.get("cursor")
    return check_limit(limit), Cursor.decode(cursor) if cursor else None


def same(given: str, expected: str) -> bool:
    """A constant-time comparison that takes any text (compare_digest refuses non-ASCII str)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


def host_name(host: str) -> str:
    """The name in a Host header, without its port: `[::1]:8000` is `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


NO_SCRIPTS = "default-src 'none'; frame-ancestors 'none'"
PAGE_POLICY = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
    "connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


def html_page(page: str, nonce: str) -> web.Response:
    response = web.Response(text=page, content_type="text/html")
    response.headers["Content-Security-Policy"] = PAGE_POLICY.format(nonce=nonce)
    return response


async def secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every response: no framing, no sniffing, no referrer; no scripts unless the page
    named its own by nonce."""
    response.headers.setdefault("Content-Security-Policy", NO_SCRIPTS)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"


async def json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        raise json_http_error(400, "the body must be JSON") from None
    if not isinstance(body, dict):
        raise json_http_error(400, "the body must be a JSON object")
    return body


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


REFUSED = (401, 403, 415, 421)
"""Answers to a client that is not let in: each closes its connection."""


HTTP_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    404: web.HTTPNotFound,
    409: web.HTTPConflict,
}


def json_http_error(status: int, message: str) -> web.HTTPException:
    return HTTP_ERRORS[status](
        text=orjson.dumps({"error": message}).decode(), content_type="application/json"
    )


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def esc(text: str) -> str:
    return html.escape(text, quote=True)


def js_string(text: str) -> str:
    """A JSON string literal that is safe inside an HTML <script> element."""
    return orjson.dumps(text).decode().replace("<", "\\u003c").replace(">", "\\u003e")
