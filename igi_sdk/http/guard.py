"""Only the player's own programs reach the HTTP face, never a web page the player has open.

A page can send a request to a loopback port without any CORS preflight when it is a "simple"
one (a POST of ``text/plain``, say): the browser hides the answer from the page, but the
request still runs. And a page on a name the attacker's DNS points at 127.0.0.1 (DNS rebinding)
reaches the face as its own origin. So, before anything else reads a request:

* ``Host`` must name the address the face is bound to (a rebinding page's request carries its
  own name); checked on loopback binds, where no key guards the face;
* a request with an ``Origin`` (what browsers add to every cross-origin request, and to every
  POST) must come from the face's own origin; the face serves no page, so in practice no
  browser request passes; ``Sec-Fetch-Site`` (sent by current browsers even where ``Origin``
  is not) must say ``same-origin`` or ``none`` when present;
* a body is ``application/json``: no form or ``text/plain`` request, the kinds a page can send
  without a preflight, is read.

No CORS header is ever sent, so a preflighted request from a page fails in the browser. The
rules are a pure function (:func:`refusal`), wrapped as ASGI middleware (:class:`ForeignGuard`)
rather than Starlette's ``BaseHTTPMiddleware``, which would buffer streamed replies.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from igi_sdk.http.errors import HttpError

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_BROWSER_SITES_OK = frozenset({"same-origin", "none"})  # "none": typed by the user


@dataclass(frozen=True)
class Gate:
    """What a request must carry. ``hosts``: accepted ``Host`` values (lower case), None to
    accept any (a face bound beyond loopback, which an API key guards)."""

    hosts: frozenset[str] | None
    origins: frozenset[str]

    @classmethod
    def for_bind(cls, host: str, port: int, *, loopback: bool) -> Gate:
        """The gate of a face bound to ``host:port``: on loopback, any loopback name of that
        port (``127.0.0.1``, ``localhost``, ``[::1]`` and the bound address itself)."""
        bound = f"[{host}]" if ":" in host else host
        names = {bound.lower()}
        if loopback:
            names |= {"127.0.0.1", "localhost", "[::1]"}
        with_port = {f"{n}:{port}" for n in names} | (names if port == 80 else set())
        origins = frozenset(f"http://{h}" for h in with_port)
        return cls(frozenset(with_port) if loopback else None, origins)


def refusal(method: str, headers: Mapping[str, list[str]], gate: Gate) -> HttpError | None:
    """Why a request must not be read (None: it may). ``headers``: lower-case names, every
    value given under each."""
    hosts = headers.get("host", [])
    if len(hosts) > 1 or any(len(headers.get(h, [])) > 1
                             for h in ("origin", "content-type", "sec-fetch-site")):
        return HttpError(400, "invalid_request", "a request header is given twice")
    if gate.hosts is not None and (not hosts or hosts[0].strip().lower() not in gate.hosts):
        return HttpError(403, "forbidden_host",
                         "this face answers only requests addressed to its own loopback "
                         f"address and port (Host {hosts[0][:64] if hosts else 'missing'!r})")
    origin = headers.get("origin", [])
    if origin and origin[0].strip().lower() not in gate.origins:
        return HttpError(403, "forbidden_origin",
                         "requests from web pages are refused: only programs on this machine "
                         "may use the face")
    site = headers.get("sec-fetch-site", [])
    if site and site[0].strip().lower() not in _BROWSER_SITES_OK:
        return HttpError(403, "forbidden_origin",
                         "requests from web pages are refused: only programs on this machine "
                         "may use the face")
    if method.upper() in _BODY_METHODS:
        ctype = headers.get("content-type", [""])[0].split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return HttpError(415, "unsupported_media_type",
                             "the body must be JSON sent as Content-Type: application/json")
    return None


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class ForeignGuard:
    """ASGI middleware applying :func:`refusal` before the app sees a request."""

    def __init__(self, app: Asgi, gate: Gate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers: dict[str, list[str]] = {}
            for name, value in scope["headers"]:
                headers.setdefault(name.decode("latin-1").lower(), []).append(
                    value.decode("latin-1"))
            err = refusal(scope["method"], headers, self.gate)
            if err is not None:
                await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# what answers without the API key: a load balancer's probe (its body says whether the model
# is ready, nothing else: see app.health)
PUBLIC_PATHS = frozenset({"/health"})


def key_refusal(method: str, path: str, authorization: str | None,
                api_key: str | None) -> HttpError | None:
    """Why a request must not be answered for want of the key (None: it may). Checked before
    routing, as llama-server does: an unknown route without the key is 401, not 404, so a
    caller without the key learns nothing of which routes exist."""
    if api_key is None or (path in PUBLIC_PATHS and method.upper() in ("GET", "HEAD")):
        return None
    given = (authorization or "").encode("latin-1", "replace")
    if hmac.compare_digest(given, f"Bearer {api_key}".encode()):
        return None
    return HttpError(401, "invalid_api_key", "a valid API key is required (Bearer)")


def authorised(authorization: str | None, api_key: str | None) -> bool:
    """Whether a request carries the key (always, when none is set)."""
    return key_refusal("POST", "", authorization, api_key) is None


class KeyGuard:
    """ASGI middleware applying :func:`key_refusal` before the app routes a request."""

    def __init__(self, app: Asgi, api_key: str) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            auth = [v.decode("latin-1") for n, v in scope["headers"]
                    if n.lower() == b"authorization"]
            err = key_refusal(scope["method"], scope["path"], auth[0] if len(auth) == 1 else None,
                              self.api_key)
            if err is not None:
                await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)
