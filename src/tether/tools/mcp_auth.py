"""Signing in to remote MCP servers: OAuth 2.1 as the MCP authorization spec asks.

A remote MCP server that answers 401 names where its authorization server is; from there the
`mcp` SDK's OAuth client does the protocol (metadata discovery and its fallbacks, dynamic
registration or a client-id metadata document, PKCE, the `resource` parameter, scopes from the
challenge, step-up on `insufficient_scope`, token-endpoint authentication as the server offers,
refresh). This module owns what the SDK leaves to its caller, which is everything a user sees:

- **the settings**, from `--mcp-auth FILE` (`AuthSettings.load`): a pre-registered client
  (`client_id`, `client_secret`), the grant (`authorization_code` with a person at a browser,
  `client_credentials` for a worker with none), `scope`, and a `client_metadata_url`;
- **the sign-in** (`SignIn`): a listener on 127.0.0.1 takes the redirect, the user's browser is
  opened through `webbrowser` (so `$BROWSER` is honoured) and the URL is printed as well, for a
  machine with no browser; a sign-in not finished within `sign_in_timeout` is an error;
- **the tokens** (`TokenFile`): one file per server and account in the data directory, 0600, so a
  second run signs in silently; never in the store, events, logs or transcripts.

Nothing here runs for a server that never answers 401: a server with no sign-in costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import sys
import time
import warnings
import webbrowser
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, TextIO
from urllib.parse import parse_qs, urljoin, urlsplit

import orjson

from ..errors import ConfigError, known

Grant = Literal["authorization_code", "client_credentials"]
GRANTS = ("authorization_code", "client_credentials")
TOKEN_AUTH_METHODS = ("client_secret_basic", "client_secret_post", "none", "private_key_jwt")


@dataclass(frozen=True)
class AuthSettings:
    """How Tether signs in to the remote MCP servers of a run (`--mcp-auth FILE`, a JSON
    object of these fields; all are optional). With none, a server that asks for a sign-in
    gets a dynamically registered client and the user's browser."""

    client_id: str | None = None
    """A client registered with the authorization server beforehand (no registration then)."""
    client_secret: str | None = None
    token_endpoint_auth_method: str | None = None
    """How a pre-registered client authenticates at the token endpoint: `client_secret_basic`
    (the default with a secret), `client_secret_post`, or `none`."""
    grant: Grant = "authorization_code"
    """`client_credentials` for a process with no person to sign in (needs id and secret)."""
    scope: str | None = None
    """Scopes to ask for; by default those the server's challenge or metadata name."""
    client_metadata_url: str | None = None
    """An HTTPS URL of this client's metadata document, used as its id where the authorization
    server accepts one (instead of registering)."""
    private_key_file: str | None = None
    """A PEM file of the key that signs the client's assertions at the token endpoint
    (`private_key_jwt`, RFC 7523), for the client_credentials grant instead of a secret; a
    relative path is read from the settings file's folder."""
    signing_algorithm: str = "RS256"
    """The algorithm of those assertions: RS256, ES256, ..."""
    issuer: str | None = None
    """The issuer URL of the authorization server a client_credentials client is registered
    with: its credentials then go to that server only, whatever the MCP server names."""
    account: str = "default"
    """A name for the identity signed in as: tokens are kept per server and per account."""
    sign_in_timeout: float = 300.0
    """Seconds a person has to finish signing in at the browser."""

    @classmethod
    def load(cls, path: str | Path) -> AuthSettings:
        """The settings in a JSON file; anything wrong in it is one line naming the file."""
        where = f"--mcp-auth {str(path)!r}"
        try:
            data = orjson.loads(Path(path).read_bytes())
        except OSError as e:
            raise ConfigError(f"{where}: cannot read it: {e.strerror}") from None
        except orjson.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: must be a JSON object")
        key = data.get("private_key_file")
        if isinstance(key, str):  # beside the settings file, as a user writes it
            data["private_key_file"] = str(Path(path).parent / Path(key).expanduser())
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "mcp auth") -> AuthSettings:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(
                f"{where}: unknown field {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(known)})"
            )
        for name, value in data.items():
            want = float if name == "sign_in_timeout" else str
            if value is not None and not isinstance(value, (int, float) if want is float else str):
                raise ConfigError(f"{where}: {name!r} must be a {want.__name__}")
        settings = cls(**data)
        if settings.grant not in GRANTS:
            raise ConfigError(f"{where}: 'grant' must be one of {', '.join(GRANTS)}")
        if settings.grant == "client_credentials" and not (
            settings.client_id and (settings.client_secret or settings.private_key_file)
        ):
            raise ConfigError(f"{where}: the client_credentials grant needs client_id and "
                              "client_secret (or private_key_file)")  # fmt: skip
        method = settings.token_endpoint_auth_method
        if method is not None and method not in TOKEN_AUTH_METHODS:
            raise ConfigError(
                f"{where}: 'token_endpoint_auth_method' must be one of "
                f"{', '.join(TOKEN_AUTH_METHODS)}"
            )
        if settings.client_secret and not settings.client_id:
            raise ConfigError(f"{where}: a client_secret needs its client_id")
        return settings


def token_path(directory: Path, server: str, account: str) -> Path:
    """The file of one server's tokens for one account (named by a hash: a URL is no file
    name, and the folder's listing then says nothing about which servers are used)."""
    digest = hashlib.sha256(f"{server}\n{account}".encode()).hexdigest()[:24]
    return directory / f"{digest}.json"


class TokenFile:
    """The SDK's token storage, as a 0600 file (or in memory with no directory): the tokens
    and the registered client of one server and account, so the next run need not sign in."""

    def __init__(self, directory: Path | None, server: str, settings: AuthSettings) -> None:
        self.path = token_path(directory, server, settings.account) if directory else None
        self.server = server
        self.settings = settings
        self.held: dict[str, Any] = self.read()
        self.kept_client = "client" in self.held
        """Whether the client was registered by an earlier process (the server may have
        forgotten it since); not one registered now."""

    def read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}  # none yet, or unreadable: sign in again, and write it anew
        return data if isinstance(data, dict) and data.get("server") == self.server else {}

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temp = self.path.with_suffix(".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps({"server": self.server, **self.held}))
        os.replace(temp, self.path)

    async def get_tokens(self) -> Any:
        """The tokens kept, `expires_in` counted from when they were issued (see `expiring`)."""
        from mcp.shared.auth import OAuthToken

        found = dict(self.held.get("tokens") or {})
        if not found:
            return None
        expires_at = found.pop("expires_at", None)
        if isinstance(expires_at, (int, float)):
            found["expires_in"] = max(0, int(expires_at - time.time()))
        return OAuthToken.model_validate(found)

    async def set_tokens(self, tokens: Any) -> None:
        kept = tokens.model_dump(mode="json", exclude_none=True)
        if tokens.expires_in is not None:
            kept["expires_at"] = time.time() + tokens.expires_in
        self.held["tokens"] = kept
        self.write()

    async def get_client_info(self) -> Any:
        from mcp.shared.auth import OAuthClientInformationFull

        found = self.held.get("client")
        if found:
            return OAuthClientInformationFull.model_validate(found)
        s = self.settings
        if s.client_id and s.grant == "authorization_code":  # registered beforehand
            method = s.token_endpoint_auth_method or (
                "client_secret_basic" if s.client_secret else "none"
            )
            return OAuthClientInformationFull(
                client_id=s.client_id,
                client_secret=s.client_secret,
                token_endpoint_auth_method=method,
                redirect_uris=None,
            )
        return None

    async def set_client_info(self, client_info: Any) -> None:
        self.held["client"] = client_info.model_dump(mode="json", exclude_none=True)
        self.kept_client = False
        self.write()

    def registered_here(self) -> bool:
        """Whether the client kept is one Tether registered itself (not the settings')."""
        s = self.settings
        return "client" in self.held and not s.client_id and not s.client_metadata_url

    def forget_client(self) -> bool:
        """Forget a client Tether registered itself (never one the settings name), so that
        the next sign-in registers anew; whether there was one."""
        if not self.registered_here():
            return False
        del self.held["client"]
        self.write()
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SignIn:
    """The person's part of the authorization-code flow: open the authorization URL in their
    browser (and print it), then take the redirect back on 127.0.0.1:`port`."""

    def __init__(
        self, server: str, settings: AuthSettings, port: int = 0, out: TextIO | None = None
    ) -> None:
        self.server = server
        self.settings = settings
        self.out = out or sys.stderr
        self.port = port or free_port()
        self.redirect_uri = f"http://127.0.0.1:{self.port}/callback"
        self.listener: asyncio.Server | None = None
        self.answer: asyncio.Future[dict[str, str]] | None = None

    async def open_browser(self, url: str) -> None:
        """The SDK's redirect handler: listen for the redirect, then send the person to `url`."""
        if not url.startswith(("https://", "http://")):
            raise ConfigError(f"--mcp {self.server!r}: the sign-in URL is not a web address")
        self.answer = asyncio.get_running_loop().create_future()
        self.listener = await asyncio.start_server(self.take, "127.0.0.1", self.port)
        print(f"tether: sign in to {self.server} in your browser: {url}", file=self.out)
        # `webbrowser` waits for a $BROWSER command to exit, and such a command may fetch the
        # URL and follow it to our listener: in a thread, so the listener can answer it
        asyncio.get_running_loop().run_in_executor(None, webbrowser.open, url)

    async def take_code(self) -> Any:
        """The SDK's callback handler: the code and state the redirect carried."""
        from mcp.shared.auth import AuthorizationCodeResult

        answer = known(self.answer, "the sign-in's answer (the browser was opened)")
        try:
            async with asyncio.timeout(self.settings.sign_in_timeout):
                got = await answer
        except TimeoutError:
            raise ConfigError(
                f"--mcp {self.server!r}: the sign-in was not finished within "
                f"{self.settings.sign_in_timeout:g} s"
            ) from None
        finally:
            if self.listener is not None:
                self.listener.close()
        if "error" in got:
            said = got.get("error_description") or got["error"]
            said = "".join(c if c.isprintable() else "?" for c in said)[:300]  # the server's
            raise ConfigError(f"--mcp {self.server!r}: the sign-in was refused: {said}")
        if not got.get("code"):
            raise ConfigError(f"--mcp {self.server!r}: the sign-in returned no code")
        return AuthorizationCodeResult(code=got["code"], state=got.get("state"), iss=got.get("iss"))

    async def take(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request to the listener: the redirect to /callback settles the sign-in."""
        try:
            async with asyncio.timeout(10):
                line = (await reader.readline()).decode("latin-1").split()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
        except (TimeoutError, ConnectionError):
            writer.close()
            return
        target = urlsplit(line[1]) if len(line) >= 2 and line[0] == "GET" else None
        if target is None or target.path != "/callback":
            body, status = b"Not found.", "404 Not Found"
        else:
            query = {k: v[0] for k, v in parse_qs(target.query).items()}
            if self.answer is not None and not self.answer.done():
                self.answer.set_result(query)
            body, status = b"Signed in: you can close this page and go back to Tether.", "200 OK"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


def oauth(server: str, settings: AuthSettings, token_dir: Path | None) -> Any:
    """The `httpx2.Auth` that signs the requests to `server` in as `settings` say."""
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import OAuthClientMetadata

    storage = TokenFile(token_dir, server, settings)
    if settings.grant == "client_credentials":
        from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider

        if settings.private_key_file:
            return signed_assertions(server, settings, storage)
        method = settings.token_endpoint_auth_method or "client_secret_basic"
        if method not in ("client_secret_basic", "client_secret_post"):
            raise ConfigError("--mcp-auth: the client_credentials grant authenticates with "
                              "client_secret_basic, client_secret_post or private_key_jwt "
                              "(private_key_file)")  # fmt: skip
        if not (settings.client_id and settings.client_secret):
            raise ConfigError("--mcp-auth: the client_credentials grant needs client_id and "
                              "client_secret")  # fmt: skip
        with pinned_or_not(settings):
            return expiring(ClientCredentialsOAuthProvider)(
                server_url=server,
                storage=storage,
                client_id=settings.client_id,
                client_secret=settings.client_secret,
                token_endpoint_auth_method=method,
                scope=settings.scope,
                issuer=settings.issuer,
            )
    sign_in = SignIn(server, settings, registered_port(storage))
    metadata = OAuthClientMetadata(
        client_name="Tether",
        redirect_uris=[sign_in.redirect_uri],  # type: ignore[list-item]
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        scope=settings.scope,
        token_endpoint_auth_method=settings.token_endpoint_auth_method,  # type: ignore[arg-type]
    )
    return relearning(expiring(OAuthClientProvider), storage)(
        server_url=server,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=sign_in.open_browser,
        callback_handler=sign_in.take_code,
        client_metadata_url=settings.client_metadata_url,
    )


def signed_assertions(server: str, settings: AuthSettings, storage: TokenFile) -> Any:
    """A client_credentials client that authenticates with assertions it signs with its
    private key (`private_key_jwt`), for a worker whose identity is a key, not a secret."""
    from mcp.client.auth.extensions.client_credentials import (
        PrivateKeyJWTOAuthProvider,
        SignedJWTParameters,
    )

    if not (settings.private_key_file and settings.client_id):  # `from_dict` checks it first
        raise ConfigError("--mcp-auth: private_key_jwt needs private_key_file and client_id")
    try:
        key = Path(settings.private_key_file).read_text()
    except OSError as e:
        raise ConfigError(
            f"--mcp-auth: cannot read private_key_file {settings.private_key_file!r}: {e.strerror}"
        ) from None
    signing = SignedJWTParameters(
        issuer=settings.client_id,
        subject=settings.client_id,
        signing_key=key,
        signing_algorithm=settings.signing_algorithm,
    )
    with pinned_or_not(settings):
        return expiring(PrivateKeyJWTOAuthProvider)(
            server_url=server,
            storage=storage,
            client_id=settings.client_id,
            assertion_provider=signing.create_assertion_provider(),
            scope=settings.scope,
            issuer=settings.issuer,
        )


@contextlib.contextmanager
def pinned_or_not(settings: AuthSettings) -> Iterator[None]:
    """Without `issuer`, the SDK warns on stderr that the MCP server decides where the
    credentials go: the settings' `issuer` field (documented) is the user's choice to make,
    not a warning in every run's output."""
    with warnings.catch_warnings():
        if settings.issuer is None:
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message="Omitting `issuer` is deprecated")
        yield


def expiring(provider: type[Any]) -> type[Any]:
    """The SDK's provider, knowing when the tokens it loads expire. It sets their expiry only
    as it receives them, so tokens read from the file passed for fresh however old they were:
    a stale one met a 401, and a 401 means a whole new sign-in at the browser where a refresh
    would have done."""

    class Expiring(provider):  # type: ignore[misc]
        async def _initialize(self) -> None:
            await super()._initialize()
            tokens = self.context.current_tokens
            if tokens is not None:
                self.context.update_token_expiry(tokens)

    return Expiring


def relearning(provider: type[Any], storage: TokenFile) -> type[Any]:
    """The SDK's provider, registering anew when the authorization server has forgotten the
    client Tether registered (it restarted, and kept its clients in memory). The SDK sent the
    person to the browser with the forgotten client id, where the server shows an error and
    never redirects back, so the run waited out the whole sign-in time (300 s). Before the
    browser, the authorization address is asked once without the person: a refusal of the
    client (400 or 401 naming it) has Tether register again first. A failed refresh does the
    same: it means a sign-in at the browser anyway, and a client costs one request."""

    class Relearning(provider):  # type: ignore[misc]
        async def _handle_refresh_response(self, response: Any) -> bool:
            if await super()._handle_refresh_response(response):
                return True
            if storage.forget_client():
                self.context.client_info = None
            return False

        async def _perform_authorization(self) -> Any:
            if storage.kept_client and storage.registered_here() and await self.client_refused():
                storage.forget_client()
                self.context.client_info = await self.register_anew()
            return await super()._perform_authorization()

        async def client_refused(self) -> bool:
            """Whether the authorization endpoint refuses our client id (asked without
            following any redirect, and without a person)."""
            import httpx2

            meta = self.context.oauth_metadata
            endpoint = str(meta.authorization_endpoint) if meta else None
            endpoint = endpoint or urljoin(
                self.context.get_authorization_base_url(self.context.server_url), "/authorize"
            )
            query = {
                "response_type": "code",
                "client_id": self.context.client_info.client_id,
                "redirect_uri": str(self.context.client_metadata.redirect_uris[0]),
                "state": "probe",
                "code_challenge": "A" * 43,
                "code_challenge_method": "S256",
            }
            try:
                async with httpx2.AsyncClient(timeout=10) as http:
                    answer = await http.get(endpoint, params=query)
            except httpx2.HTTPError:
                return False  # the browser will say what is wrong
            return answer.status_code in (400, 401) and "client" in answer.text.lower()

        async def register_anew(self) -> Any:
            import httpx2
            from mcp.client.auth.utils import (
                create_client_registration_request,
                handle_registration_response,
            )

            base = self.context.get_authorization_base_url(self.context.server_url)
            request = create_client_registration_request(
                self.context.oauth_metadata, self.context.client_metadata, base
            )
            async with httpx2.AsyncClient(timeout=30) as http:
                found = await handle_registration_response(await http.send(request))
            if self.context.oauth_metadata is not None:
                found.issuer = self._expected_issuer()
            await self.context.storage.set_client_info(found)
            return found

    return Relearning


def registered_port(storage: TokenFile) -> int:
    """The port of the redirect a client was registered with, so a later sign-in sends the
    same redirect (not every authorization server accepts any port on 127.0.0.1); 0: any."""
    uris = (storage.held.get("client") or {}).get("redirect_uris") or [""]
    found = urlsplit(str(uris[0]))
    if found.hostname != "127.0.0.1" or not found.port:
        return 0
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", found.port))
        except OSError:
            return 0  # taken now: sign in on another (the server may still accept it)
    return found.port
