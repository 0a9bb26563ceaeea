"""Python client of the sidecar (a DEALER socket), blocking and asyncio flavours.

A client may be used from several threads: its socket belongs to one thread of its own
(:mod:`igi_sdk.client_socket`), which sends what any thread queues and files every reply in an
inbox, so a thread waiting for a long reply never holds up another thread's request.
ZeroMQ reconnects by itself (with back-off) when the sidecar restarts; the client notices a dead
sidecar by its missing heartbeats, raises :class:`SidecarUnavailable`, and says hello again on
the next request once a sidecar answers.

The blocking client speaks protocol 1.1: its socket's thread pings the sidecar when the program
has sent nothing for a third of its lease, so its sessions stay its own while the program lives
and become adoptable soon after it dies; :meth:`Client.close` says goodbye.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import zmq
import zmq.asyncio
import zmq.auth

from igi_sdk.client_socket import SendFailed, SocketThread
from igi_sdk.wire import protocol as P


class BridgeError(Exception):
    """The sidecar refused a request: ``code``, ``message``, ``retryable`` as on the wire."""

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(f"[{code}] {message}")
        self.code, self.message, self.retryable = code, message, retryable


class WrongSidecar(BridgeError):
    """The sidecar at the endpoint is not the one this client launched: hello's ``instance``
    (or ``model``) differs from what the client expects. Never reuse it: another game's
    sidecar has another model, another save folder and watches another process."""

    def __init__(self, message: str) -> None:
        super().__init__("wrong_sidecar", message, retryable=False)


class RequestTimeout(BridgeError, TimeoutError):
    """The sidecar is alive (its heartbeats arrive) but did not answer in time."""

    def __init__(self, message: str) -> None:
        super().__init__("timeout", message, retryable=True)


class SidecarUnavailable(BridgeError, TimeoutError):
    """No answer (and no heartbeat) from the sidecar in time: it is down or restarting."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message, True)


def _configure(sock: zmq.Socket, curve: dict[str, bytes] | None, endpoint: str = "") -> None:
    # a fixed routing id: after a reconnect the sidecar (ROUTER_HANDOVER) hands this client its
    # sessions back instead of treating it as a stranger
    sock.setsockopt(zmq.ROUTING_ID, b"igi-" + os.urandom(12).hex().encode())
    if "[" in endpoint:  # tcp://[::1]:port: ZeroMQ speaks IPv6 only when asked to
        sock.setsockopt(zmq.IPV6, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)  # exponential back-off up to 2 s
    # no ZMTP heartbeats: libzmq 4.3 can abort the process when a heartbeat is written to a
    # connection that broke while its input was stopped. The sidecar's own heartbeat messages
    # tell whether it lives; TCP keepalive ends a connection to a host that vanished
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)
    if curve:
        sock.curve_serverkey = curve["server_public"]
        sock.curve_publickey = curve["public"]
        sock.curve_secretkey = curve["secret"]


def curve_keys(client_secret_file: str | Path, server_public_file: str | Path) -> dict[str, bytes]:
    """Keys for a CurveZMQ connection, from `igi-sdk keys` certificate files."""
    public, secret = zmq.auth.load_certificate(str(client_secret_file))
    server_public, _ = zmq.auth.load_certificate(str(server_public_file))
    if secret is None:
        raise ValueError(f"{client_secret_file} holds no secret key")
    return {"public": public, "secret": secret, "server_public": server_public}


class Wire(Protocol):
    """What a client sends through: its socket thread, or an in-process connection."""

    def send(self, frame: bytes) -> None: ...

    def close(self, goodbye: bytes | None) -> None: ...


# makes an in-process connection whose received messages go to the given callback
LocalConnect = Callable[[Callable[[bytes], None]], Wire]
# what Client.follow hands a request's events to: (type, body)
EventSink = Callable[[str, dict[str, Any]], None]


class Client:
    """Blocking client. ``timeout`` bounds every wait for the sidecar, in seconds."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:5599", *, timeout: float = 10.0,
                 engine: str = "python", game_pid: int | None = None,
                 curve: dict[str, bytes] | None = None, lease_s: float = 15.0,
                 keep_sessions: bool = False, owner: str | None = None,
                 token: str | None = None, instance: str | None = None,
                 model: str | None = None, local: LocalConnect | None = None) -> None:
        """``owner``: the owner key this client's sessions belong to (a later client with the
        same key may adopt them; nobody else sees them). ``token``: the sidecar's launch token
        (the value its process got in IGI_SDK_TOKEN), which makes this client the game.
        ``instance`` / ``model``: what the sidecar this client launched answers in hello
        (``serve --instance``, the model's file name); any other sidecar is refused with
        :class:`WrongSidecar`. ``local``: connect in-process instead of through ``endpoint``
        (``Server.connect_local`` of a sidecar in this process: no socket between them)."""
        self.endpoint, self.timeout = endpoint, timeout
        self.expect_instance, self.expect_model = instance, model
        self._hello_body = {"protocol": P.PROTOCOL_VERSION, "minor": P.PROTOCOL_MINOR,
                            "engine": engine, "game_pid": game_pid,
                            "client_name": f"pid{os.getpid()}", "lease_s": lease_s}
        if owner is not None:
            self._hello_body["owner"] = owner
        if token is not None:
            self._hello_body["token"] = token
        self.keep_sessions = keep_sessions  # on close: leave the sessions to be adopted
        self._ids = itertools.count(1)
        # the inbox, filed by the socket's thread; waiting for a reply waits on this condition
        self._arrived = threading.Condition()
        self._inbox: dict[int, deque[tuple[str, dict[str, Any]]]] = defaultdict(deque)
        self._keepalive_ids: set[int] = set()  # pings of the lease: their answers are dropped
        # requests whose events go to a callback as they are filed, not to the inbox (follow)
        self._followers: dict[int, EventSink] = {}
        self._greeted = False
        self._closed = False  # closed: every wait ends at once (no thread waits out silence)
        self._last_heard = time.monotonic()
        self._wire: Wire
        if local is not None:
            self._wire = local(self._file)
            return
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        _configure(sock, curve, endpoint)
        sock.connect(endpoint)
        # a DEALER with no live connection holds no frame; a refused CurveZMQ handshake drops
        # the connection, so sending gives up like receiving does
        self._wire = SocketThread(ctx, sock, name="igi-client-socket", on_frame=self._file,
                                  on_idle=self._lease_ping, idle_s=lease_s / 3,
                                  send_timeout_s=max(3.0, min(timeout, 5.0)))

    # --- plumbing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Say goodbye (the sidecar closes this client's sessions, or keeps them for adoption
        with ``keep_sessions``) and close the socket."""
        goodbye = (P.encode(next(self._ids), "goodbye", {"keep_sessions": self.keep_sessions})
                   if self._greeted else None)
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()
            followers, self._followers = self._followers, {}
            for sink in followers.values():  # whoever follows a reply hears that it ended
                sink("error", {"code": "engine_closed", "message": "the client was closed",
                               "retryable": True})
        self._wire.close(goodbye)

    def _lease_ping(self) -> bytes | None:
        """(The socket's thread, after a third of the lease without sending.) A ping that keeps
        this client's sessions its own while the program lives."""
        if not self._greeted:
            return None
        msg_id = next(self._ids)
        self._keepalive_ids.add(msg_id)
        return P.encode(msg_id, "ping", {})

    def _file(self, frame: bytes) -> None:
        """(The socket's thread.) Put a received message in the inbox; heartbeats and the
        lease's ping answers are dropped."""
        self._last_heard = time.monotonic()
        rid, rtype, body = P.decode_reply(frame)
        if rtype == "heartbeat" or rtype not in P.REPLY_TYPES:
            return  # unknown reply types are ignored: a later sidecar may add some
        if rid in self._keepalive_ids:
            self._keepalive_ids.discard(rid)
            return
        with self._arrived:
            sink = self._followers.get(rid)
            if sink is not None:  # in the lock: events reach it in the order they came
                if rtype in ("done", "error"):
                    del self._followers[rid]
                sink(rtype, body)
                return
            self._inbox[rid].append((rtype, body))
            self._arrived.notify_all()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, msg_type: str, body: dict[str, Any] | None = None) -> int:
        """Send a request; returns its id (replies come through :meth:`next_event`)."""
        msg_id = next(self._ids)
        try:
            self._wire.send(P.encode(msg_id, msg_type, body or {}))
        except SendFailed:  # no connection to queue on (refused handshake), or closed
            self._greeted = False
            raise SidecarUnavailable(f"cannot reach the sidecar at {self.endpoint}") from None
        return msg_id

    def next_event(self, msg_id: int, timeout: float | None = None, *,
                   stream: bool = False) -> tuple[str, dict[str, Any]]:
        """The next (type, body) for request ``msg_id``.

        Raises :class:`SidecarUnavailable` only on silence (no message, heartbeats included,
        for ``min(timeout, 5)`` s, at least 3): a sidecar that keeps sending heartbeats is alive,
        however long its work takes. Past ``timeout`` with the sidecar alive, a request raises
        :class:`RequestTimeout`; a stream (``stream=True``) keeps waiting, since reading a long
        prompt on the CPU may take longer than any fixed timeout."""
        limit = self.timeout if timeout is None else timeout
        silence = max(3.0, min(self.timeout, 5.0))
        deadline = time.monotonic() + limit
        heard_since = time.monotonic()  # silence counts from this call at the earliest
        with self._arrived:
            while True:
                q = self._inbox.get(msg_id)
                if q:
                    return q.popleft()
                if self._closed:
                    raise SidecarUnavailable("the client was closed")
                now = time.monotonic()
                quiet_until = max(self._last_heard, heard_since) + silence
                if now > quiet_until:
                    self._greeted = False  # a restarted sidecar will want a hello
                    raise SidecarUnavailable(f"no answer from the sidecar at {self.endpoint}")
                if now > deadline and not stream:
                    raise RequestTimeout(f"the sidecar is alive but request {msg_id} was not "
                                         f"answered within {limit:g} s")
                until = quiet_until if stream else min(quiet_until, deadline)
                self._arrived.wait(max(0.001, until - now))

    @property
    def greeted(self) -> bool:
        """Whether this client has said hello (a request waits for one first; a chat is then
        sent without waiting for anything)."""
        return self._greeted

    def silent_for(self) -> float:
        """Seconds since the sidecar last sent this client anything (heartbeats included)."""
        return time.monotonic() - self._last_heard

    @property
    def silence_limit_s(self) -> float:
        """The silence after which a wait counts the sidecar as gone (see next_event)."""
        return max(3.0, min(self.timeout, 5.0))

    def follow(self, msg_id: int, sink: EventSink) -> None:
        """From now on, hand request ``msg_id``'s events to ``sink`` as they are filed (the
        ones already waiting first), until its ``done`` or ``error``: a reader that waits on
        an event loop needs no thread to wait for them. ``sink`` runs on whichever thread
        files the event, in this client's lock: it must only hand the event on."""
        with self._arrived:
            waiting = self._inbox.pop(msg_id, deque())
            for rtype, body in waiting:
                sink(rtype, body)
                if rtype in ("done", "error"):
                    return
            if self._closed:
                sink("error", {"code": "engine_closed", "message": "the client was closed",
                               "retryable": True})
                return
            self._followers[msg_id] = sink

    def drain(self, seconds: float = 0.1) -> None:
        """Wait ``seconds``: whatever the sidecar sends meanwhile is filed in the inbox (the
        socket's thread reads it as it arrives)."""
        time.sleep(seconds)

    def pending(self, msg_id: int) -> int:
        """Events received for ``msg_id`` and not read yet."""
        return len(self._inbox.get(msg_id, ()))

    def request(self, msg_type: str, body: dict[str, Any] | None = None, *,
                timeout: float | None = None) -> dict[str, Any]:
        """Send and wait for the ``ok`` reply; raises BridgeError for an ``error`` reply."""
        if msg_type != "hello" and not self._greeted:
            self.hello()
        for attempt in (0, 1):
            msg_id = self.send(msg_type, body)
            rtype, rbody = self.next_event(msg_id, timeout)
            self._inbox.pop(msg_id, None)
            if rtype == "ok":
                return rbody
            if rbody.get("code") == "hello_required" and attempt == 0 and msg_type != "hello":
                self.hello()  # the sidecar restarted under us: greet it and retry once
                continue
            raise BridgeError(rbody.get("code", "error"), rbody.get("message", ""),
                              bool(rbody.get("retryable")))
        raise AssertionError("unreachable")

    # --- API -----------------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        reply = self.request("hello", {k: v for k, v in self._hello_body.items()
                                       if v is not None})
        _check_identity(reply, self.expect_instance, self.expect_model)
        self._greeted = True
        return reply

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        """Poll ``stats`` until a model is loaded (the sidecar may still be starting)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                st = self.request("stats", timeout=min(2.0, self.timeout))
                if st.get("model") and not st.get("loading"):
                    return st
            except SidecarUnavailable:
                pass
            if time.monotonic() > deadline:
                raise SidecarUnavailable("the sidecar did not become ready in time")
            time.sleep(0.1)

    def load_model(self, path: str, **options: Any) -> dict[str, Any]:
        return self.request("load_model", {"path": path, **options}, timeout=max(self.timeout,
                                                                                 300.0))

    def open_session(self, system_prompt: str = "", **options: Any) -> str:
        return self.request("open_session", {"system_prompt": system_prompt, **options})[
            "session"]

    def close_session(self, session: str) -> None:
        self.request("close_session", {"session": session})

    def save_session(self, session: str, name: str) -> dict[str, Any]:
        return self.request("save_session", {"session": session, "name": name})

    def restore_session(self, name: str, session: str | None = None) -> str:
        body = {"name": name, **({"session": session} if session else {})}
        return self.request("restore_session", body)["session"]

    def set_priority(self, session: str, priority: int) -> None:
        self.request("set_priority", {"session": session, "priority": priority})

    def list_sessions(self) -> dict[str, Any]:
        return self.request("list_sessions")

    def adopt_session(self, session: str) -> str:
        return self.request("adopt_session", {"session": session})["session"]

    def goodbye(self, keep_sessions: bool = False) -> dict[str, Any]:
        """Leave now; the next request says hello again."""
        reply = self.request("goodbye", {"keep_sessions": keep_sessions})
        self._greeted = False
        return reply

    def frame(self, frame: int, frame_time_ms: float, **extra: Any) -> dict[str, Any]:
        return self.request("frame", {"frame": frame, "frame_time_ms": frame_time_ms, **extra})

    def reserve_vram(self, nbytes: int, deadline_frames: int) -> dict[str, Any]:
        return self.request("reserve_vram", {"bytes": nbytes, "deadline_frames": deadline_frames})

    def stats(self) -> dict[str, Any]:
        return self.request("stats")

    def shutdown(self) -> None:
        self.request("shutdown")

    def chat(self, session: str, text: str, **options: Any) -> ChatStream:
        if not self._greeted:
            self.hello()
        msg_id = self.send("chat", {"session": session, "text": text, **_wire_images(options)})
        return ChatStream(self, msg_id)

    # --- protocol 1.3: requests without a session ----------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = False, with_pieces: bool = False,
                 parse_special: bool = True) -> dict[str, Any]:
        """``{"tokens": [...]}`` (and ``"pieces"`` with ``with_pieces``) for the loaded model."""
        return self.request("tokenize", {"text": text, "add_special": add_special,
                                         "with_pieces": with_pieces,
                                         "parse_special": parse_special})

    def detokenize(self, tokens: list[int]) -> str:
        return str(self.request("detokenize", {"tokens": list(tokens)})["text"])

    def embed(self, inputs: str | list[str] | list[list[int]], *,
              normalize: bool = True) -> dict[str, Any]:
        """``{"data": [[float]], "tokens": int, "pooling": str}``: one vector per input (a
        text, or token ids); a single string is one input. Waits up to ``max(timeout, 600)``
        s: up to 64 inputs of up to 512 tokens are read a decode at a time, between the NPCs'
        steps (minutes of prompt reading on a CPU)."""
        items = [inputs] if isinstance(inputs, str) else list(inputs)
        return self.request("embed", {"input": items, "normalize": normalize},
                            timeout=max(self.timeout, 600.0))

    def complete(self, prompt: str | list[str | int], **options: Any) -> ChatStream:
        """Continue a raw prompt (no chat template; its text is data), streamed as
        :meth:`chat` is; a prompt may also be texts and token ids in order (the ids read as
        given). ``options``: ``max_tokens``, ``stop``, ``sampling`` (a map as open_session's),
        ``grammar``, ``json_schema``, ``priority``, ``parse_special``."""
        if not self._greeted:
            self.hello()
        return ChatStream(self, self.send("complete", {"prompt": prompt, **options}))


def _check_identity(hello: dict[str, Any], instance: str | None, model: str | None) -> None:
    """Refuse a sidecar that is not the one launched (PROTOCOL.md §8): another instance id (a
    sidecar without one answers null), or another model once one is loaded."""
    if instance is not None and hello.get("instance") != instance:
        raise WrongSidecar(f"the sidecar answering is instance {hello.get('instance')!r}, not "
                           f"{instance!r}: another program's sidecar")
    if model is not None and hello.get("model") not in (None, model):
        raise WrongSidecar(f"the sidecar answering serves {hello.get('model')!r}, not "
                           f"{model!r}")


def _wire_images(options: dict[str, Any]) -> dict[str, Any]:
    """``images=[...]`` as the wire wants them: PNG/JPEG ``bytes`` become ``{"data": ...}``;
    maps (``{"data"}`` or ``{"pixels", "width", "height", "channels"}``) and objects with
    those attributes (``runtime.ImageInput``) are sent as given."""
    images = options.get("images")
    if not images:
        return options

    def one(image: Any) -> dict[str, Any]:
        if isinstance(image, bytes | bytearray | memoryview):
            return {"data": bytes(image)}
        if isinstance(image, dict):
            return image
        if getattr(image, "data", None) is not None:
            return {"data": bytes(image.data)}
        return {"pixels": bytes(image.pixels), "width": image.width, "height": image.height,
                "channels": image.channels}

    return {**options, "images": [one(i) for i in images]}


@dataclass(frozen=True)
class ToolCall:
    """A call the reply made (protocol 1.3 ``tool_call`` event, or an entry of
    ``done.tool_calls``): ``arguments`` is JSON text of an object valid against the tool's
    parameters schema."""

    index: int
    id: str
    name: str
    arguments: str

    def args(self) -> dict[str, Any]:
        """The arguments as a dict."""
        value = json.loads(self.arguments)
        return value if isinstance(value, dict) else {}


class ChatStream:
    """Iterate for text pieces (:meth:`events` for tool calls too); ``done`` holds the final
    body; errors raise BridgeError."""

    def __init__(self, client: Client, msg_id: int) -> None:
        self.client, self.id = client, msg_id
        self.done: dict[str, Any] | None = None
        self.pieces: list[str] = []
        self.tool_calls: list[ToolCall] = []  # the calls as their events came

    def __iter__(self) -> Iterator[str]:
        for event in self.events():
            if isinstance(event, str):
                yield event

    @property
    def done_tool_calls(self) -> list[ToolCall]:
        """``done.tool_calls`` as typed calls (empty before the end, or without calls)."""
        calls = (self.done or {}).get("tool_calls") or []
        return [ToolCall(k, c["id"], c["name"], c["arguments"]) for k, c in enumerate(calls)]

    def events(self) -> Iterator[str | ToolCall]:
        """Text pieces and tool calls, in the order the sidecar sent them."""
        while self.done is None:
            rtype, body = self.client.next_event(self.id, stream=True)
            if rtype == "token":
                self.pieces.append(body["text"])
                yield body["text"]
            elif rtype == "tool_call":
                call = ToolCall(int(body["index"]), str(body["id"]), str(body["name"]),
                                str(body["arguments"]))
                self.tool_calls.append(call)
                yield call
            elif rtype == "done":
                self.done = body
            elif rtype == "error":
                self.client._inbox.pop(self.id, None)
                raise BridgeError(body.get("code", "error"), body.get("message", ""),
                                  bool(body.get("retryable")))
        self.client._inbox.pop(self.id, None)

    def result(self) -> dict[str, Any]:
        for _ in self:
            pass
        assert self.done is not None
        return self.done

    def cancel(self) -> bool:
        """Ask the sidecar to stop this reply (the stream still ends with ``done``)."""
        return bool(self.client.request("cancel", {"request": self.id}).get("cancelled"))


class AsyncClient:
    """asyncio client: ``await request(...)``; ``chat`` is an async iterator of text pieces."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:5599", *, timeout: float = 10.0,
                 engine: str = "python-asyncio", curve: dict[str, bytes] | None = None,
                 owner: str | None = None, token: str | None = None,
                 instance: str | None = None, model: str | None = None) -> None:
        """``owner``, ``token``, ``instance`` and ``model`` as for :class:`Client`."""
        self.endpoint, self.timeout = endpoint, timeout
        self.expect_instance, self.expect_model = instance, model
        self._hello_body: dict[str, Any] = {"protocol": P.PROTOCOL_VERSION, "engine": engine}
        if owner is not None:
            self._hello_body["owner"] = owner
        if token is not None:
            self._hello_body["token"] = token
        self._ctx = zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        _configure(self._sock, curve, endpoint)
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._inbox: dict[int, deque[tuple[str, dict[str, Any]]]] = defaultdict(deque)
        self._greeted = False

    def close(self) -> None:
        self._sock.close(0)

    async def _next(self, msg_id: int) -> tuple[str, dict[str, Any]]:
        deadline = time.monotonic() + self.timeout
        while not self._inbox.get(msg_id):
            left = deadline - time.monotonic()
            if left <= 0 or not await self._sock.poll(int(left * 1000), zmq.POLLIN):
                self._greeted = False
                raise SidecarUnavailable(f"no answer from the sidecar at {self.endpoint}")
            rid, rtype, body = P.decode_reply(await self._sock.recv())
            if rtype != "heartbeat":
                self._inbox[rid].append((rtype, body))
            deadline = time.monotonic() + self.timeout
        return self._inbox[msg_id].popleft()

    async def request(self, msg_type: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if msg_type != "hello" and not self._greeted:
            hello = await self.request("hello", self._hello_body)
            _check_identity(hello, self.expect_instance, self.expect_model)
            self._greeted = True
        msg_id = next(self._ids)
        await self._sock.send(P.encode(msg_id, msg_type, body or {}))
        rtype, rbody = await self._next(msg_id)
        self._inbox.pop(msg_id, None)
        if rtype != "ok":
            raise BridgeError(rbody.get("code", "error"), rbody.get("message", ""),
                              bool(rbody.get("retryable")))
        return rbody

    async def chat(self, session: str, text: str, **options: Any):
        if not self._greeted:
            await self.request("ping")
        msg_id = next(self._ids)
        await self._sock.send(P.encode(msg_id, "chat", {"session": session, "text": text,
                                                       **_wire_images(options)}))
        while True:
            rtype, body = await self._next(msg_id)
            if rtype == "token":
                yield body["text"]
            elif rtype == "done":
                self._inbox.pop(msg_id, None)
                return
            elif rtype == "error":
                self._inbox.pop(msg_id, None)
                raise BridgeError(body.get("code", "error"), body.get("message", ""),
                                  bool(body.get("retryable")))
