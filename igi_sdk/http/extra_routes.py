"""The face's routes besides chat: ``/v1/embeddings``, ``/v1/completions``, and llama-server's
native ``/completion`` (also under its plural name ``/completions``, as llama-server serves
it), ``/tokenize``, ``/detokenize`` and ``/embeddings`` (the shapes LLMUnity's remote mode and
CHIM's ``llamacpp`` connector send).

Each is one protocol request without a session (``tokenize``, ``detokenize``, ``embed``,
``complete``: serving/oneshot.py): the guards are chat's (the API key, the body's size and
JSON values counted before it is parsed, the ForeignGuard middleware on the whole app, typed
errors), and the request shapes are bounded pydantic models (http/extra_schema.py).
A raw prompt sent here is read as llama-server reads one: special-token text in it is the
token; the protocol's ``complete`` reads it as text unless asked (``parse_special``). Chosen so
because the clients of these routes write the chat template themselves (LLMUnity and CHIM send
``<|im_start|>user ... <|im_end|>`` inside the prompt): read as text, their markup would reach
the model as ordinary characters and every reply would degrade. The mod that builds such a
prompt owns it, player text in it included; a game that puts player text in a prompt itself
uses chat (the template's markup only is special there) or ``complete`` without parse_special.
Token ids in a /completion prompt are explicit and read as they are, special ones too (an id
outside the vocabulary is a 400 ``invalid_input``); a ``logit_bias`` text is tokenized as
llama-server does (special-token text is text).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from igi_sdk.client import BridgeError, ChatStream, Client, SidecarUnavailable
from igi_sdk.http import extra_schema as S
from igi_sdk.http.errors import HttpError, from_code
from igi_sdk.http.json_bound import refuse_unbounded
from igi_sdk.http.waiting import WaitLine

M = TypeVar("M", bound=BaseModel)
_INLINE_BODY = 64 << 10  # parsed on the event loop itself; larger ones on a worker thread
_END = object()


def register(app: FastAPI, api_key: str | None, client: Callable[[], Client],
             waiting: WaitLine | None = None) -> None:
    """Add the routes to ``app``; ``client``: the face's protocol connection (Inward.get);
    ``waiting``: the face's line of requests waiting for the sidecar's room (none: refused at
    once)."""
    line = waiting if waiting is not None else WaitLine(0, 0.0)

    async def started(prompt: S.Prompt, options: dict[str, Any], request: Request) -> _Reply:
        return await line.run(lambda: _start(client, prompt, options, request),
                              request.is_disconnected)

    async def called(fn: Callable[[Client], Any], request: Request) -> Any:
        return await line.run(lambda: _call(client, fn), request.is_disconnected)

    def authorised(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise HttpError(401, "invalid_api_key", "a valid API key is required (Bearer)")

    async def body(request: Request, model: type[M]) -> M:
        authorised(request)
        return await _read(request, model)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        req = await body(request, S.EmbeddingsRequest)
        inputs = req.inputs()
        out = await called(lambda c: c.embed(inputs), request)
        vectors: list[list[float]] = out["data"]
        if req.dimensions is not None and vectors and req.dimensions != len(vectors[0]):
            raise HttpError(400, "invalid_argument", f"this model's embeddings have "
                            f"{len(vectors[0])} dimensions, not {req.dimensions}")
        data = [{"object": "embedding", "index": i,
                 "embedding": _b64(v) if req.encoding_format == "base64" else v}
                for i, v in enumerate(vectors)]
        n = int(out["tokens"])
        return JSONResponse({"object": "list", "data": data, "model": req.model or _model(),
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    @app.post("/embeddings")
    async def native_embeddings(request: Request) -> JSONResponse:
        req = await body(request, S.NativeEmbeddingRequest)
        out = await called(lambda c: c.embed([req.content]), request)
        return JSONResponse({"embedding": out["data"][0]})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        req = await body(request, S.TokenizeRequest)
        out = await _call(client, lambda c: c.tokenize(
            req.content, add_special=req.add_special, with_pieces=req.with_pieces,
            parse_special=req.parse_special))
        if req.with_pieces:
            return JSONResponse({"tokens": [{"id": t, "piece": p} for t, p in
                                            zip(out["tokens"], out["pieces"], strict=True)]})
        return JSONResponse({"tokens": out["tokens"]})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        req = await body(request, S.DetokenizeRequest)
        text = await _call(client, lambda c: c.detokenize(req.tokens))
        return JSONResponse({"content": text})

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        req = await body(request, S.CompletionsRequest)
        options = req.complete_options()
        reply = await started(req.the_prompt(), options, request)
        model = req.model or _model()
        head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
                "created": int(time.time()), "model": model}
        prefix = req.the_prompt() if req.echo else ""
        if not req.stream:
            done = await reply.finished(request)
            return JSONResponse({**head, "choices": [{
                "text": prefix + done["text"], "index": 0, "logprobs": None,
                "finish_reason": _finish(done)}], "usage": _usage(done)})

        async def events() -> AsyncIterator[bytes]:
            def chunk(text: str, finish: str | None) -> bytes:
                return _sse({**head, "choices": [{"text": text, "index": 0, "logprobs": None,
                                                  "finish_reason": finish}]})

            async with reply.streaming(request):
                if prefix:
                    yield chunk(prefix, None)
                async for piece in reply.pieces(request):
                    if isinstance(piece, HttpError):
                        yield _sse(piece.body())
                        return
                    yield chunk(piece, None)
                done = reply.stream.done or {}
                yield chunk("", _finish(done))
                if req.stream_options is not None and req.stream_options.include_usage:
                    yield _sse({**head, "choices": [], "usage": _usage(done)})
                yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/completion", response_model=None)
    @app.post("/completions", response_model=None)  # llama-server's plural alias of it
    async def completion(request: Request) -> Response:
        req = await body(request, S.NativeCompletionRequest)
        prompts = req.prompts()
        options = req.complete_options()
        bias = await _logit_bias(client, req)
        if bias:
            options["sampling"]["logit_bias"] = bias
        if len(prompts) > 1 and req.stream:
            raise HttpError(400, "invalid_argument", "several prompts are answered whole: send "
                            "them with stream false (or one request per prompt)")
        if req.n_predict == 0:  # the prompt only (LLMUnity's warm-up): nothing to generate
            counts = [await _count(client, p) for p in prompts]
            finals = [_native_final({"text": "", "finish_reason": "length",
                                     "usage": {"prompt_tokens": n}}, req, "") for n in counts]
            return JSONResponse(finals[0] if len(finals) == 1 else finals)
        if len(prompts) > 1:  # one after another, each in a session of its own
            for p in prompts:  # every prompt's ids checked before the first is read
                await _check_ids(client, p)
            results = []
            for p in prompts:
                done = await (await started(p, options, request)).finished(request)
                results.append(_native_final(done, req, done["text"]))
            return JSONResponse(results)
        reply = await started(prompts[0], options, request)
        if not req.stream:
            done = await reply.finished(request)
            return JSONResponse(_native_final(done, req, done["text"]))

        async def events() -> AsyncIterator[bytes]:
            async with reply.streaming(request):
                async for piece in reply.pieces(request):
                    if isinstance(piece, HttpError):
                        yield _sse(piece.body())
                        return
                    yield _sse({"content": piece, "stop": False})
                # llama-server's native stream ends with its final object (no [DONE])
                yield _sse(_native_final(reply.stream.done or {}, req, ""))

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def _model() -> str:
        return "igi-sdk"


class _Reply:
    """A ``complete`` stream followed on the event loop (events handed over by the client's
    sink, as chat's are: no thread waits for them)."""

    def __init__(self, c: Client, stream: ChatStream) -> None:
        self.client, self.stream = c, stream
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.ahead: list[object] = []  # read before the queue (the first piece, looked at)
        loop = asyncio.get_running_loop()

        def hand_on(item: object) -> None:
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, item)
            except RuntimeError:  # the loop has stopped: nobody reads this reply now
                pass

        def sink(rtype: str, b: dict[str, Any]) -> None:
            if rtype == "token":
                stream.pieces.append(b["text"])
                hand_on(b["text"])
            elif rtype == "done":
                stream.done = b
                hand_on(_END)
            elif rtype == "error":
                hand_on(BridgeError(b.get("code", "error"), b.get("message", ""),
                                    bool(b.get("retryable"))))

        c.follow(stream.id, sink)

    async def next(self, request: Request | None) -> object:
        """The next piece, ``_END``, or HttpError; a client gone (asked each quiet second)
        or a silent sidecar ends the wait."""
        while True:
            if self.ahead:
                piece = self.ahead.pop(0)
            elif not self.queue.empty():
                piece = self.queue.get_nowait()
            else:
                try:
                    piece = await asyncio.wait_for(self.queue.get(), timeout=1.0)
                except TimeoutError:
                    if request is not None and await request.is_disconnected():
                        raise _Gone from None
                    if self.client.silent_for() > self.client.silence_limit_s:
                        raise HttpError(503, "unavailable", "no answer from the sidecar") \
                            from None
                    continue
            if isinstance(piece, BridgeError):
                return _http(piece)
            return piece

    async def pieces(self, request: Request) -> AsyncIterator[str | HttpError]:
        while True:
            piece = await self.next(request)
            if piece is _END:
                return
            assert isinstance(piece, str | HttpError)
            yield piece
            if isinstance(piece, HttpError):
                return

    async def finished(self, request: Request) -> dict[str, Any]:
        try:
            async for piece in self.pieces(request):
                if isinstance(piece, HttpError):
                    raise piece
        except _Gone:
            await self.cancel()
            raise HttpError(499, "cancelled", "the client went away") from None
        assert self.stream.done is not None
        return self.stream.done

    def streaming(self, request: Request) -> _Streaming:
        return _Streaming(self)

    async def cancel(self) -> None:
        if self.stream.done is None:
            try:
                await asyncio.to_thread(self.stream.cancel)
            except (BridgeError, SidecarUnavailable):
                pass  # ended meanwhile, or the sidecar is gone: nothing left to stop


class _Streaming:
    """Cancels the reply when its response stream ends early (the client went away)."""

    def __init__(self, reply: _Reply) -> None:
        self.reply = reply

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> bool:
        import anyio

        with anyio.CancelScope(shield=True):
            await self.reply.cancel()
        return exc[0] is _Gone  # a client gone: the stream just ends


class _Gone(Exception):
    """The HTTP client disconnected."""


async def _logit_bias(client: Callable[[], Client],
                      req: S.NativeCompletionRequest) -> dict[str, float]:
    """``logit_bias`` as the wire's {token id: bias}: a text's tokens (tokenized as
    llama-server does: no BOS, special-token text is text) each get its bias."""
    entries = req.bias_entries()
    texts = sorted({k for k, _ in entries if isinstance(k, str)})
    outs = await asyncio.gather(*(_call(client, lambda c, t=t: c.tokenize(  # type: ignore[misc]
        t, add_special=False, parse_special=False)) for t in texts))
    tokens_of = {t: list(o["tokens"]) for t, o in zip(texts, outs, strict=True)}
    bias: dict[str, float] = {}
    for key, value in entries:
        for tok in [key] if isinstance(key, int) else tokens_of[key]:
            bias[str(tok)] = value
    if len(bias) > S.MAX_BIAS_ENTRIES:
        raise HttpError(400, "invalid_argument", f"logit_bias names {len(bias)} tokens; at "
                        f"most {S.MAX_BIAS_ENTRIES}")
    return bias


async def _count(client: Callable[[], Client], prompt: S.Prompt) -> int:
    """A prompt's tokens, without reading it (``n_predict`` 0); its token ids checked."""
    if isinstance(prompt, str):
        out = await _call(client, lambda c: c.tokenize(prompt, add_special=True))
        return len(out["tokens"])
    await _check_ids(client, prompt)
    n, ids = 0, [x for x in prompt if isinstance(x, int)]
    for i, x in enumerate(prompt):
        if isinstance(x, str):
            out = await _call(client, lambda c, x=x, i=i: c.tokenize(  # type: ignore[misc]
                x, add_special=i == 0))
            n += len(out["tokens"])
    return n + len(ids)


async def _check_ids(client: Callable[[], Client], prompt: S.Prompt) -> None:
    """400 ``invalid_input`` for a token id outside the vocabulary (the sidecar's detokenize
    checks them, and reads nothing)."""
    ids = [x for x in prompt if isinstance(x, int)] if not isinstance(prompt, str) else []
    if ids:
        await _call(client, lambda c: c.detokenize(ids))


async def _start(client: Callable[[], Client], prompt: S.Prompt, options: dict[str, Any],
                 request: Request) -> _Reply:
    """Send the ``complete`` and wait for its first piece (a refusal is a 4xx, not a stream
    that starts and fails)."""
    def send() -> tuple[Client, ChatStream]:
        c = client()
        if not c.greeted:
            c.hello()
        return c, c.complete(prompt, **options)

    c, stream = await asyncio.to_thread(_protect(send))
    reply = _Reply(c, stream)  # on the event loop: its events are handed to this loop
    try:
        first = await reply.next(request)
    except _Gone:
        await reply.cancel()
        raise HttpError(499, "cancelled", "the client went away") from None
    if isinstance(first, HttpError):
        raise first
    reply.ahead.append(first)  # read again by pieces(), before what came after it
    return reply


def _protect(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return fn()
        except BridgeError as e:
            raise _http(e) from None

    return run


async def _call(client: Callable[[], Client], fn: Callable[[Client], Any]) -> Any:
    """A request that answers once, on a worker thread (it waits for its ``ok``)."""
    return await asyncio.to_thread(_protect(lambda: fn(client())))


def _http(e: BridgeError) -> HttpError:
    if isinstance(e, SidecarUnavailable):
        return HttpError(503, "unavailable", e.message)
    if e.code == "invalid_input":
        return HttpError(400, "invalid_input", e.message)
    if e.code == "invalid_body":  # the protocol refused what the face let through
        return HttpError(400, "invalid_argument", e.message)
    return from_code(e.code, e.message)


async def _read(request: Request, model: type[M]) -> M:
    """The body read within S.MAX_BODY_BYTES (refused before it is all read), its JSON values
    and escapes counted before it is parsed, then validated into ``model``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > S.MAX_BODY_BYTES:
        raise HttpError(413, "request_too_large", f"the body is over {S.MAX_BODY_BYTES} bytes")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > S.MAX_BODY_BYTES:
            raise HttpError(413, "request_too_large",
                            f"the body is over {S.MAX_BODY_BYTES} bytes")
        parts.append(chunk)
    data = b"".join(parts)
    if size <= _INLINE_BODY:
        return _parse(data, model)
    return await asyncio.to_thread(_parse, data, model)


def _parse(data: bytes, model: type[M]) -> M:
    refuse_unbounded(data)
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise HttpError(400, "invalid_body", f"{where}: {first.get('msg')}") from None


def _b64(vector: list[float]) -> str:
    """A vector as OpenAI's base64 encoding: little-endian float32s."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _finish(done: dict[str, Any]) -> str:
    return "length" if done.get("finish_reason") == "length" else "stop"


def _usage(done: dict[str, Any]) -> dict[str, int]:
    u = done.get("usage", {})
    p, c = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


_STOP_TYPE = {"stop": "eos", "stop_string": "word", "length": "limit", "cancelled": "none"}


def _native_final(done: dict[str, Any], req: S.NativeCompletionRequest,
                  content: str) -> dict[str, Any]:
    """llama-server's last /completion object: the figures of the whole reply."""
    u, t = done.get("usage", {}), done.get("timings", {})
    reason = done.get("finish_reason", "stop")
    predicted = int(u.get("completion_tokens", 0))
    evaluated = int(u.get("prompt_tokens", 0)) + int(u.get("cached_tokens", 0))
    ttft, total = float(t.get("ttft_s", 0.0)), float(t.get("total_s", 0.0))
    return {"content": content, "id_slot": 0, "stop": True, "model": "igi-sdk",
            "tokens_predicted": predicted, "tokens_evaluated": evaluated,
            "tokens_cached": int(u.get("cached_tokens", 0)), "truncated": False,
            "stop_type": _STOP_TYPE.get(reason, "none"), "stopping_word": "",
            "timings": {"prompt_n": evaluated, "prompt_ms": round(ttft * 1000, 3),
                        "predicted_n": predicted,
                        "predicted_ms": round(max(0.0, total - ttft) * 1000, 3)},
            "generation_settings": {"n_predict": req.max_tokens(),
                                    "temperature": req.temperature}}
