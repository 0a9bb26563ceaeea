"""Run the HTTP face beside the protocol server, in the sidecar's process (uvicorn on its own
thread and event loop; the face reaches the sidecar through its ZeroMQ endpoint)."""

from __future__ import annotations

import secrets
import threading

import uvicorn

from igi_sdk.bridge.server import is_loopback_host
from igi_sdk.http.app import HttpConfig, build_app


def parse_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) into (host, port); ValueError when malformed."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"--http wants HOST:PORT (e.g. 127.0.0.1:8080), not {bind!r}")
    return host.strip("[]"), int(port)


def start(bind: str, endpoint: str, *, api_key: str | None, token: str | None) -> uvicorn.Server:
    """Serve the face on ``bind`` (loopback, or any address with an API key)."""
    host, port = parse_bind(bind)
    if not is_loopback_host(host) and not api_key:
        raise ValueError(f"refusing to serve HTTP on {host}: an address other than loopback "
                         "needs --api-key-file (clients send it as a Bearer token)")
    app = build_app(HttpConfig(endpoint=endpoint, owner=secrets.token_urlsafe(24),
                               token=token, api_key=api_key))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, name="igi-http", daemon=True)
    thread.start()
    return server
