"""The sidecar as a client of an OpenAI-compatible cluster: one reply streamed from a replica,
with session affinity, retries with back-off, and bounded reads.

Affinity is twofold: each request carries the session's key as ``prompt_cache_key`` and in
every router's sticky header (config.STICKY_HEADERS), so a router in front of the replicas
(vLLM's router, SGLang's model gateway, NVIDIA Dynamo) pins the conversation to one worker;
and with several ``--upstream`` URLs and no router, the session's key picks the replica itself
(rendezvous hashing: the same replica every time, and only the sessions of a replica that goes
away move elsewhere)."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from igi_sdk.errors import UpstreamRefusedError, UpstreamUnavailableError
from igi_sdk.events import ToolCall
from igi_sdk.upstream.config import UpstreamConfig, affinity_headers, api_base
from igi_sdk.upstream.sse import data_lines

log = logging.getLogger("igi_sdk.upstream")

# 500 too, as OpenAI's own clients do: a router answers 500 for a worker it could not reach
# (SGLang's gateway, before its health check takes the worker out)
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_EVENT_BYTES = 1 << 20  # one SSE line (a chunk of a reply is a few hundred bytes)
MAX_BODY_BYTES = 4 << 20  # a whole non-streamed answer, an error body, a model list
CHARS_PER_TOKEN_CAP = 64  # a reply longer than max_tokens x this is cut ("length")

# a JSON value as parsed from the upstream (read, never trusted: every access is checked)
Json = Any


@dataclass(frozen=True)
class UpstreamReply:
    """A finished upstream reply (satisfies ``events.ReplyResult``)."""

    text: str
    finish_reason: str  # "stop", "length", "cancelled"
    prompt_tokens: int  # read for this line: the upstream's count less what it had cached
    completion_tokens: int
    ttft_s: float
    total_s: float
    cached_tokens: int  # what the upstream says it reused of its prefix cache
    replica: str
    attempts: int
    tool_calls: tuple[ToolCall, ...] = ()  # an upstream's calls are not read (tools are local)
    dropped_turns: int = 0  # the upstream keeps its own context: nothing is folded here
    summarised_turns: int = 0


class UpstreamCall:
    """One reply in flight; ``cancel`` from any thread ends it at the next chunk, or at once
    while it waits to retry or read."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.expired = threading.Event()  # the line ran past its deadline
        self._lock = threading.Lock()
        self._response: httpx.Response | None = None

    def cancel(self) -> None:
        self.cancelled.set()
        self._close()

    def expire(self) -> None:
        """(A timer's thread.) The line's deadline passed: what it reads ends now."""
        self.expired.set()
        self._close()

    @property
    def ended(self) -> bool:
        return self.cancelled.is_set() or self.expired.is_set()

    def _close(self) -> None:
        with self._lock:
            resp = self._response
        if resp is not None:
            _shut(resp)
            try:
                resp.close()
            except Exception:  # noqa: BLE001 - closing a response being read may race
                pass

    def _reading(self, resp: httpx.Response | None) -> None:
        with self._lock:
            self._response = resp
        if resp is not None and self.ended:
            resp.close()


def _shut(resp: httpx.Response) -> None:
    """Shut the response's socket down: that wakes a read blocked on it in another thread
    (closing the response does not: a server that sent part of a reply and then nothing held
    the line until the silence timeout)."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Retry(Exception):
    """This try failed in a way another may not: ``next_replica`` when this replica is gone."""

    def __init__(self, why: str, next_replica: bool, wait_s: float | None = None) -> None:
        super().__init__(why)
        self.next_replica = next_replica
        self.wait_s = wait_s


class UpstreamClient:
    def __init__(self, config: UpstreamConfig,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.cfg = config
        self.bases = tuple(api_base(u) for u in config.urls)
        self._http = httpx.Client(
            transport=transport,
            timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=config.max_streams + len(self.bases),
                                max_keepalive_connections=config.max_streams),
            follow_redirects=False)  # a redirect could carry the key elsewhere
        self._models: dict[str, str] = {}
        self._lock = threading.Lock()
        self.figures = {"replies": 0, "retries": 0, "failures": 0, "refusals": 0}

    def close(self) -> None:
        self._http.close()

    # --- affinity -----------------------------------------------------------------------------

    def replicas_for(self, key: str) -> list[str]:
        """The replicas in the order session ``key`` tries them (rendezvous hashing)."""
        def weight(base: str) -> bytes:
            return hashlib.sha256(f"{base}\n{key}".encode()).digest()

        return sorted(self.bases, key=weight, reverse=True)

    # --- one reply ----------------------------------------------------------------------------

    def stream(self, key: str, body: dict[str, object], on_text: Callable[[str], None],
               call: UpstreamCall, max_chars: int) -> UpstreamReply:
        """Stream one chat completion for session ``key``; ``on_text`` hears each piece.
        Tries again on 429/500/502/503/504 and lost connections (the next replica for those) until
        the first piece; a reply broken off after it ends with UpstreamUnavailableError."""
        deadline = threading.Timer(self.cfg.line_timeout_s, call.expire)
        deadline.daemon = True
        deadline.start()
        try:
            return self._stream(key, body, on_text, call, max_chars)
        finally:
            deadline.cancel()

    def _stream(self, key: str, body: dict[str, object], on_text: Callable[[str], None],
                call: UpstreamCall, max_chars: int) -> UpstreamReply:
        order = self.replicas_for(key)
        t0 = time.monotonic()
        at, delay, why = 0, self.cfg.backoff_s, "no try was made"
        for attempt in range(1, self.cfg.retries + 2):
            if call.cancelled.is_set():
                return UpstreamReply("", "cancelled", 0, 0, 0.0, time.monotonic() - t0, 0,
                                     order[at], attempt - 1)
            self._check_deadline(call)
            base = order[at]
            try:
                return self._try(base, key, body, on_text, call, max_chars, t0, attempt)
            except _Retry as r:
                why = f"{base}: {r}"
                if attempt > self.cfg.retries:
                    break
                with self._lock:
                    self.figures["retries"] += 1
                pause = delay if r.wait_s is None else r.wait_s
                if r.next_replica or pause > self.cfg.max_backoff_s:
                    at = (at + 1) % len(order)  # this one is gone or busy for long: the next
                    pause = min(pause, self.cfg.max_backoff_s)
                log.info("upstream try %d failed (%s); again in %.2f s", attempt, why, pause)
                if call.cancelled.wait(pause):
                    continue  # cancelled while waiting: answered at the top of the loop
                delay = min(delay * 2, self.cfg.max_backoff_s)
        with self._lock:
            self.figures["failures"] += 1
        raise UpstreamUnavailableError(
            f"the upstream did not answer after {self.cfg.retries + 1} tries ({why})")

    def _check_deadline(self, call: UpstreamCall) -> None:
        if call.expired.is_set():
            raise UpstreamUnavailableError(
                f"the upstream did not finish the line within {self.cfg.line_timeout_s:g} s "
                "(its deadline, every try included)")

    def _try(self, base: str, key: str, body: dict[str, object], on_text: Callable[[str], None],
             call: UpstreamCall, max_chars: int, t0: float, attempt: int) -> UpstreamReply:
        try:
            model = self._model(base, call)
            self._check_deadline(call)
            request = self._http.build_request(
                "POST", f"{base}/chat/completions", headers=self._headers(key),
                content=json.dumps({"model": model, **body}).encode())
            resp = self._http.send(request, stream=True)
        except httpx.TransportError as e:  # refused, reset, timed out before an answer
            raise _Retry(type(e).__name__, next_replica=True) from None
        call._reading(resp)
        try:
            if resp.status_code != 200:
                self._refusal(resp, base)
            _identity_encoded(resp, base)
            max_tokens = body.get("max_tokens")
            reply = self._read(resp, base, on_text, call, max_chars, t0, attempt,
                               max_tokens if isinstance(max_tokens, int) else None)
        finally:
            call._reading(None)
            resp.close()
        with self._lock:
            self.figures["replies"] += 1
        return reply

    def _headers(self, key: str) -> dict[str, str]:
        # identity: a compressed stream is work the sidecar did not ask for (a gzip stream of
        # empty chunks kept a thread inflating for minutes)
        h = {"content-type": "application/json", "accept": "text/event-stream",
             "accept-encoding": "identity",
             **affinity_headers(key, self.cfg.affinity_header)}
        if self.cfg.api_key:
            h["authorization"] = f"Bearer {self.cfg.api_key}"
        return h

    def _model(self, base: str, call: UpstreamCall) -> str:
        if self.cfg.model:
            return self.cfg.model
        with self._lock:
            known = self._models.get(base)
        if known:
            return known
        # read as a reply is: the line's cancel and deadline end it, and at most a bounded body
        # of it is held (a 600 MB model list grew the sidecar by 1.2 GB)
        resp = self._http.send(self._http.build_request(
            "GET", f"{base}/models", headers=self._headers("models")), stream=True)
        call._reading(resp)
        try:
            if resp.status_code != 200:
                self._refusal(resp, base)
            _identity_encoded(resp, base)
            raw = _read_bounded(resp, "model list")
        except (httpx.TransportError, httpx.StreamError):
            self._check_deadline(call)
            if call.cancelled.is_set():
                raise UpstreamUnavailableError("the line was cancelled") from None
            raise
        finally:
            call._reading(None)
            resp.close()
        listing = _bounded_json(raw)
        try:
            name = str(listing["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise UpstreamRefusedError(f"{base}/models lists no model; name one with "
                                       "--upstream-model") from None
        with self._lock:
            self._models[base] = name
        return name

    def _refusal(self, resp: httpx.Response, base: str) -> None:
        """Raise for a non-200 answer: _Retry where another try may succeed."""
        raw = b""
        for chunk in resp.iter_bytes():  # bounded: only the start of an error body is read
            raw += chunk
            if len(raw) >= 64 << 10:
                break
        message = _error_message(raw)
        if resp.status_code in RETRY_STATUS:
            raise _Retry(f"HTTP {resp.status_code} {message}", next_replica=False,
                         wait_s=_retry_after(resp.headers.get("retry-after")))
        with self._lock:
            self.figures["refusals"] += 1
        raise UpstreamRefusedError(f"the upstream ({base}) answered HTTP {resp.status_code}: "
                                   f"{message}")

    def _read(self, resp: httpx.Response, base: str, on_text: Callable[[str], None],
              call: UpstreamCall, max_chars: int, t0: float, attempt: int,
              max_tokens: int | None) -> UpstreamReply:
        pieces: list[str] = []
        size, finish, usage, ttft = 0, "stop", None, 0.0
        started = capped = False
        try:
            for chunk in _chunks(resp):
                if call.cancelled.is_set():
                    finish = "cancelled"
                    break
                self._check_deadline(call)
                err = chunk.get("error") if isinstance(chunk, dict) else None
                if err is not None:
                    raise UpstreamUnavailableError(
                        f"the upstream ended the reply with an error: {_clip(err)}")
                if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                text, reason = _delta(chunk)
                if capped:
                    # max_tokens reached: the finish and usage chunks that follow are read
                    # (the usage carries the cached tokens); more text means the server
                    # ignores max_tokens
                    if text:
                        break
                    if reason:
                        finish = "length" if reason == "length" else "stop"
                    continue
                if text:
                    if not started:
                        started, ttft = True, time.monotonic() - t0
                    size += len(text)
                    if size > max_chars:
                        finish = "length"
                        break
                    pieces.append(text)
                    on_text(text)
                    # a piece is a token as OpenAI servers stream them: the line's max_tokens
                    # holds even against a server that ignores it
                    if max_tokens is not None and len(pieces) >= max_tokens:
                        finish, capped = "length", True
                        continue
                if reason:
                    finish = "length" if reason == "length" else "stop"
        except (httpx.TransportError, httpx.StreamError) as e:
            self._check_deadline(call)
            if call.cancelled.is_set():
                finish = "cancelled"
            elif not started:
                raise _Retry(type(e).__name__, next_replica=True) from None
            else:
                raise UpstreamUnavailableError(
                    f"the upstream ({base}) broke off the reply ({type(e).__name__}); the "
                    "line is rolled back") from None
        total = time.monotonic() - t0
        prompt, completion, cached = _usage(usage)
        cached = min(cached, prompt)  # OpenAI counts the cached tokens in prompt_tokens
        return UpstreamReply("".join(pieces), finish, prompt - cached, completion or len(pieces),
                             ttft if started else total, total, cached, base, attempt)


def _identity_encoded(resp: httpx.Response, base: str) -> None:
    coding = resp.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise UpstreamUnavailableError(
            f"the upstream ({base}) answered {coding}-encoded, which the sidecar did not ask "
            "for (it asks for identity)")


def _read_bounded(resp: httpx.Response, what: str) -> bytes:
    raw = bytearray()
    for part in resp.iter_raw():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise UpstreamUnavailableError(f"the upstream's {what} is over {MAX_BODY_BYTES} "
                                           "bytes")
    return bytes(raw)


def _chunks(resp: httpx.Response) -> Iterator[Json]:
    """The JSON chunks of a streamed answer, or the one body of an answer that was not
    streamed (a server may ignore ``stream``)."""
    kind = resp.headers.get("content-type", "")
    if "text/event-stream" not in kind:
        yield _as_stream_chunk(_bounded_json(_read_bounded(resp, "answer")))
        return
    for data in data_lines(resp.iter_raw(), MAX_EVENT_BYTES):
        if data.strip() == b"[DONE]":
            return
        if not data.strip():
            continue
        try:
            yield json.loads(data)
        except ValueError:
            raise UpstreamUnavailableError("the upstream sent an event that is not JSON") \
                from None


def _as_stream_chunk(answer: Json) -> Json:
    """A whole chat.completion read as the one chunk of a stream."""
    try:
        choice = answer["choices"][0]
        return {"choices": [{"delta": {"content": choice["message"].get("content") or ""},
                             "finish_reason": choice.get("finish_reason")}],
                "usage": answer.get("usage")}
    except (KeyError, IndexError, TypeError, AttributeError):
        return answer


def _delta(chunk: Json) -> tuple[str, str | None]:
    try:
        choice = chunk["choices"][0]
    except (KeyError, IndexError, TypeError):
        return "", None  # a usage-only chunk, a keep-alive
    if not isinstance(choice, dict):
        return "", None
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else None
    reason = choice.get("finish_reason")
    return (text if isinstance(text, str) else ""), (reason if isinstance(reason, str) else None)


def _usage(usage: Json) -> tuple[int, int, int]:
    if not isinstance(usage, dict):
        return 0, 0, 0

    def count(v: object) -> int:
        return v if isinstance(v, int) and 0 <= v < 1 << 31 else 0

    details = usage.get("prompt_tokens_details")
    cached = count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return count(usage.get("prompt_tokens")), count(usage.get("completion_tokens")), cached


def _bounded_json(raw: bytes) -> Json:
    if len(raw) > MAX_BODY_BYTES:
        raise UpstreamUnavailableError("the upstream's answer is too large")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise UpstreamUnavailableError("the upstream's answer is not JSON") from None


def _error_message(raw: bytes) -> str:
    try:
        parsed = json.loads(raw)
        err = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        msg = err.get("message", err) if isinstance(err, dict) else err
    except (ValueError, RecursionError):
        msg = raw.decode("utf-8", "replace")
    return _clip(msg)


def _clip(v: object, limit: int = 300) -> str:
    s = v if isinstance(v, str) else repr(v)
    return s if len(s) <= limit else s[:limit] + "…"


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (HTTP dates are not honoured: a router sends seconds)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


__all__ = ["UpstreamCall", "UpstreamClient", "UpstreamReply"]
