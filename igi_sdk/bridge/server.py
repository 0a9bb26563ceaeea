"""The sidecar: a ZeroMQ ROUTER that serves the protocol over an Engine.

One socket thread owns the ROUTER and answers every request at once; generation runs on the
engine thread, whose events come back through an ``inproc`` PULL socket (each producing thread
pushes through its own PUSH socket, since ZeroMQ sockets are not thread-safe). A ``load_model``
request runs on a worker thread, so ``stats`` and the heartbeats keep flowing meanwhile; a model
named on the command line is loaded before the socket serves, so a sidecar that cannot load it
fails at once instead of serving without a model.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import zmq
import zmq.auth

from igi_sdk.bridge import protocol as P
from igi_sdk.errors import IgiError

log = logging.getLogger("igi_sdk.bridge")

_EVENTS = "inproc://igi-events"
_SESSION_SUFFIX = ".igisession"


@dataclass
class ServerConfig:
    endpoint: str = "tcp://127.0.0.1:5599"
    model_dir: Path = field(default_factory=Path.cwd)
    save_dir: Path | None = None  # default: <model_dir>/sessions
    model: str | None = None  # loaded at start (relative to model_dir or absolute inside it)
    n_ctx: int = 4096
    max_sessions: int = 8
    n_threads: int = 0
    max_sessions_per_client: int = 8
    max_streams_per_client: int = 4
    heartbeat_s: float = 1.0
    game_pid: int | None = None
    curve_secret_file: Path | None = None  # server key pair (zmq.auth certificate)
    curve_clients_dir: Path | None = None  # allowed client public certificates
    # VRAM arbiter: on by default with an NVIDIA GPU; a scripted trace (and a profile) simulate
    # one for tests and samples
    arbiter: bool = True
    vram_trace: Path | None = None
    profile: Path | None = None
    grow_hold_s: float = 2.0


def is_loopback(endpoint: str) -> bool:
    """ipc:// and inproc:// never leave the machine; tcp:// only to 127.0.0.0/8 or ::1."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = urlparse(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class _Client:
    identity: bytes
    name: str = ""
    engine: str = ""
    sessions: set[str] = field(default_factory=set)
    streams: dict[int, Any] = field(default_factory=dict)  # chat request id -> Generation
    last_seen: float = field(default_factory=time.monotonic)


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.cfg = config
        self.model_dir = config.model_dir.resolve()
        self.save_dir = (config.save_dir or self.model_dir / "sessions").resolve()
        self.ctx = zmq.Context.instance()
        self.engine: Any = None
        self.arbiter: Any = None
        from igi_sdk.arbiter.pacing import FramePacer

        self.pacer = FramePacer()
        self.model_name: str | None = None
        self.loading = False
        self.clients: dict[bytes, _Client] = {}
        self.stopping = threading.Event()
        self.stats: dict[str, Any] = {"requests": 0, "errors": 0, "started": time.time()}
        self.last_frame: dict[str, Any] | None = None
        self.reservations: list[dict[str, Any]] = []
        self._local = threading.local()
        self._streams_lock = threading.Lock()
        self._auth: Any = None
        self.router = self._bind()
        self.events = self.ctx.socket(zmq.PULL)
        self.events.bind(_EVENTS + uuid.uuid4().hex)
        self._events_addr = self.events.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bound = self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    # --- setup -------------------------------------------------------------------------------

    def _bind(self) -> zmq.Socket:
        cfg = self.cfg
        secure = cfg.curve_secret_file is not None
        if not is_loopback(cfg.endpoint) and not secure:
            raise ValueError(f"refusing to bind {cfg.endpoint}: a non-loopback endpoint needs "
                             "CurveZMQ keys (--curve-secret and --curve-clients; see "
                             "`igi-sdk keys`)")
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a vanished client must not raise here
        # a client that reconnects with its routing id takes its old identity (and sessions) over
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(cfg.heartbeat_s * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(cfg.heartbeat_s * 5000))
        if secure:
            self._auth = _start_auth(self.ctx, cfg.curve_clients_dir)
            public, secret = zmq.auth.load_certificate(str(cfg.curve_secret_file))
            if secret is None:
                raise ValueError(f"{cfg.curve_secret_file} holds no secret key")
            sock.curve_secretkey = secret
            sock.curve_publickey = public
            sock.curve_server = True
        sock.bind(cfg.endpoint)
        return sock

    # --- main loop ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        if self.cfg.model:  # fail fast: a sidecar started with a model it cannot load exits
            body = P.LoadModel(path=self.cfg.model, n_ctx=self.cfg.n_ctx,
                               max_sessions=self.cfg.max_sessions)
            try:
                self._open_engine(self._resolve_model(body.path), body)
            except P.ProtocolError as e:
                self.close()
                raise IgiError(e.message) from None
            except BaseException:
                self.close()
                raise
        if self.cfg.game_pid:
            threading.Thread(target=self._watch_pid, args=(self.cfg.game_pid,), daemon=True,
                             name="igi-pid-watch").start()
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.events, zmq.POLLIN)
        next_beat = time.monotonic() + self.cfg.heartbeat_s
        try:
            while not self.stopping.is_set():
                timeout = max(0.0, next_beat - time.monotonic())
                ready = dict(poller.poll(timeout * 1000))
                if self.events in ready:
                    self._drain_events()
                if self.router in ready:
                    self._drain_requests()
                if time.monotonic() >= next_beat:
                    self._heartbeat()
                    next_beat = time.monotonic() + self.cfg.heartbeat_s
        finally:
            self.close()

    def close(self) -> None:
        self.stopping.set()
        self._stop_arbiter()
        eng, self.engine = self.engine, None
        if eng is not None:
            try:
                eng.close()
            except Exception:
                log.exception("engine close failed")
        self.router.close(0)
        self.events.close(0)
        if self._auth is not None:
            self._auth.stop()

    def _drain_requests(self) -> None:
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                continue  # not a DEALER peer speaking one frame per message: nothing to answer
            identity, frame = frames
            self._handle(identity, frame)

    def _drain_events(self) -> None:
        while True:
            try:
                identity, frame = self.events.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if identity == b"":  # internal control message
                if frame == b"stop":
                    self.stopping.set()
                continue
            self.router.send_multipart([identity, frame])

    def _heartbeat(self) -> None:
        now = time.monotonic()
        for ident, c in list(self.clients.items()):
            if now - c.last_seen > self.cfg.heartbeat_s * 30 and not c.streams and not c.sessions:
                del self.clients[ident]  # silent, holding nothing: forget the connection
                continue
            self.router.send_multipart([ident, P.encode(0, "heartbeat", {"t": time.time()})])

    # --- requests ------------------------------------------------------------------------------

    def _handle(self, identity: bytes, frame: bytes) -> None:
        self.stats["requests"] += 1
        try:
            msg_id, msg_type, body = P.parse_request(frame)
        except P.EnvelopeError as e:
            self._error(identity, e.msg_id, e)
            return
        client = self.clients.get(identity)
        if client is not None:
            client.last_seen = time.monotonic()
        try:
            if msg_type == "hello":
                reply = self._hello(identity, body)  # type: ignore[arg-type]
            elif client is None:
                raise P.ProtocolError("hello_required", "say hello first (protocol version)",
                                      retryable=True)
            else:
                handler = getattr(self, f"_on_{msg_type}")
                reply = handler(client, msg_id, body)
        except P.ProtocolError as e:
            self._error(identity, msg_id, e)
            return
        except IgiError as e:
            self._error(identity, msg_id, P.ProtocolError(e.code, e.message,
                                                          retryable=e.retryable))
            return
        except Exception as e:
            log.exception("request %s failed", msg_type)
            self._error(identity, msg_id, P.ProtocolError("internal", f"internal error: {e}"))
            return
        if reply is not None:
            self.router.send_multipart([identity, P.encode(msg_id, "ok", reply)])

    def _error(self, identity: bytes, msg_id: int, e: P.ProtocolError) -> None:
        self.stats["errors"] += 1
        self.router.send_multipart([identity, P.encode(msg_id, "error", e.body())])

    def _hello(self, identity: bytes, body: P.Hello) -> dict[str, Any]:
        if body.protocol != P.PROTOCOL_VERSION:
            raise P.ProtocolError("unsupported_version",
                                  f"this sidecar speaks protocol {P.PROTOCOL_VERSION}, "
                                  f"the client {body.protocol}")
        c = self.clients.setdefault(identity, _Client(identity))
        c.name, c.engine, c.last_seen = body.client_name, body.engine, time.monotonic()
        if body.game_pid and not self.cfg.game_pid:
            self.cfg.game_pid = body.game_pid
            threading.Thread(target=self._watch_pid, args=(body.game_pid,), daemon=True,
                             name="igi-pid-watch").start()
        return {"protocol": P.PROTOCOL_VERSION, "model": self.model_name,
                "loading": self.loading, "limits": {
                    "max_message_bytes": P.MAX_MESSAGE_BYTES, "max_text_chars": P.MAX_TEXT_CHARS,
                    "max_tokens": P.MAX_TOKENS,
                    "max_sessions_per_client": self.cfg.max_sessions_per_client,
                    "max_streams_per_client": self.cfg.max_streams_per_client}}

    def _on_ping(self, c: _Client, msg_id: int, body: P.Empty) -> dict[str, Any]:
        return {"t": time.time()}

    def _need_engine(self) -> Any:
        if self.engine is None:
            if self.loading:
                raise P.ProtocolError("loading", "the model is still loading", retryable=True)
            raise P.ProtocolError("no_model", "no model is loaded; send load_model first")
        return self.engine

    def _resolve_model(self, path: str) -> Path:
        try:
            candidate = (self.model_dir / path).resolve()
        except (ValueError, OSError):  # NUL bytes, loops: not a path we will open
            raise P.ProtocolError("forbidden_path", "not a valid model path") from None
        if not candidate.is_relative_to(self.model_dir):
            raise P.ProtocolError("forbidden_path", f"'{path}' is outside the model directory")
        if not candidate.is_file():
            raise P.ProtocolError("model_not_found", f"no model file '{path}' in the model "
                                                     "directory")
        return candidate

    def _on_load_model(self, c: _Client, msg_id: int, body: P.LoadModel) -> None:
        if self.loading:
            raise P.ProtocolError("loading", "a model is already loading", retryable=True)
        self._resolve_model(body.path)  # refuse bad paths synchronously
        self._start_load(c.identity, msg_id, body)
        return None  # answered when the load finishes

    def _start_load(self, identity: bytes | None, msg_id: int, body: P.LoadModel) -> None:
        path = self._resolve_model(body.path)
        self.loading = True
        threading.Thread(target=self._load, args=(identity, msg_id, body, path), daemon=True,
                         name="igi-load").start()

    def _load(self, identity: bytes | None, msg_id: int, body: P.LoadModel, path: Path) -> None:
        try:
            self._open_engine(path, body)
            reply = P.encode(msg_id, "ok", {"model": path.name,
                                            "memory": self.engine.memory()})
        except IgiError as e:
            self.model_name = None
            reply = P.encode(msg_id, "error", P.ProtocolError(e.code, e.message,
                                                              retryable=e.retryable).body())
        except Exception as e:
            log.exception("load failed")
            reply = P.encode(msg_id, "error", {"code": "model_load_failed", "message": str(e),
                                                "retryable": False})
        finally:
            self.loading = False
        if identity is not None:
            self._push(identity, reply)

    def _open_engine(self, path: Path, body: P.LoadModel) -> None:
        from igi_sdk.planner import Plan
        from igi_sdk.runtime import Engine, EngineConfig

        self._stop_arbiter()
        old, self.engine = self.engine, None
        self.model_name = None
        if old is not None:  # a new model: the old sessions cannot follow it
            old.close()
            with self._streams_lock:
                for c in list(self.clients.values()):
                    c.sessions.clear()
        cfg = EngineConfig(n_ctx=body.n_ctx, max_sessions=body.max_sessions,
                           n_threads=self.cfg.n_threads)
        arbiter_setup = self._arbiter_setup(path, body) if body.vram_budget is None else None
        if arbiter_setup is not None:  # start on the CPU plan; the arbiter climbs the ladder
            plan = arbiter_setup[0].cpu.plan
        elif body.vram_budget is not None:
            plan = _planned(path, body, cfg, self.cfg.profile)
        else:
            plan = Plan.all_cpu()
        self.engine = Engine(path, plan, cfg)
        self.model_name = path.name
        if arbiter_setup is not None:
            self._start_arbiter(*arbiter_setup)

    def _arbiter_setup(self, path: Path, body: P.LoadModel) -> tuple[Any, Any] | None:
        """(plan ladder, trace or None) when this sidecar should arbitrate VRAM, else None."""
        from igi_sdk.arbiter import PlanLadder, ScriptedTrace
        from igi_sdk.arbiter.ladder import arbiter_workload
        from igi_sdk.model import read_inventory
        from igi_sdk.profile import Profile
        from igi_sdk.runtime.nvml import nvml

        cfg = self.cfg
        has_nvml = nvml() is not None
        # without NVML (a non-NVIDIA GPU) the engine's own frame reports drive the arbiter;
        # that needs the machine's profile given explicitly, since none can be measured here
        if not cfg.arbiter or not (has_nvml or cfg.vram_trace or cfg.profile):
            return None
        if cfg.profile is not None:
            prof = Profile.load(cfg.profile)
        else:
            from igi_sdk.profile.measure import load_or_measure

            prof = load_or_measure(fast=True)
        if prof.gpu is None:
            return None
        ladder = PlanLadder.build(read_inventory(path), prof, arbiter_workload(body.n_ctx))
        trace = ScriptedTrace.load(cfg.vram_trace) if cfg.vram_trace else None
        return ladder, trace

    def _start_arbiter(self, ladder: Any, trace: Any) -> None:
        from igi_sdk.arbiter import Arbiter, EngineReportSource, NvmlSource, PolicyConfig

        holder: list[Any] = []

        def own() -> int:  # the arbiter's own accounting of what this process holds
            return holder[0].policy.current.vram if holder else 0

        sources: list[Any] = []
        total = 0
        if trace is not None:
            trace.own = own
            sources.append(trace)
            total = trace.total
        else:
            nv = NvmlSource(own_fallback=own)
            if nv.nv is not None:
                sources.append(nv)
                reading = nv.read()
                total = reading.total if reading else 0
        self.engine_reports = EngineReportSource(total, own)
        sources.append(self.engine_reports)
        arb = Arbiter(self.engine, ladder, sources,
                      config=PolicyConfig(grow_hold_s=self.cfg.grow_hold_s))
        holder.append(arb)
        self.arbiter = arb
        arb.start()

    def _stop_arbiter(self) -> None:
        arb, self.arbiter = self.arbiter, None
        if arb is not None:
            arb.stop()

    def _on_open_session(self, c: _Client, msg_id: int, body: P.OpenSession) -> dict[str, Any]:
        from igi_sdk.runtime import SamplingParams

        eng = self._need_engine()
        if len(c.sessions) >= self.cfg.max_sessions_per_client:
            raise P.ProtocolError("too_many_sessions", f"this client already has "
                                  f"{len(c.sessions)} sessions; close one first", retryable=True)
        s = body.sampling
        # a persona name alone still gives the NPC an identity
        system = body.system_prompt or (f"You are {body.persona}." if body.persona else None)
        sid = eng.open_session(system, priority=body.priority,
                               sampling=SamplingParams(**s.model_dump(), repeat_last_n=64))
        c.sessions.add(sid)
        return {"session": sid}

    def _owned(self, c: _Client, sid: str) -> str:
        if sid not in c.sessions:
            raise P.ProtocolError("unknown_session", f"no session '{sid}' for this client")
        return sid

    def _on_chat(self, c: _Client, msg_id: int, body: P.Chat) -> None:
        eng = self._need_engine()
        sid = self._owned(c, body.session)
        if msg_id in c.streams:
            raise P.ProtocolError("duplicate_id", f"request id {msg_id} is already streaming")
        if len(c.streams) >= self.cfg.max_streams_per_client:
            raise P.ProtocolError("busy", f"{len(c.streams)} replies are already streaming for "
                                  "this client; wait for one to finish", retryable=True)
        identity = c.identity
        seq = [0]
        lock = self._streams_lock

        def listener(kind: str, payload: object) -> None:  # runs on the engine thread
            if kind == "text":
                seq[0] += 1
                self._push(identity, P.encode(msg_id, "token", {"text": payload, "i": seq[0]}))
                return
            with lock:
                c.streams.pop(msg_id, None)
            if kind == "done":
                r = payload
                self._push(identity, P.encode(msg_id, "done", {
                    "text": r.text, "finish_reason": r.finish_reason,  # type: ignore[attr-defined]
                    "usage": {"prompt_tokens": r.prompt_tokens,  # type: ignore[attr-defined]
                              "completion_tokens": r.completion_tokens},  # type: ignore[attr-defined]
                    "timings": {"ttft_s": r.ttft_s, "total_s": r.total_s}}))  # type: ignore[attr-defined]
            else:
                err = payload
                code = getattr(err, "code", "inference_failed")
                self._push(identity, P.encode(msg_id, "error", {
                    "code": code, "message": str(err),
                    "retryable": bool(getattr(err, "retryable", True))}))

        with lock:  # reserve the slot first: a reply can finish before chat() returns
            c.streams[msg_id] = None
        try:
            gen = eng.chat(sid, body.text, max_tokens=body.max_tokens, stop=body.stop,
                           grammar=body.grammar, json_schema=body.json_schema, listener=listener)
        except BaseException:
            with lock:
                c.streams.pop(msg_id, None)
            raise
        with lock:
            if msg_id in c.streams:
                c.streams[msg_id] = gen
        return None  # the stream answers

    def _on_cancel(self, c: _Client, msg_id: int, body: P.Cancel) -> dict[str, Any]:
        gen = c.streams.get(body.request)
        if gen is not None:
            gen.cancel()
        return {"cancelled": gen is not None}

    def _on_close_session(self, c: _Client, msg_id: int, body: P.SessionRef) -> dict[str, Any]:
        self._need_engine().close_session(self._owned(c, body.session))
        c.sessions.discard(body.session)
        return {}

    def _on_save_session(self, c: _Client, msg_id: int, body: P.SaveSession) -> dict[str, Any]:
        eng = self._need_engine()
        self.save_dir.mkdir(parents=True, exist_ok=True)
        path = self.save_dir / (body.name + _SESSION_SUFFIX)
        eng.save_session(self._owned(c, body.session), path)
        return {"name": body.name, "bytes": path.stat().st_size}

    def _on_restore_session(self, c: _Client, msg_id: int,
                            body: P.RestoreSession) -> dict[str, Any]:
        eng = self._need_engine()
        if len(c.sessions) >= self.cfg.max_sessions_per_client:
            raise P.ProtocolError("too_many_sessions", "close a session first", retryable=True)
        path = self.save_dir / (body.name + _SESSION_SUFFIX)
        if not path.is_file():
            raise P.ProtocolError("unknown_save", f"no saved session '{body.name}'")
        sid = eng.load_session(path)
        c.sessions.add(sid)
        return {"session": sid}

    def _on_frame(self, c: _Client, msg_id: int, body: P.Frame) -> dict[str, Any]:
        self.last_frame = body.model_dump()
        if self.engine is not None and body.target_frame_time_ms is not None:
            self.engine.set_pacing(self.pacer.update(body.frame_time_ms,
                                                     body.target_frame_time_ms))
        if self.arbiter is not None:
            self.arbiter.on_frame(body.frame, body.vram_used, body.vram_budget,
                                  body.frame_time_ms, body.target_frame_time_ms)
        return {}

    def _on_reserve_vram(self, c: _Client, msg_id: int,
                         body: P.ReserveVram) -> dict[str, Any] | None:
        self.reservations.append(body.model_dump())
        del self.reservations[:-16]
        if self.arbiter is None:  # no VRAM of ours to give back: it is free already
            return {"recorded": True, "acknowledged": True}
        identity = c.identity

        def on_ack(res: Any) -> None:  # on the arbiter thread, once the VRAM is free
            self._push(identity, P.encode(msg_id, "ok", {"recorded": True,
                                                         "acknowledged": True}))

        self.arbiter.reserve(body.bytes, body.deadline_frames, on_ack)
        return None  # answered when acknowledged

    def _on_stats(self, c: _Client, msg_id: int, body: P.Empty) -> dict[str, Any]:
        eng = self.engine
        out: dict[str, Any] = {
            "model": self.model_name, "loading": self.loading, "clients": len(self.clients),
            "uptime_s": time.time() - self.stats["started"], "requests": self.stats["requests"],
            "errors": self.stats["errors"], "last_frame": self.last_frame,
            "reservations": self.reservations[-4:],
            "pacing_delay_s": self.pacer.delay_s,
        }
        if eng is not None:
            out.update(sessions=len(eng.sessions()), plan=eng.plan.name, memory=eng.memory(),
                       reshards=eng.reshard_count)
        if self.arbiter is not None:
            out["arbiter"] = self.arbiter.stats()
        return out

    def _on_shutdown(self, c: _Client, msg_id: int, body: P.Empty) -> dict[str, Any]:
        self._push(b"", b"stop")  # after the reply below is sent
        return {}

    # --- helpers -----------------------------------------------------------------------------

    def _push(self, identity: bytes, frame: bytes) -> None:
        """Queue a message for the socket thread (any thread may call this)."""
        sock = getattr(self._local, "push", None)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(self._events_addr)
            self._local.push = sock
        sock.send_multipart([identity, frame])

    def _watch_pid(self, pid: int) -> None:
        """The sidecar must not outlive the game: exit within 2 s of its process ending."""
        while not self.stopping.is_set():
            if not _alive(pid):
                log.warning("game process %d is gone; shutting down", pid)
                self._push(b"", b"stop")
                return
            time.sleep(0.25)


def _alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT on Windows
        return _alive_windows(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by its parent) is gone as far as the game goes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _alive_windows(pid: int) -> bool:
    import ctypes

    synchronize, wait_timeout = 0x00100000, 0x00000102
    k32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = k32.OpenProcess(synchronize, False, pid)
    if not handle:
        return False
    try:
        return k32.WaitForSingleObject(handle, 0) == wait_timeout
    finally:
        k32.CloseHandle(handle)


def _planned(path: Path, body: P.LoadModel, cfg: Any, profile: Path | None) -> Any:
    from igi_sdk.model import read_inventory
    from igi_sdk.profile import Profile
    from igi_sdk.runtime.autoplan import plan_for_model

    prof = Profile.load(profile) if profile is not None else None
    return plan_for_model(path, read_inventory(path), budget=body.vram_budget, n_ctx=body.n_ctx,
                          max_sessions=body.max_sessions, n_threads=cfg.n_threads,
                          profile=prof).best


def _start_auth(ctx: zmq.Context, clients_dir: Path | None) -> Any:
    from zmq.auth.thread import ThreadAuthenticator

    if clients_dir is None:
        raise ValueError("CurveZMQ needs --curve-clients: a directory of allowed client keys")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(clients_dir))
    return auth
