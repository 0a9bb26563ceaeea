"""The sidecar's rules, transport-free: one :class:`SessionService` that both faces call.

Everything a client may do and hold lives here: hello and identity (who is the game), owner
keys, leases and orphans, the caps on clients, sessions, streams and image bytes, stream logs
for ``resume_stream``, saves, ``reserve_vram``, ``frame``, ``stats``, ``shutdown`` and the
game-PID watch. It knows no sockets: a request comes in as the bytes of one protocol message
from a peer (an opaque identity), and everything it answers goes out through its
:class:`Transport` (``send(identity, frame)``) in the same wire format, so both faces speak the
contract its golden vectors pin. The ZeroMQ face (``serving/server.py``) is one transport; the
HTTP face's in-process connection (``Server.connect_local``) is another, with no socket hop.

One thread owns the service (the ZeroMQ face's serving thread): ``handle``, ``heartbeat`` and
``run_completions`` run there only. Model work goes to the backend as futures, whose results
come back onto that thread through ``_later`` (a queue, and ``Transport.wake``), so the
per-client bookkeeping has one owner and no locks.
"""

from __future__ import annotations

import hmac
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from igi_sdk.errors import IgiError, coded_error, save_io_error
from igi_sdk.serving import oneshot, tool_results
from igi_sdk.serving.answers import ok_frame as _ok
from igi_sdk.serving.answers import typed as _typed
from igi_sdk.serving.backend import Backend, ChatResult
from igi_sdk.serving.clients import Client, ImageBytes, make_room, slot_cap, stream_cap
from igi_sdk.serving.game_process import alive, is_ancestor
from igi_sdk.serving.ownership import (
    LEGACY_SCOPE,
    RESUME_KEEP_S,
    Sessions,
    StreamLog,
    connection_scope,
    engine_id,
    key_scope,
    prune_logs,
)
from igi_sdk.serving.streaming import stream_reply
from igi_sdk.wire import contract as C
from igi_sdk.wire import protocol as P

log = logging.getLogger("igi_sdk.serving")

_T = TypeVar("_T")
_SESSION_SUFFIX = ".igisession"
# under the save folder: the saves of clients other than the game, a folder per owner scope
_OWNERS_DIR = "owners"
PID_POLL_S = 0.25  # how often the game-PID watch looks (PROTOCOL.md §10)
MAX_RESTORES_WAITING = 16  # per save name: restores queued behind its save in flight


@dataclass
class ServerConfig:
    endpoint: str = "tcp://127.0.0.1:5599"
    model_dir: Path = field(default_factory=Path.cwd)
    save_dir: Path | None = None  # default: <model_dir>/sessions
    model: str | None = None  # loaded at start (relative to model_dir or absolute inside it)
    mmproj: str | None = None  # the start model's vision projector (like ``model``)
    n_ctx: int = 4096
    max_sessions: int = 8
    # None: every slot for the game, half of them (rounded up) for any other client
    max_sessions_per_client: int | None = None
    max_streams_per_client: int = 4
    max_clients: int = 64  # connected clients (hello'd); silent ones holding nothing go first
    # image bytes of chats not yet ended, per client and in all: what a flood of large
    # images can make the sidecar hold
    max_image_bytes_per_client: int = 2 * P.MAX_IMAGE_BYTES + (8 << 20)  # 40 MiB
    max_image_bytes: int = 96 << 20
    max_reservations: int = 16  # reserve_vram requests in flight
    heartbeat_s: float = 1.0
    orphan_ttl_s: float = 300.0  # an orphaned session waits this long for adoption
    game_pid: int | None = None
    curve_secret_file: Path | None = None  # server key pair (zmq.auth certificate)
    curve_clients_dir: Path | None = None  # allowed client public certificates
    # the launch token (IGI_SDK_TOKEN of the process that started the sidecar): the client that
    # presents it is the game. None: every client is (a developer's sidecar).
    launch_token: str | None = None
    # who launched this sidecar, for whom (``serve --instance``): not a secret — hello echoes
    # it, so a client can tell its own sidecar from another one answering on that endpoint
    instance: str | None = None


class Transport(Protocol):
    """How the service reaches its peers (a face)."""

    def send(self, identity: bytes, frame: bytes) -> None:
        """Deliver one protocol message to peer ``identity`` (the service's thread)."""
        ...

    def wake(self) -> None:
        """Have the service's thread call ``run_completions`` soon (any thread, after it queued
        a completion: a wake may stand for every completion queued before it is taken)."""
        ...

    def stop(self) -> None:
        """The sidecar stops serving (any thread): shutdown, or the game is gone."""
        ...

    def figures(self) -> dict[str, Any]:
        """The transport's own counters for ``stats`` (``flood_cuts``, ``receive_queue``)."""
        ...


class SessionService:
    def __init__(self, config: ServerConfig, backend: Backend, transport: Transport) -> None:
        self.cfg = config
        self.backend = backend
        self.transport = transport
        self.model_dir = config.model_dir.resolve()
        self.save_dir = (config.save_dir or self.model_dir / "sessions").resolve()
        self.model_name: str | None = None
        self.loading = False
        self.clients: dict[bytes, Client] = {}
        self.sessions = Sessions()
        self.model_slots = config.max_sessions  # session slots of the loaded model
        self._ignored: tuple[str, ...] = ()  # unknown fields of the request being handled
        self.stopping = threading.Event()
        self.requests = 0  # frames received, valid or not
        # when heartbeat() last ran (monotonic); from the start, so that a stop before the first
        # beat is seen too (a first beat long after a slow start only renews every lease)
        self._last_beat = time.monotonic()
        self.errors = 0  # error replies sent (stream errors not counted)
        self.started = time.time()
        self.last_frame: P.Frame | None = None
        self.reservations: list[P.ReserveVram] = []
        self._reserving = 0  # reserve_vram requests not yet answered
        self.images = ImageBytes(config.max_image_bytes_per_client, config.max_image_bytes)
        self.latency = _Latency()
        # work that finished on another thread, to be finished here (the service's thread)
        self._completions: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._pid_watch: int | None = None
        # saves being written: _save_key(folder, name) -> (name, how many)
        self._saving: dict[str, tuple[str, int]] = {}
        # restores of a name whose save is still being written, run when the saves end (so a
        # save, then a restore of it, works even from another connection)
        self._after_saves: dict[str, list[Callable[[], None]]] = {}

    def start(self) -> None:
        """Load the model named at start and watch the game named at start; a sidecar that
        cannot load its model, or whose game is not running, fails here (typed)."""
        if self.cfg.model:
            body = P.LoadModel(path=self.cfg.model, n_ctx=self.cfg.n_ctx,
                               max_sessions=self.cfg.max_sessions, mmproj=self.cfg.mmproj)
            try:
                mmproj = self._resolve_model(body.mmproj) if body.mmproj else None
                self.backend.load_model(self._resolve_model(body.path), body, mmproj=mmproj)
                self.model_name = self.backend.model_name
            except P.ProtocolError as e:
                raise coded_error(e.code, e.message) from None
        if self.cfg.game_pid:
            if not alive(self.cfg.game_pid):
                raise IgiError(f"the game process {self.cfg.game_pid} (--game-pid) is not "
                               "running")
            self._watch(self.cfg.game_pid)

    def close(self) -> None:
        self.stopping.set()
        try:
            self.backend.close()
        except Exception:
            log.exception("backend close failed")

    def _send(self, identity: bytes, frame: bytes) -> None:
        self.transport.send(identity, frame)

    def run_completions(self) -> None:
        while True:
            try:
                finish = self._completions.get_nowait()
            except queue.Empty:
                return
            try:
                finish()
            except Exception:
                log.exception("finishing a request failed")

    def _send_logged(self, identity: bytes, log: StreamLog, frame: bytes) -> None:
        """Send a stream's token event and keep it for ``resume_stream`` (service thread)."""
        log.tokens.append(frame)
        self._send(identity, frame)

    def later(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the service thread soon (any thread may call this)."""
        self._completions.put(fn)
        self.transport.wake()

    def heartbeat(self) -> None:
        now = time.monotonic()
        # the sidecar was frozen (SIGSTOP, a debugger, a swap storm) if its own beats stopped:
        # that time is its silence, not the clients', so every lease starts again now. A
        # monotonic clock runs on while a process is stopped, and a 20 s stop cost every client
        # with a 15 s lease its sessions (hello_required).
        frozen = now - self._last_beat > max(3 * self.cfg.heartbeat_s, 2.0)
        self._last_beat = now
        for ident, c in list(self.clients.items()):
            if frozen or c.streams:
                # a client waiting for its own reply is alive, sending or not (a plugin may
                # say nothing while it reads a long reply): its lease counts from the end
                c.last_seen = max(c.last_seen, now)
            silent = now - c.last_seen
            if c.local:  # in this process: no lease to lapse, but its idle sessions end
                self._end_idle(c, now)
                silent = 0.0  # (heartbeats still go to it: its waits count on them)
            # a 1.0 client knows no leases but must not hold slots forever: the longest one
            lease = c.lease_s if c.minor >= 1 else P.MAX_LEASE_S
            if silent > lease:
                log.info("client %s silent for %.1f s: lease lapsed", c.name or ident.hex(),
                         silent)
                self._forget(c, keep_sessions=True)
                continue
            if (c.minor == 0 and silent > self.cfg.heartbeat_s * 30 and not c.streams
                    and not self.sessions.owned(ident) and not c.opening):
                del self.clients[ident]  # a 1.0 client, silent, holding nothing: forget it
                continue
            prune_logs(c.logs)
            self._send(ident, P.encode(0, "heartbeat", C.Heartbeat(t=time.time()).wire()))
        for sid in self.sessions.expired(self.cfg.orphan_ttl_s):
            self._close_orphan(sid)

    def _end_idle(self, c: Client, now: float) -> None:
        """The orphan rule for a peer that never leaves (the HTTP face): a session idle for
        ``orphan_ttl_s`` is closed, as an orphan would be (its transcript opens it anew)."""
        for sid in self.sessions.idle(c.identity, now - self.cfg.orphan_ttl_s):
            log.info("closing session %s: idle for %.0f s", sid, self.cfg.orphan_ttl_s)
            self._close_orphan(sid)

    def _forget(self, c: Client, *, keep_sessions: bool) -> tuple[int, int]:
        """The client is gone: its streams stop and its sessions are closed or orphaned.
        Returns (closed, orphaned)."""
        for rid, handle in c.streams.items():
            if handle is not None:
                handle.cancel()
            else:
                c.cancel_pending.add(rid)
        owned = self.sessions.owned(c.identity)
        for sid in owned:
            if keep_sessions:
                self.sessions.orphan(sid)
            else:
                self._close_orphan(sid)
        self.clients.pop(c.identity, None)
        return (0, len(owned)) if keep_sessions else (len(owned), 0)

    def _close_orphan(self, sid: str) -> None:
        self.sessions.drop(sid)
        fut = self.backend.close_session(sid)

        def told(f: Future[None]) -> None:
            if f.exception() is not None:
                log.info("closing session %s: %s", sid, f.exception())

        fut.add_done_callback(told)

    # --- requests ------------------------------------------------------------------------------

    def handle(self, identity: bytes, frame: bytes, *, local: bool = False) -> None:
        """One message from peer ``identity`` (``local``: a peer in this process, the HTTP
        face: it has no lease to lapse, and its idle sessions end by the orphan rule)."""
        t0 = time.perf_counter()
        self.requests += 1
        try:
            req = P.parse_request(frame)
        except P.EnvelopeError as e:
            self._error(identity, e.msg_id, e)
            return
        except Exception as e:  # noqa: BLE001 - no message may stop the service thread
            self._error(identity, 0, _typed(e, "request"))
            return
        msg_id, msg_type, body, self._ignored = req.id, req.type, req.body, req.ignored
        client = self.clients.get(identity)
        if client is not None:
            client.last_seen = time.monotonic()
        try:
            if msg_type == "hello":
                reply = self._hello(identity, body, local)  # type: ignore[arg-type]
            elif client is None:
                raise P.ProtocolError("hello_required", "say hello first (protocol version)",
                                      retryable=True)
            else:
                handler = getattr(self, f"_on_{msg_type}")
                reply = handler(client, msg_id, body)
        except Exception as e:  # noqa: BLE001 - every failure is answered, typed
            self._error(identity, msg_id, _typed(e, msg_type))
            return
        if reply is not None:
            self._send(identity, _ok(msg_id, reply, self._ignored))
        self.latency.note(msg_type, time.perf_counter() - t0)

    def _error(self, identity: bytes, msg_id: int, e: P.ProtocolError) -> None:
        self.errors += 1
        body = C.ErrorBody(code=e.code, message=self._private_paths(e.message),
                           retryable=e.retryable)
        self._send(identity, P.encode(msg_id, "error", body.wire()))

    def _private_paths(self, message: str) -> str:
        """``message`` with the sidecar's own directories written relative: where the player's
        files live is nobody else's business (a load error names the file it read)."""
        for root in (self.save_dir, self.model_dir):
            message = message.replace(f"{root}{os.sep}", "").replace(str(root), ".")
        return message

    def _answer(self, identity: bytes, msg_id: int, fut: Future[_T], msg_type: str,
                ok: Callable[[_T], C.Answer],
                failed: Callable[[], None] | None = None) -> None:
        """Reply to ``msg_id`` when ``fut`` ends: ``ok(result)`` runs on the service thread."""
        ignored = self._ignored

        def finish(f: Future[_T]) -> None:
            try:
                frame = _ok(msg_id, ok(f.result()), ignored)
            except Exception as e:  # noqa: BLE001 - every failure is answered, typed
                if failed is not None:
                    failed()
                self._error(identity, msg_id, _typed(e, msg_type))
                return
            self._send(identity, frame)

        fut.add_done_callback(lambda f: self.later(lambda: finish(f)))

    def _hello(self, identity: bytes, body: P.Hello, local: bool = False) -> C.HelloOk:
        token = self.cfg.launch_token
        given = body.token or None  # "" is no token: engines without nil send it for "none"
        if token is not None and given is not None and not hmac.compare_digest(
                given.encode(), token.encode()):
            raise P.ProtocolError("forbidden", "that is not this sidecar's launch token")
        game = token is None or given is not None
        legacy = body.minor < 2  # 1.0 and 1.1: no owner keys, no launch token in their hello
        if legacy and not game:
            # 1.1's rules let any client adopt any orphaned session and shut the sidecar down;
            # kept for a client that cannot prove it is the game, they would hand the game's
            # NPCs and lifetime to any local process. Refused, typed, rather than served under
            # other rules than the ones it was written for.
            raise P.ProtocolError(
                "unsupported_version", f"this sidecar was started with a launch token: a client "
                f"of protocol 1.{body.minor} cannot present it (hello.token is 1.2), and 1.1's "
                "shared sessions would be open to any local process; say hello as 1.2 "
                "(minor 2, with the token to be the game)")
        if body.owner:
            scope = key_scope(body.owner)
        else:
            scope = LEGACY_SCOPE if legacy else connection_scope(identity)
        c = self.clients.get(identity)
        if c is None:
            held = {info.owner for info in self.sessions.by_id.values() if info.owner}
            make_room(self.clients, self.cfg.max_clients, held)
            c = self.clients[identity] = Client(identity)
        elif c.scope != scope and self.sessions.owned(identity):
            raise P.ProtocolError("invalid_state", "this connection holds sessions of another "
                                  "owner key: say goodbye (or close them) first")
        c.name, c.engine, c.last_seen = body.client_name, body.engine, time.monotonic()
        c.minor = body.minor
        # a 1.0 client knows no leases: it is under the longest one, and hello says so; a 1.1
        # client is granted what 1.1 granted (it is the game, see above)
        c.lease_s = (P.MAX_LEASE_S if body.minor == 0
                     else body.lease_s if legacy else min(body.lease_s, P.MAX_LEASE_S))
        c.scope, c.game = scope, game
        c.local = local
        # only the game that launched this sidecar may bind its lifetime (or --game-pid): a
        # stranger's PID — or a dead one, PID 1 or this process — must not be able to shut it
        # down for everyone, or to switch the watch off
        pid = body.game_pid
        if (pid and c.game and self._pid_watch is None and pid not in (1, os.getpid())
                and alive(pid) and is_ancestor(pid)):
            self._watch(pid)
        return C.HelloOk(
            protocol=P.PROTOCOL_VERSION, minor=P.PROTOCOL_MINOR, features=list(P.FEATURES),
            lease_s=c.lease_s, game=c.game,
            owner="key" if body.owner else "shared" if scope == LEGACY_SCOPE else "connection",
            model=self.model_name, loading=self.loading, instance=self.cfg.instance,
            limits=C.Limits(
                max_message_bytes=P.MAX_MESSAGE_BYTES, max_text_chars=P.MAX_TEXT_CHARS,
                max_tokens=P.MAX_TOKENS, max_sessions_per_client=self._client_cap(c),
                max_streams_per_client=stream_cap(c, self._slots(),
                                                  self.cfg.max_streams_per_client)))

    def _on_ping(self, c: Client, msg_id: int, body: P.Empty) -> C.PingOk:
        return C.PingOk(t=time.time())

    def _need_model(self) -> None:
        if self.model_name is None:
            if self.loading:
                raise P.ProtocolError("loading", "the model is still loading", retryable=True)
            raise P.ProtocolError("no_model", "no model is loaded; send load_model first")

    def _resolve_model(self, path: str) -> Path:
        try:
            candidate = (self.model_dir / path).resolve()
        except (ValueError, OSError, RuntimeError):  # NUL bytes, symlink loops (RuntimeError
            # before Python 3.13): not a path we will open
            raise P.ProtocolError("forbidden_path", "not a valid model path") from None
        if not candidate.is_relative_to(self.model_dir):
            raise P.ProtocolError("forbidden_path", f"'{path}' is outside the model directory")
        try:
            found = candidate.is_file()
        except OSError:  # a name too long for the file system, say
            found = False
        if not found:
            raise P.ProtocolError("model_not_found", f"no model file '{path}' in the model "
                                                     "directory")
        return candidate

    def _on_load_model(self, c: Client, msg_id: int, body: P.LoadModel) -> None:
        self._game_only(c, "load a model (it closes every client's sessions)")
        if self.loading:
            raise P.ProtocolError("loading", "a model is already loading", retryable=True)
        path = self._resolve_model(body.path)  # refuse bad paths synchronously
        draft = self._resolve_model(body.draft) if body.draft is not None else None
        mmproj = self._resolve_model(body.mmproj) if body.mmproj is not None else None
        self.loading = True
        self.model_name = None  # the old model goes away first
        done: Future[C.LoadModelOk] = Future()

        def load() -> None:  # on a loading thread: the reply crosses to the service thread typed
            try:
                done.set_result(C.LoadModelOk.model_validate(
                    self.backend.load_model(path, body, draft, mmproj)))
            except BaseException as e:  # noqa: BLE001 - answered as a typed error
                done.set_exception(e)

        def loaded(reply: C.LoadModelOk) -> C.LoadModelOk:
            self._model_changed()
            self.model_slots = body.max_sessions
            return reply

        self._answer(c.identity, msg_id, done, "load_model", loaded, failed=self._model_changed)
        threading.Thread(target=load, daemon=True, name="igi-load").start()
        return None  # answered when the load finishes

    def _model_changed(self) -> None:
        """A load ended (either way): the old model's sessions are gone with it."""
        self.loading = False
        self.model_name = self.backend.model_name
        self.sessions.clear()

    def _client_cap(self, c: Client) -> int:
        return slot_cap(c, self._slots(), self.cfg.max_sessions_per_client)

    def _below_client_cap(self, c: Client) -> None:
        held = len(self.sessions.owned(c.identity)) + c.opening
        if held >= self._client_cap(c):
            raise P.ProtocolError("too_many_sessions", f"this client already has {held} "
                                  "sessions; close one first", retryable=True)

    def _slots(self) -> int:
        """Session slots in all: the loaded model's, and an upstream's beyond them."""
        return self.backend.session_slots(self.model_slots)

    def _slots_taken(self) -> int:
        """Session slots of the model held by open, orphaned and opening sessions."""
        return len(self.sessions) + sum(other.opening for other in self.clients.values())

    def _session_room(self, c: Client) -> None:
        """Refuse past the client's cap; make room in the model by closing the longest-waiting
        orphan when every slot is taken (the engine runs the close before the open)."""
        self._below_client_cap(c)
        if self._slots_taken() < self._slots():
            return
        orphans = self.sessions.orphans()
        if orphans:
            log.info("closing orphaned session %s to make room", orphans[0])
            self._close_orphan(orphans[0])
            return
        if c.game:  # the game's line comes first: the least recently used idle session of a
            # client that is not the game (a mod) makes way; its owner opens it anew
            strangers = {ident for ident, other in self.clients.items() if not other.game}
            victim = self.sessions.least_recent_idle(strangers)
            if victim is None:  # the face may hold every slot: its least recent one goes,
                # replying or not (its HTTP client is answered 503 and sends again)
                faces = {ident for ident in strangers if self.clients[ident].local}
                victim = self.sessions.least_recent(faces)
            if victim is not None:
                log.info("closing session %s of another client: the game needs its slot",
                         victim)
                self._close_orphan(victim)

    def _name_free(self, c: Client, name: str | None) -> None:
        """Refuse a name taken in ``c``'s scope (other scopes' names are not seen at all)."""
        if name is None or (c.scope, name) not in self.sessions:
            return
        sid = self.sessions.find(c.scope, name)
        hint = (": adopt it with adopt_session, or choose another name"
                if sid is not None and self.sessions.owner_of(sid) is None
                else "; choose another name")
        raise P.ProtocolError("session_exists", f"a session named '{name}' exists{hint}")

    def _on_open_session(self, c: Client, msg_id: int, body: P.OpenSession) -> None:
        self._need_model()
        self._name_free(c, body.name)
        self._session_room(c)
        name = body.name
        if name is not None:
            body = body.model_copy(update={"name": engine_id(c.scope, name)})
        self._answer_session(c, msg_id, self.backend.open_session(body), "open_session",
                             name, body.persona, tool_results.of_history(body.history))

    def _answer_session(self, c: Client, msg_id: int, fut: Future[str], msg_type: str,
                        name: str | None = None, persona: str = "",
                        calls: tool_results.Calls = None) -> None:
        """Answer an open/restore with the new session, which counts against the client's cap
        (and holds its name in its scope) from now until the answer. ``name`` is the wire
        name (None: the engine's id is the name); ``calls``: those of its last reply, which
        its first line's results may answer (None: not known, as for a restored session)."""
        c.opening += 1
        scoped = (c.scope, name) if name is not None else None
        if scoped is not None:
            self.sessions.naming.add(scoped)

        def settled() -> None:
            c.opening -= 1
            if scoped is not None:
                self.sessions.naming.discard(scoped)

        def opened(sid: str) -> C.SessionOk:
            settled()
            wire = name if name is not None else sid
            self.sessions.add(sid, c.identity, c.scope, wire, persona, calls)
            if self.clients.get(c.identity) is not c:  # it left meanwhile: adoptable
                self.sessions.orphan(sid)
            return C.SessionOk(session=wire)

        self._answer(c.identity, msg_id, fut, msg_type, opened, settled)

    def _owned(self, c: Client, name: str) -> str:
        """The engine id of ``c``'s session ``name``."""
        sid = self.sessions.find(c.scope, name)
        if sid is None or self.sessions.owner_of(sid) != c.identity:
            raise P.ProtocolError("unknown_session", f"no session '{name}' for this client")
        return sid

    def _on_chat(self, c: Client, msg_id: int, body: P.Chat) -> None:
        self._need_model()
        body = body.model_copy(update={"session": self._owned(c, body.session)})
        if msg_id in c.streams:
            # answered with id 0: an error carrying this id would read as the end of the stream
            # that is still running under it
            self._error(c.identity, 0, P.ProtocolError(
                "duplicate_id", f"request id {msg_id} is already streaming; this chat was "
                "ignored and that stream goes on"))
            return None
        if len(c.streams) >= stream_cap(c, self._slots(), self.cfg.max_streams_per_client):
            raise P.ProtocolError("busy", f"{len(c.streams)} replies are already streaming for "
                                  "this client; wait for one to finish", retryable=True)
        sid = body.session
        info = self.sessions.by_id[sid]
        # the results answer the last reply's calls: the session's, or its new history's
        calls = info.calls if body.history is None else tool_results.of_history(body.history)
        tool_results.check(body.tool_results, calls)
        images = sum(len(i.data or i.pixels or b"") for i in body.images)
        self.images.take(c, images)
        self.sessions.reply_started(sid)

        def released() -> None:  # on the service thread, once
            self.sessions.reply_ended(sid)
            self.images.give_back(c, images)

        def answered(result: ChatResult) -> None:  # on the service thread
            info.calls = tool_results.after_reply(calls, result)

        stream_reply(self, c, msg_id, "chat", lambda listener: self.backend.chat(body, listener),
                     released, answered)
        return None  # the stream answers

    # --- 1.3: requests without a session (serving/oneshot.py) -------------------------------

    def _on_tokenize(self, c: Client, msg_id: int, body: P.Tokenize) -> None:
        oneshot.tokenize(self, c, msg_id, body)

    def _on_detokenize(self, c: Client, msg_id: int, body: P.Detokenize) -> None:
        oneshot.detokenize(self, c, msg_id, body)

    def _on_embed(self, c: Client, msg_id: int, body: P.Embed) -> None:
        oneshot.embed(self, c, msg_id, body)

    def _on_complete(self, c: Client, msg_id: int, body: P.Complete) -> None:
        oneshot.complete(self, c, msg_id, body)

    def _on_cancel(self, c: Client, msg_id: int, body: P.Cancel) -> C.CancelOk:
        known = body.request in c.streams
        handle = c.streams.get(body.request)
        if handle is not None:
            handle.cancel()
        elif known:  # the reply has not started yet: cancelled as soon as it does
            c.cancel_pending.add(body.request)
        return C.CancelOk(cancelled=known)

    def _on_close_session(self, c: Client, msg_id: int, body: P.SessionRef) -> None:
        self._need_model()
        sid = self._owned(c, body.session)

        def closed(_: None) -> C.EmptyOk:
            self.sessions.drop(sid)
            return C.EmptyOk()

        self._answer(c.identity, msg_id, self.backend.close_session(sid), "close_session",
                     closed)

    def _saves_of(self, c: Client) -> Path:
        """Where ``c``'s saves are: the game's in the save folder itself; another client's
        under its owner key's scope (a connection's own, without one). A save belongs to its
        owner as a session does: no other owner can restore, overwrite or even find it (a mod
        restored the game's save by guessing its name and read what the NPC was told)."""
        return self.save_dir if c.game else self.save_dir / _OWNERS_DIR / c.scope

    def _find_save(self, folder: Path, name: str) -> tuple[bool, str | None]:
        """Whether save ``name`` exists in ``folder`` (exactly), and the name of a save there
        that differs from it only in case (one file on Windows and macOS: such names are
        refused everywhere)."""
        wanted = (name + _SESSION_SUFFIX).lower()
        exact, other = False, None
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if entry.name.lower() == wanted:
                        if entry.name == name + _SESSION_SUFFIX:
                            exact = True
                        else:
                            other = entry.name[:-len(_SESSION_SUFFIX)]
        except FileNotFoundError:
            pass
        except OSError as e:
            raise save_io_error(e, name, "list") from None
        return exact, other

    def _on_save_session(self, c: Client, msg_id: int, body: P.SaveSession) -> None:
        self._need_model()
        sid = self._owned(c, body.session)
        folder = self._saves_of(c)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise save_io_error(e, body.name) from None
        _, other = self._find_save(folder, body.name)
        key = _save_key(folder, body.name)
        pending = self._saving.get(key)
        if other is None and pending and pending[0] != body.name:
            other = pending[0]
        if other is not None:
            raise P.ProtocolError("save_name_conflict", f"there is a saved session '{other}': "
                                  f"'{body.name}' differs from it only in case, which Windows "
                                  "and macOS cannot tell apart; use that name or another one")

        def ended() -> None:
            name, count = self._saving.pop(key)
            if count > 1:
                self._saving[key] = (name, count - 1)
                return
            for waiting in self._after_saves.pop(key, []):
                waiting()

        def saved(n: int) -> C.SaveSessionOk:
            ended()
            return C.SaveSessionOk(name=body.name, bytes=int(n))

        path = folder / (body.name + _SESSION_SUFFIX)
        fut = self.backend.save_session(sid, path)
        # counted until the save ends (it ends on this thread, so not before this line)
        self._saving[key] = (body.name, pending[1] + 1 if pending else 1)
        self._answer(c.identity, msg_id, fut, "save_session", saved, ended)

    def _on_restore_session(self, c: Client, msg_id: int, body: P.RestoreSession) -> None:
        self._need_model()
        folder = self._saves_of(c)
        key = _save_key(folder, body.name)
        if key in self._saving:  # read what the save in flight writes, once it is written
            waiting = self._after_saves.setdefault(key, [])
            if len(waiting) >= MAX_RESTORES_WAITING:
                raise P.ProtocolError("busy", f"{len(waiting)} restores of '{body.name}' wait "
                                      "for its save already; retry when it ends", retryable=True)

            def later() -> None:
                try:
                    self._on_restore_session(c, msg_id, body)
                except Exception as e:  # noqa: BLE001 - answered, typed, as on arrival
                    self._error(c.identity, msg_id, _typed(e, "restore_session"))

            waiting.append(later)
            return
        self._name_free(c, body.session)
        self._session_room(c)
        exact, other = self._find_save(folder, body.name)
        if not exact:
            hint = f" (names are case-sensitive: there is '{other}')" if other else ""
            raise P.ProtocolError("unknown_save", f"no saved session '{body.name}'{hint}")
        path = folder / (body.name + _SESSION_SUFFIX)
        sid = engine_id(c.scope, body.session) if body.session is not None else None
        self._answer_session(c, msg_id, self.backend.restore_session(path, sid),
                             "restore_session", body.session)

    # --- protocol 1.1: leaving, listing, adopting, priorities, resuming ---------------------

    def _on_goodbye(self, c: Client, msg_id: int, body: P.Goodbye) -> C.GoodbyeOk:
        closed, orphaned = self._forget(c, keep_sessions=body.keep_sessions)
        return C.GoodbyeOk(closed=closed, orphaned=orphaned)

    def _on_list_sessions(self, c: Client, msg_id: int, body: P.Empty) -> C.ListSessionsOk:
        live = self.backend.session_info()
        now, others = time.monotonic(), 0
        listed: list[C.SessionListing] = []
        for sid, info in list(self.sessions.by_id.items()):
            # another scope's sessions are counted, never named; a connection of the same
            # owner key holding one is "other" too
            if info.scope != c.scope or info.owner not in (None, c.identity):
                others += 1
                continue
            figures = live.get(sid)  # None: closed by the engine since the table was read
            listed.append(C.SessionListing(
                session=info.name, owner="you" if info.owner == c.identity else "orphaned",
                persona=info.persona, priority=figures["priority"] if figures else 0,
                busy=figures["busy"] if figures else False,
                tokens=figures["tokens"] if figures else 0,
                max_tokens=figures.get("max_tokens") if figures else None,
                memory=figures.get("memory") if figures else None,  # type: ignore[arg-type]
                dropped_turns=figures.get("dropped_turns") if figures else None,
                idle_s=round(now - info.since, 3)))
        free = max(0, self._slots() - self._slots_taken())
        # orphans are held, but the next open_session or restore_session closes one (the
        # longest-waiting) when no slot is free: slots a newcomer can get are free + reclaimable
        return C.ListSessionsOk(sessions=listed, free_slots=free, others=others,
                                reclaimable=len(self.sessions.orphans()))

    def _on_adopt_session(self, c: Client, msg_id: int, body: P.SessionRef) -> C.SessionOk:
        name = body.session
        sid = self.sessions.find(c.scope, name)  # only the client's own scope: a stranger
        if sid is None:  # can neither take another's session nor learn that it exists
            raise P.ProtocolError("unknown_session", f"no session '{name}' of this owner")
        owner = self.sessions.owner_of(sid)
        if owner == c.identity:
            return C.SessionOk(session=name)
        if owner is not None:
            raise P.ProtocolError("session_owned", f"session '{name}' belongs to a connected "
                                  "client of this owner; it can be adopted once that client "
                                  "leaves")
        self._below_client_cap(c)
        self.sessions.adopt(sid, c.identity)
        return C.SessionOk(session=name)

    def _on_set_priority(self, c: Client, msg_id: int, body: P.SetPriority) -> C.EmptyOk:
        self._need_model()
        self.backend.set_priority(self._owned(c, body.session), body.priority)
        return C.EmptyOk()

    def _on_resume_stream(self, c: Client, msg_id: int, body: P.ResumeStream) -> None:
        events = c.logs.get(body.request)
        if events is None:
            raise P.ProtocolError("unknown_stream", f"no stream {body.request} to resume "
                                  f"(unknown, or ended more than {RESUME_KEEP_S:g} s ago)")
        frames = events.replay(body.after)
        running = events.terminal is None
        self._send(c.identity, _ok(msg_id, C.ResumeStreamOk(
            running=running, replayed=len(frames)), self._ignored))
        for frame in frames:
            self._send(c.identity, frame)
        return None  # answered above, before the events it announces

    def _on_frame(self, c: Client, msg_id: int, body: P.Frame) -> C.FrameOk:
        if not c.game:  # pacing and the game's VRAM figures are the game's to report
            return C.FrameOk(paced=False)
        self.last_frame = body
        self.backend.frame(c.identity.hex(), body)
        # a report paces the engine only with a target to pace against; without one it feeds
        # the arbiter and stats alone (PROTOCOL.md `frame`)
        return C.FrameOk(paced=body.target_frame_time_ms is not None)

    def _game_only(self, c: Client, what: str) -> None:
        if not c.game:
            raise P.ProtocolError("forbidden", f"only the game that launched this sidecar (the "
                                  f"client holding its launch token) may {what}")

    def _on_reserve_vram(self, c: Client, msg_id: int, body: P.ReserveVram) -> None:
        self._game_only(c, "reserve VRAM")
        if self._reserving >= self.cfg.max_reservations:
            raise P.ProtocolError("busy", f"{self._reserving} VRAM reservations are waiting; "
                                  "ask again when one is answered", retryable=True)
        self.reservations.append(body)
        del self.reservations[:-16]
        done: Future[None] = Future()
        self._reserving += 1

        def ended(error: Exception | None) -> None:  # any thread, exactly once
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def answered() -> None:
            self._reserving -= 1

        def granted(_: None) -> C.ReserveVramOk:
            answered()
            return C.ReserveVramOk(recorded=True, acknowledged=True, granted=True)

        self._answer(c.identity, msg_id, done, "reserve_vram", granted, answered)
        self.backend.reserve_vram(body, ended)
        return None  # answered when granted, or with cannot_free / deadline_missed

    def _on_stats(self, c: Client, msg_id: int, body: P.Empty) -> C.StatsOk:
        model = self.backend.status()
        # the model side's figures (pacing_delay_s; sessions, plan, memory, reshards, engine
        # while a model is loaded; arbiter while it runs) are validated into their fields
        return C.StatsOk.model_validate({
            "model": self.model_name, "loading": self.loading, "clients": len(self.clients),
            "uptime_s": time.time() - self.started, "requests": self.requests,
            "errors": self.errors, "last_frame": self.last_frame,
            "reservations": self.reservations[-4:],
            "control_latency_ms": self.latency.summary(),
            "orphaned_sessions": len(self.sessions.orphans()), "limits": self._limits(model),
            "watching_pid": self._pid_watch, "launch_token": self.cfg.launch_token is not None,
            **self.transport.figures(), **model})

    def _limits(self, model: dict[str, Any]) -> dict[str, int]:
        """What one request may ask (``stats.limits``), ``model``: the backend's status."""
        out = {"max_tokens": P.MAX_TOKENS, "max_text_chars": P.MAX_TEXT_CHARS,
               "max_message_bytes": P.MAX_MESSAGE_BYTES, "session_slots": self._slots()}
        engine = model.get("engine")
        context = engine.get("context") if isinstance(engine, dict) else None
        n_ctx = context.get("n_ctx") if isinstance(context, dict) else None
        if isinstance(context, dict) and isinstance(n_ctx, int):
            out["n_ctx"] = n_ctx
            most = context.get("max_per_session")
            out["n_ctx_per_session"] = most if isinstance(most, int) else n_ctx
        return out

    def _on_shutdown(self, c: Client, msg_id: int, body: P.Empty) -> C.EmptyOk:
        self._game_only(c, "shut it down")
        self.transport.stop()  # after the reply below is sent
        return C.EmptyOk()

    # --- helpers -----------------------------------------------------------------------------

    def _watch(self, pid: int) -> None:
        if self._pid_watch is not None:
            return
        self._pid_watch = pid
        threading.Thread(target=self._watch_pid, args=(pid,), daemon=True,
                         name="igi-pid-watch").start()

    def _watch_pid(self, pid: int) -> None:
        """The sidecar must not outlive the game: it sees the process gone within
        PID_POLL_S and then stops as ``shutdown`` does (PROTOCOL.md §10 gives the bound)."""
        while not self.stopping.is_set():
            if not alive(pid):
                log.warning("game process %d is gone; shutting down", pid)
                self.transport.stop()
                return
            self.stopping.wait(PID_POLL_S)


class _Latency:
    """How long the service thread took to answer each request type (ms): p50, p99, max over
    the last 2048 of each — the control plane's own measure of staying responsive."""

    def __init__(self) -> None:
        self._seen: dict[str, list[float]] = {}

    def note(self, msg_type: str, seconds: float) -> None:
        xs = self._seen.setdefault(msg_type, [])
        xs.append(seconds * 1000)
        if len(xs) > 2048:
            del xs[:1024]

    def summary(self) -> dict[str, C.LatencyFigures]:
        out = {}
        for k, xs in self._seen.items():
            s = sorted(xs)
            out[k] = C.LatencyFigures(p50=round(s[len(s) // 2], 3),
                                      p99=round(s[min(len(s) - 1, int(len(s) * 0.99))], 3),
                                      max=round(s[-1], 3), n=len(s))
        return out


def _save_key(folder: Path, name: str) -> str:
    """A save's key among the saves in flight: its folder and its name without case (one file
    on Windows and macOS)."""
    return f"{folder}{os.sep}{name.lower()}"

