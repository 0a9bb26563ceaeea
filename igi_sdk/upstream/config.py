"""What ``serve --upstream`` is told: the replicas, when to use them, how to reach them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

# local: the local model only (the upstream is unused); remote: every session is served by the
# upstream; overflow: the local model first, the upstream while it cannot serve (unavailable, no
# free session slot, or on its CPU placement below ``min_local_tps``)
Policy = Literal["local", "remote", "overflow"]
# how a json_schema constraint is sent: OpenAI's response_format json_schema (vLLM, SGLang,
# Dynamo, llama-server), or json_object with a "schema" (llama-cpp-python's own server)
SchemaFormat = Literal["json_schema", "json_object"]
POLICIES: tuple[Policy, ...] = ("local", "remote", "overflow")
# the session key is sent under each name a router pins a conversation by, so no flag picks
# the router: vLLM's router (--policy consistent_hash) reads x-session-id, SGLang's gateway
# (--policy manual) x-smg-routing-key, NVIDIA Dynamo x-dynamo-session-id. Each ignores the
# others' (SGLang's drops them before its workers see them).
STICKY_HEADERS: tuple[str, ...] = ("x-session-id", "x-smg-routing-key", "x-dynamo-session-id")


@dataclass(frozen=True)
class UpstreamConfig:
    urls: tuple[str, ...]  # base URLs of the OpenAI API, each ending in /v1
    policy: Policy = "overflow"
    api_key: str | None = None  # sent as a Bearer token (read from the environment, never argv)
    model: str | None = None  # the model name to ask for; None: the first one /v1/models lists
    # one more header the session key is sent in, beside STICKY_HEADERS (a router configured
    # to read another name)
    affinity_header: str = "x-session-id"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0  # the longest silence between two chunks of a reply
    # the longest one line may take, every try included: a server that drips a byte at a time,
    # or sends keep-alives without end, resets the silence timer forever
    line_timeout_s: float = 600.0
    retries: int = 3  # more tries after the first, for 429/5xx (not 501) and lost connections
    backoff_s: float = 0.25  # the first pause; it doubles, or follows Retry-After
    max_backoff_s: float = 4.0
    schema_format: SchemaFormat = "json_schema"
    min_local_tps: float = 0.0  # overflow: below this decode speed on the CPU placement
    max_streams: int = 64  # replies streaming from the upstream at once (each holds a thread)
    remote_sessions: int = 64  # sessions kept beyond the local model's slots (their transcripts)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("--upstream needs at least one URL")
        if self.policy not in POLICIES:
            raise ValueError(f"upstream policy must be one of {', '.join(POLICIES)}")
        if (self.retries < 0 or self.max_streams < 1 or self.backoff_s < 0
                or self.remote_sessions < 0 or self.line_timeout_s <= 0):
            raise ValueError("upstream retries, back-off and stream cap must be positive")
        if not self.affinity_header or not self.affinity_header.isascii() or any(
                c in self.affinity_header for c in " :\r\n"):
            raise ValueError(f"not a header name: {self.affinity_header!r}")


def affinity_headers(key: str, extra: str = "x-session-id") -> dict[str, str]:
    """The sticky headers that carry session ``key``: STICKY_HEADERS and ``extra`` (HTTP
    header names are case-insensitive: one header per name). The body carries the key too, as
    ``prompt_cache_key`` (NVIDIA's gateway, the sidecar's own face)."""
    return {name: key for name in dict.fromkeys((*STICKY_HEADERS, extra.lower()))}


def api_base(url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/v1/`` -> ``http://host:8000/v1``; ValueError
    for anything but an http(s) URL without credentials (a key goes in the environment)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--upstream wants an http(s) URL, not {url!r}")
    if parts.username or parts.password:
        raise ValueError("--upstream URLs carry no credentials; set the key's environment "
                         "variable instead (--upstream-key-env)")
    if parts.query or parts.fragment:
        raise ValueError(f"--upstream wants a base URL without query or fragment: {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"
