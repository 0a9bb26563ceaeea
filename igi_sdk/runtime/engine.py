"""The inference engine: one llama.cpp model + context, many NPC sessions, one decode loop.

Threading: llama.cpp contexts are not thread-safe, so a single engine thread owns every native
call. Public methods post a command to that thread: the ``*_async`` ones return a
:class:`~concurrent.futures.Future` at once (what the sidecar's socket thread uses, so that it
never waits on the engine), the plain ones wait for it. Between commands the thread runs decode
steps for every active reply, all sessions in one ``llama_decode``; a prompt is fed in chunks
sized so that one step stays near ``max_step_s``, so a command (cancel, snapshot, reshard) takes
effect within one short step even when a long prompt is being read on the CPU.

Reshards are driven from outside (the arbiter's state machine) through :meth:`Engine.exclusive`,
which runs a procedure on the engine thread with the low-level steps of :class:`EngineOps`. When
no placement can be loaded the engine is *unavailable*: it keeps every session (and the KV cache
bytes) and answers model work with :class:`EngineUnavailableError` until a load succeeds.

The engine's parts (called on the engine thread unless they say otherwise): config.py
(:class:`EngineConfig`), engine_ops.py (:class:`EngineOps`, the reshard steps), engine_state.py
(snapshot, restore and the parked context state), session.py (sessions, turns, the session
table), replies.py (a reply's tokens and end), batching.py (a step's batch), drafting.py
(speculative decoding's turn logic), encoder.py (the vision encoder and the VRAM it borrows),
futures.py (futures continued on another thread).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp

from igi_sdk.errors import (
    ContextFullError,
    EngineClosedError,
    EngineUnavailableError,
    GenerationCancelled,
    IgiError,
    InferenceError,
    InvalidStateError,
    PromptTooLongError,
    SessionBusyError,
    UnknownSessionError,
    VisionUnavailableError,
)
from igi_sdk.model import ModelInventory, default_model_path, read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import (
    _native,
    batching,
    engine_ops,
    engine_state,
    futures,
    image_turn,
    loader,
    replies,
    snapshot,
)
from igi_sdk.runtime.batching import Fed
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.context_share import Admit, ContextShare
from igi_sdk.runtime.devices import Device
from igi_sdk.runtime.drafting import Drafting
from igi_sdk.runtime.encoder import Encoder
from igi_sdk.runtime.engine_ops import EngineOps
from igi_sdk.runtime.generation import Generation
from igi_sdk.runtime.grammar import tokenizer_for
from igi_sdk.runtime.image_turn import ImageInput, MediaMark
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.placement import LoadReport
from igi_sdk.runtime.sampling import (
    ENGINE_STACK_BYTES,
    SamplerChain,
    SamplingParams,
    prepare_grammar,
)
from igi_sdk.runtime.session import Session, SessionTable, Turn
from igi_sdk.runtime.speculative import Proposal
from igi_sdk.runtime.text import Vocab, parts_after
from igi_sdk.runtime.vision import VisionContext

__all__ = ["Engine", "EngineConfig", "EngineOps"]

T = TypeVar("T")
log = logging.getLogger("igi_sdk.runtime")

class Engine:
    """A loaded model with sessions. Every public method is thread-safe."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        plan: Plan | None = None,
        config: EngineConfig | None = None,
        *,
        progress: Callable[[float], None] | None = None,
        vision_plan: Callable[[Plan], Plan | None] | None = None,
    ) -> None:
        """``vision_plan`` (with ``config.vision_gpu``): asked, each time the encoder opens,
        for the LM placement to hold while it is open on the GPU, given the current one; None:
        there is no room, the encoder opens on the CPU this time. A smaller placement than the
        current one means the encoder borrows its VRAM from the LM: the engine reshards to it,
        encodes, frees the encoder and moves back, so the LM has the whole budget between
        images (``planner.vision`` prices when that pays). With it the encoder is never
        resident between image turns."""
        self.model_path = Path(model_path) if model_path else default_model_path()
        self.inventory: ModelInventory = read_inventory(self.model_path)
        self.config = config or EngineConfig()
        self.plan = plan or Plan.all_cpu()
        self.report = LoadReport()
        self.gpu: Device | None = None
        self.reshard_count = 0
        self.last_reshard_s = 0.0
        self.state = "loading"  # "ready" | "unavailable" | "closed"
        self._progress = progress
        self._model: Any = None
        self._loaded: loader.Loaded | None = None
        self._batch: Any = None
        self._batch_cap = 0
        self._outputs_cap = 0
        self._ctx: Any = None
        self._mem: Any = None
        self._vocab: Vocab | None = None
        self._encoder = Encoder(self.config, vision_plan)
        self._parked: bytes | None = None  # the context's state while no placement is loaded
        self._table = SessionTable(self.config.max_sessions)
        # who may take how many KV cells: one line cannot starve the other sessions
        self.share = ContextShare.of(self.config.n_ctx, self.config.max_sessions,
                                     self.config.context_floor)
        self._sessions: dict[str, Session] = self._table.by_id  # the table's, by id
        self._turn_counter = 0
        self._commands: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._submit_lock = threading.Lock()
        self._closed = False
        self._io = ThreadPoolExecutor(1, thread_name_prefix="igi-engine-io")
        self._pace_s = 0.0
        self._pace_until = float("inf")
        self._steps = 0
        self._token_s: float | None = None  # measured seconds per prompt token on this plan
        self.step_stats = {"max_s": 0.0, "last_s": 0.0, "chunk": 0, "failures": 0}
        self._drafting = Drafting(self.config, self._take)
        _native.init_backend(self.plan.copy_compute_min_batch)
        ready: Future = Future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="igi-engine", daemon=True
        )
        # The engine thread runs llama.cpp's recursive grammar parser: give it a known stack
        # (sampling.py's limits are measured against it), not the platform's default (8 MiB on
        # Linux, 1 MiB on Windows). Process-wide setting: restored once the thread has started.
        try:
            previous: int | None = threading.stack_size(ENGINE_STACK_BYTES)
        except (RuntimeError, ValueError):  # not settable on this platform: its default applies
            previous = None
        try:
            self._thread.start()
        finally:
            if previous is not None:
                threading.stack_size(previous)
        ready.result()  # re-raises a load failure here, in the caller's thread

    # ======================================================================== public API

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx

    @property
    def available(self) -> bool:
        return self.state == "ready"

    def placement(self) -> dict[str, str]:
        """Tensor name -> 'gpu' | 'cpu', as llama.cpp reported it while loading."""
        return self.report.placement(self.gpu)

    def memory(self) -> dict[str, dict[str, int]]:
        """Bytes by device ('gpu', 'cpu') and category ('weights', 'kv', 'compute')."""
        return {d: self.report.bytes_on(d, self.gpu) for d in ("gpu", "cpu")}

    def status(self) -> dict[str, Any]:
        """A consistent-enough summary that never waits for the engine thread (for ``stats``)."""
        return {"state": self.state, "plan": self.plan.name, "memory": self.memory(),
                "sessions": len(self._sessions), "reshards": self.reshard_count,
                "last_reshard_s": round(self.last_reshard_s, 4),
                "active_replies": sum(1 for s in list(self._sessions.values()) if s.turn),
                "step": dict(self.step_stats),
                "copy_compute_min_batch": {
                    "plan": self.plan.copy_compute_min_batch if self.plan.op_offload else None,
                    "in_effect": _native.copy_compute_threshold_in_effect()},
                "speculative": self._drafting.status(), "vision": self._encoder.status(),
                "context": self.context_status()}

    def context_status(self) -> dict[str, int]:
        """The shared context's cells (read without waiting for the engine thread): ``used``
        (held by sessions), ``claimed`` (held plus admitted for replies in progress),
        ``floor`` (guaranteed to each session slot), ``max_per_session`` (the most one
        session may ever hold) and ``free_for_new`` (what a session holding nothing may
        take now)."""
        sessions = list(self._sessions.values())
        claims = [_claim(s) for s in sessions]
        sh = self.share
        return {"n_ctx": sh.n_ctx, "floor": sh.floor, "max_per_session": sh.most,
                "used": sum(len(s.tokens) + s.image_cells for s in sessions),
                "claimed": sum(claims),
                "free_for_new": max(0, sh.room(claims)) if len(claims) < sh.slots else 0}

    @property
    def vision_borrows(self) -> int:
        """Image turns that moved the LM for the encoder."""
        return self._encoder.borrows

    @property
    def vision_opens(self) -> int:
        """mtmd contexts opened by this engine (a reopen per image turn when not resident)."""
        return self._encoder.opens

    def drop_draft_async(self) -> Future[bool]:
        return self._submit(self._drafting.drop)

    def drop_draft(self) -> bool:
        """Free the draft model (VRAM pressure: it is the first thing to go); replies in
        progress go on without drafting. True if there was one."""
        return self.drop_draft_async().result()

    def restore_draft_async(self) -> Future[bool]:
        """Load the configured draft model again after :meth:`drop_draft` (the VRAM came
        back). True if it was loaded now; False if it is loaded already, there is none, or no
        placement is loaded. A draft that fails to load raises its typed error; decoding goes
        on without it."""
        return self._submit(self._restore_draft)

    def _restore_draft(self) -> bool:
        c = self.config
        if not c.draft_model or self._drafting.drafter is not None or self._vocab is None:
            return False
        self._drafting.load(c.draft_model, self._vocab, self.plan.copy_compute_min_batch)
        return True

    def open_session_async(
        self,
        system_prompt: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        priority: int = 0,
        session_id: str | None = None,
    ) -> Future[str]:
        params = sampling or SamplingParams()
        prompt = system_prompt.replace(image_turn.IMAGE_SLOT, "") if system_prompt else None
        return self._submit(lambda: self._table.open(prompt, params, priority, session_id))

    def open_session(self, system_prompt: str | None = None, *,
                     sampling: SamplingParams | None = None, priority: int = 0,
                     session_id: str | None = None) -> str:
        return self.open_session_async(system_prompt, sampling=sampling, priority=priority,
                                       session_id=session_id).result()

    def close_session_async(self, session_id: str) -> Future[None]:
        return self._submit(lambda: self._close_session(session_id))

    def close_session(self, session_id: str) -> None:
        self.close_session_async(session_id).result()

    def sessions(self) -> list[str]:
        return self._call(lambda: list(self._sessions))

    def set_priority(self, session_id: str, priority: int) -> None:
        """Takes effect at the next decode step. Does not wait for the engine thread: the
        scheduler reads the priority afresh every step, and an int is written whole."""
        s = self._sessions.get(session_id)
        if s is None:
            raise UnknownSessionError(f"no session '{session_id}'")
        s.priority = priority

    def session_info(self) -> dict[str, dict[str, Any]]:
        """Tokens in context, whether replying, and priority of every session, read without
        waiting for the engine thread (figures of the last step, for listings)."""
        drafts = self._drafting.acceptance
        out: dict[str, dict[str, Any]] = {}
        for sid, s in list(self._sessions.items()):
            info: dict[str, Any] = {"tokens": len(s.tokens) + s.image_cells,
                                    "busy": s.turn is not None, "priority": s.priority}
            draft = drafts.get(sid)  # one read: the engine thread may drop it meanwhile
            if draft is not None:
                info["draft"] = draft.figures()
            out[sid] = info
        return out

    def chat_async(
        self,
        session_id: str,
        user_text: str,
        *,
        max_tokens: int = 256,
        stop: list[str] | tuple[str, ...] = (),
        grammar: str | None = None,
        json_schema: str | dict | None = None,
        ignore_eos: bool = False,
        listener: Callable[[str, object], None] | None = None,
        images: Sequence[ImageInput] = (),
    ) -> Future[Generation]:
        """Like :meth:`chat`, but returns a future of the handle at once."""
        if max_tokens < 1:
            out: Future[Generation] = Future()
            out.set_exception(PromptTooLongError("max_tokens must be at least 1"))
            return out
        stops = tuple(s for s in stop if s)

        def start(g: str | None) -> Future[Generation]:
            return self._submit(lambda: self._start_turn(session_id, user_text, max_tokens,
                                                         stops, g, ignore_eos, listener,
                                                         tuple(images)))

        if grammar is None and json_schema is None:
            return start(None)
        # Checking (and converting) a grammar takes up to tens of ms within sampling.py's
        # limits: done on the I/O worker, it holds up neither the caller (the sidecar's socket
        # thread) nor the decode loop that every NPC shares. A chat with a grammar may thus
        # start after commands sent after it. A chat the caller gave up on (cancelled) has the
        # reply it started stopped.
        return futures.prepared(self._io, partial(prepare_grammar, grammar, json_schema),
                                start, lambda g: g.cancel())

    def chat(self, session_id: str, user_text: str, **options: Any) -> Generation:
        """Add the player's line and start the NPC's reply; returns at once with a handle.

        Options: ``max_tokens``, ``stop``, ``grammar``, ``json_schema``, ``images`` (a list of
        :class:`ImageInput`; needs ``EngineConfig.mmproj``; where they go in the line:
        runtime/image_turn.py), ``ignore_eos`` (keep
        generating past end-of-turn tokens: benchmarks want exact lengths), ``listener(kind,
        payload)`` — called on the engine thread for each event of the reply ("text", "done",
        "error"); it must be quick and must not wait on the engine."""
        return self.chat_async(session_id, user_text, **options).result()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` for this model (special tokens parsed, no BOS added)."""
        return self._call(lambda: self._need_vocab().tokenize(text, add_special=False))

    def set_pacing(self, step_delay_s: float, hold_s: float | None = None) -> None:
        """Pause between decode steps (frame pacing); 0 = as fast as possible. While paused,
        sessions of priority <= 0 are decoded every other step; player-facing ones every step.
        ``hold_s``: the pause lapses unless set again within this long (a game that stops
        sending frames — it quit, or paused — must not keep slowing inference)."""
        self._pace_until = time.monotonic() + hold_s if hold_s is not None else float("inf")
        self._pace_s = max(0.0, float(step_delay_s))

    def _pace(self) -> float:
        return self._pace_s if time.monotonic() < self._pace_until else 0.0

    def snapshot_async(self, session_id: str) -> Future[bytes]:
        # captured on the engine thread; packed (one copy + the checksum) on the I/O thread
        return futures.then(self._submit(lambda: self._snapshot(session_id)),
                            lambda parts: snapshot.pack(*parts), self._io)

    def snapshot(self, session_id: str) -> bytes:
        """The session's whole state (KV cache + conversation) as bytes; it must be idle."""
        return self.snapshot_async(session_id).result()

    def restore_async(self, data: bytes, *, session_id: str | None = None) -> Future[str]:
        # the bytes are verified (length, checksum) on the I/O thread before the engine sees them
        return futures.chain(self._on_io(lambda: snapshot.unpack(data)), lambda unpacked:
                             self._submit(lambda: self._restore(*unpacked, session_id)))

    def restore(self, data: bytes, *, session_id: str | None = None) -> str:
        """Recreate a session from :meth:`snapshot` bytes; returns its id. Damaged, truncated
        or foreign bytes raise :class:`InvalidStateError` and change nothing."""
        return self.restore_async(data, session_id=session_id).result()

    def save_session_async(self, session_id: str, path: str | Path) -> Future[int]:
        """Snapshot on the engine thread, write the file on an I/O thread; bytes written. The
        file is replaced atomically (a crash leaves the old save or the new one); OS failures
        raise :class:`SaveFailedError` (:class:`DiskFullError` when out of space), and leave an
        earlier save of that path unchanged."""
        target = Path(path)
        return futures.then(self._submit(lambda: self._snapshot(session_id)),
                            lambda parts: snapshot.save(target, snapshot.parts(*parts)), self._io)

    def save_session(self, session_id: str, path: str | Path) -> None:
        self.save_session_async(session_id, path).result()

    def load_session_async(self, path: str | Path, *,
                           session_id: str | None = None) -> Future[str]:
        p = Path(path)
        return futures.chain(self._on_io(lambda: engine_state.read_save(p)), lambda unpacked:
                             self._submit(lambda: self._restore(*unpacked, session_id)))

    def load_session(self, path: str | Path, *, session_id: str | None = None) -> str:
        return self.load_session_async(path, session_id=session_id).result()

    def _on_io(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the I/O thread (file work and checksums stay off the engine thread)."""
        return futures.on_pool(self._io, fn)

    def exclusive(self, procedure: Callable[[EngineOps], T]) -> Future[T]:
        """Run ``procedure`` on the engine thread between two decode steps, with the low-level
        steps of a reshard (:class:`EngineOps`); nothing else runs meanwhile."""
        return self._submit(lambda: procedure(EngineOps(self)))

    def reshard(self, plan: Plan, on_released: Callable[[], None] | None = None) -> float:
        """Reload the model with another placement, keeping every session (and active replies)
        where they were. Returns the seconds it took. ``on_released`` runs (on the engine
        thread) once the old placement's memory is freed, before the new one loads: a game
        waiting for VRAM can have it then, not after the reload.

        If ``plan`` fails to load, the engine is left *unavailable* (sessions kept) and the
        error is raised; reshard again to a plan that fits (the arbiter does this for the
        sidecar, smaller rungs first)."""

        def run(ops: EngineOps) -> float:
            t0 = time.perf_counter()
            ops.park_and_release()
            if on_released is not None:
                on_released()
            ops.load_and_restore(plan)
            return time.perf_counter() - t0

        return self.exclusive(run).result()

    def close(self) -> None:
        with self._submit_lock:
            if self._closed:
                return
        try:
            self._call(self._shutdown)
        except EngineClosedError:
            pass
        self._thread.join(timeout=30)
        self._io.shutdown(wait=False)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ============================================================ engine thread: plumbing

    def _submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        with self._submit_lock:  # checked and queued atomically: nothing queues after the end
            if self._closed or not self._thread.is_alive():
                fut.set_exception(EngineClosedError("the engine is closed"))
            else:
                self._commands.put((fn, fut))
        return fut

    def _call(self, fn: Callable[[], T]) -> T:
        return self._submit(fn).result()

    def _run(self, ready: Future) -> None:
        try:
            self._load(self.plan)
            if self.config.draft_model:
                assert self._vocab is not None
                self._drafting.load(self.config.draft_model, self._vocab,
                                    self.plan.copy_compute_min_batch)
        except BaseException as e:  # noqa: BLE001 - handed to the constructor's thread
            self._finish_thread()
            ready.set_exception(e)
            return
        self.state = "ready"
        ready.set_result(None)
        try:
            self._loop()
        except BaseException:  # the thread must not die silently
            log.exception("the engine thread failed")
        finally:
            self._finish_thread()

    def _loop(self) -> None:
        while True:
            active = self._ctx is not None and bool(self._active_turns())
            try:
                if not active:
                    item = self._commands.get()
                elif (pace := self._pace()) > 0:  # paced: wait, but answer commands meanwhile
                    item = self._commands.get(timeout=pace)
                else:
                    item = self._commands.get_nowait()
            except queue.Empty:
                item = None
            while item is not None:
                fn, fut = item
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:  # noqa: BLE001 - every error goes to the caller
                        fut.set_exception(e)
                if fn == self._shutdown:
                    return
                try:
                    item = self._commands.get_nowait()
                except queue.Empty:
                    item = None
            if self._ctx is not None and self._active_turns():
                self._guarded_step()
            if self._encoder.lent_from is not None:
                self._encoder.give_back(self._move)

    def _guarded_step(self) -> None:
        """One decode step; a failure ends the replies it was computing, not the engine."""
        t0 = time.perf_counter()
        try:
            self._step()
        except Exception as e:  # llama.cpp or sampler faults surface here
            log.exception("decode step failed")
            self.step_stats["failures"] += 1
            for t in self._active_turns():
                self._rollback(t)
                self._end_turn(t, error=InferenceError(f"decode step failed: {e}"))
        dt = time.perf_counter() - t0
        self.step_stats["last_s"] = round(dt, 5)
        self.step_stats["max_s"] = round(max(self.step_stats["max_s"], dt), 5)

    def _finish_thread(self) -> None:
        """The thread is ending: later commands fail at once, queued ones fail now."""
        with self._submit_lock:
            self._closed = True
        self.state = "closed"
        for t in self._active_turns():
            t.session.turn = None
            t.handle._fail(EngineClosedError("the engine was closed"))
        while True:
            try:
                _fn, fut = self._commands.get_nowait()
            except queue.Empty:
                break
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineClosedError("the engine is closed"))
        try:
            self._drafting.drop()
            self._unload()
        except Exception:  # best effort at exit
            log.exception("unload at exit failed")

    def _active_turns(self) -> list[Turn]:
        return [s.turn for s in self._sessions.values() if s.turn is not None]

    # ============================================================ engine thread: loading

    def _load(self, plan: Plan) -> None:
        settings = ContextSettings(self.config.n_ctx, self.config.max_sessions,
                                   self.config.n_batch, self.config.n_threads,
                                   n_outputs=self.config.outputs_per_step)
        loaded = loader.load(self.model_path, self.inventory, plan, settings,
                             progress=self._progress)
        try:
            vocab = Vocab(loaded.model)
            # llguidance's view of the vocabulary (~0.35 s for 49k tokens), built with the load
            # rather than inside the first grammar reply's step; cached across reshards
            tokenizer_for(vocab.vocab)
            mem = llama_cpp.llama_get_memory(loaded.ctx)
            # one batch per placement: allocating per decode step is waste on the hot path
            cap = max(self.config.n_batch, plan.n_ubatch)
            batch = llama_cpp.llama_batch_init(cap, 0, 1)
        except BaseException:
            loader.free(loaded)
            raise
        self._loaded, self._model, self._ctx = loaded, loaded.model, loaded.ctx
        self.report, self.gpu, self.plan = loaded.report, loaded.gpu, plan
        self._vocab, self._mem, self._batch, self._batch_cap = vocab, mem, batch, cap
        self._outputs_cap = settings.outputs_max
        self._token_s = None  # a new placement: measure its prompt speed again
        enc = self._encoder
        if self.config.mmproj and (enc.keeps or not enc.checked):
            try:  # mtmd keeps the model's vocabulary: opened after it, closed before it
                self._open_vision(check=not enc.keeps)
            except BaseException:
                self._unload()
                raise
            enc.checked = True
            self._vision_idle()

    def _open_vision(self, *, check: bool = False) -> VisionContext:
        """The vision context, opened if it is not (engine thread). ``VisionContext`` is looked
        up in this module when called (tests replace it here)."""
        enc = self._encoder
        if enc.context is None:
            if not self.config.mmproj:
                raise VisionUnavailableError(
                    "this model was loaded without a vision projector (mmproj): it cannot see "
                    "images; load it with its mmproj, or send the line without images")
            gpu = None if check else enc.place(self.plan, self._move)
            enc.context = VisionContext(self._model, self.config.mmproj,
                                        enc.options(check=check, gpu=gpu))
            enc.opens += 1
        return enc.context

    def _move(self, plan: Plan) -> None:
        """Reshard to ``plan`` on the engine thread (engine_ops.move: the previous placement is
        loaded again if ``plan`` fails, and the error raised)."""
        engine_ops.move(self, plan)

    def _vision_idle(self) -> None:
        """Free a non-resident vision context once no reply has an image left to encode."""
        self._encoder.idle(self._active_turns())

    def _unload(self) -> None:
        """Free the placement; every handle into it is dropped with it."""
        self._encoder.close()  # its chunks of pending images too: they are made again
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
        loaded, self._loaded = self._loaded, None
        self._batch = self._ctx = self._model = self._mem = self._vocab = None
        self._batch_cap = 0
        self.report = LoadReport()  # nothing is placed now: memory() says so
        if loaded is not None:
            loader.free(loaded)

    def _shutdown(self) -> None:
        for s in list(self._sessions.values()):
            if s.turn is not None:
                self._end_turn(s.turn, error=EngineClosedError("the engine was closed"))
        self._unload()

    def _need_vocab(self) -> Vocab:
        if self._vocab is None:
            raise EngineUnavailableError(
                "the model is not loaded right now (no placement fits the memory that is free); "
                "the sessions are kept — retry shortly")
        return self._vocab

    # ============================================================ engine thread: sessions

    def _close_session(self, sid: str) -> None:
        s = self._table.get(sid)
        if s.turn is not None:
            self._end_turn(s.turn, error=GenerationCancelled(f"session '{sid}' was closed"))
        if self._mem is not None:  # else: dropped when the parked state is put back
            llama_cpp.llama_memory_seq_rm(self._mem, s.seq, -1, -1)
        self._drafting.forget(s)
        self._table.remove(s)

    def _start_turn(self, *args: Any, **kw: Any) -> Generation:
        try:
            return self._begin_turn(*args, **kw)
        finally:  # a non-resident encoder opened for a line that failed, or had no images
            self._vision_idle()

    def _begin_turn(
        self,
        sid: str,
        user_text: str,
        max_tokens: int,
        stop: tuple[str, ...],
        grammar: str | None,
        ignore_eos: bool = False,
        listener: Callable[[str, object], None] | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> Generation:
        s = self._table.get(sid)
        if s.turn is not None:
            raise SessionBusyError(f"session '{sid}' is still replying; cancel it or wait")
        vocab = self._need_vocab()
        if images and not self.config.mmproj:
            self._open_vision()  # VisionUnavailableError
        # the chat template is C text: a NUL would cut the message short; an image is a slot
        # character in the content (image_turn.py), which player text cannot hold
        marker = self._encoder.options().media_marker if self.config.mmproj else ""
        content = image_turn.user_content(user_text, len(images), marker)
        messages = [*s.messages, {"role": "user", "content": content}]
        # special tokens come from the template's markup only: every content is data
        parts = vocab.prompt_parts(messages, add_assistant=True)
        full = "".join(text for text, _ in parts)
        reset = s.reread or not full.startswith(s.committed_text)
        vision = self._open_vision() if images or (reset and s.images) else None
        vocab = self._need_vocab()  # opening the encoder may have moved the model (vision_plan)
        if reset:  # the template re-rendered history differently: re-read it all
            if s.n_images > len(s.images):
                raise InvalidStateError(
                    f"session '{sid}' must re-read its conversation, but its images were not "
                    "kept (it was restored from a save): open a new session")
            feed, pending = image_turn.tokenize(vocab, vision, parts, [*s.images, *images],
                                                add_special=True)
            base = 0
        else:
            delta = parts_after(parts, len(s.committed_text))
            feed, pending = image_turn.tokenize(vocab, vision, delta, images,
                                                add_special=not s.tokens)
            feed = s.pending + feed
            base = len(s.tokens) + s.image_cells
        try:
            n_prompt = len(feed) + image_turn.cells(pending)
            others = [_claim(o) for o in self._sessions.values() if o is not s]
            replies.check_prompt(self.config, n_prompt, base, pending, self.share, others)
            handle = Generation(sid, listener=listener)
            turn = Turn(
                session=s, handle=handle, feed=feed, prompt_text=full, prompt_tokens=n_prompt,
                max_tokens=max_tokens, stop=stop, grammar=grammar, start_tokens=len(s.tokens),
                start_pending=list(s.pending), order=self._turn_counter + 1,
                ignore_eos=ignore_eos, images=pending,
            )
            turn.chain = self._make_chain(turn)  # InvalidGrammarError before any state moves
        except BaseException:
            image_turn.release(pending)
            raise
        self._turn_counter += 1
        if reset:
            llama_cpp.llama_memory_seq_rm(self._mem, s.seq, -1, -1)
            s.tokens = []
            s.image_cells = 0
            s.reread = False
            turn.start_tokens = 0
        turn.media = MediaMark.of(s)
        s.images.extend(images)
        s.n_images += len(images)
        s.pending = []
        s.messages = messages
        s.turn = turn
        return handle

    def _make_chain(self, turn: Turn) -> SamplerChain:
        s = turn.session
        return SamplerChain(s.params, self._need_vocab().vocab, grammar=turn.grammar,
                            history=s.history, reply_tokens=turn.generated)

    # ============================================================ engine thread: decoding

    def _step(self) -> None:
        """One llama_decode for every active reply (player-facing sessions first)."""
        turns = sorted(
            self._active_turns(),
            key=lambda t: (-t.session.priority, len(t.feed) > 1, t.order),
        )
        for t in turns:
            if t.handle.cancelled:
                self._end_turn(t, reason="cancelled")
        turns = [t for t in turns if t.session.turn is t]
        self._steps += 1
        if self._pace() > 0 and self._steps % 2:  # paced: background NPCs every other step
            turns = [t for t in turns if t.session.priority > 0] or turns
        if not turns:
            return
        rooms = self._rooms()
        for t in turns:
            if t.generated and t.feed and _claim(t.session) > rooms[t.session.id]:
                # the reply reached its session's share of the context: it ends as at
                # max_tokens, so that other sessions keep the cells they are guaranteed
                self._end_turn(t, reason="length")
        turns = [t for t in turns if t.session.turn is t]
        if not turns:
            return
        waiting = [t for t in turns if t.images and not t.feed]
        if waiting:  # an image is a step of its own: the encoder, then its embeddings
            self._image_step(waiting[0])
            return
        budget = self._token_budget()
        drafts = self._within_share(self._drafting.propose(turns, budget), turns, rooms)
        fed = self._fill_batch(turns, budget, drafts)
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc == 1 and drafts:  # the drafts took the last free cells: decode without them
            drafts = {}
            fed = self._fill_batch(turns, budget)
            t0 = time.perf_counter()
            rc = llama_cpp.llama_decode(self._ctx, self._batch)
        self._time_step(fed, drafts, time.perf_counter() - t0)
        if rc == 1:
            # no room in the KV cache: the lowest-priority reply gives way
            victim = fed[-1][0]
            self._rollback(victim)
            self._end_turn(victim, error=ContextFullError(
                "the shared context is full; retry when other replies end, close idle "
                "sessions or raise n_ctx"))
            return
        if rc != 0:
            for t, _, _ in fed:
                self._rollback(t)
                self._end_turn(t, error=InferenceError(f"llama_decode failed ({rc})"))
            return
        for t, take, idx in fed:
            proposal = drafts.get(t.session.seq)
            if proposal is not None:
                assert self._vocab is not None
                self._drafting.verify(t, proposal, self._ctx, self._mem, self._vocab)
                continue
            t.session.tokens.extend(t.feed[:take])
            del t.feed[:take]
            if idx >= 0:
                self._sample(t, idx)

    def _rooms(self) -> dict[str, int]:
        """The cells each open session may claim now (runtime/context_share.py)."""
        return self.share.rooms({sid: _claim(s) for sid, s in self._sessions.items()})

    @staticmethod
    def _within_share(drafts: dict[int, Proposal], turns: list[Turn],
                      rooms: dict[str, int]) -> dict[int, Proposal]:
        """Drafts cut to the cells their session may still claim: verifying them takes a
        cell each, which must not come out of another session's floor."""
        for t in turns:
            s = t.session
            proposal = drafts.get(s.seq)
            if proposal is None:
                continue
            keep = max(0, rooms[s.id] - _claim(s))
            if keep == 0:
                del drafts[s.seq]
            else:
                del proposal.tokens[keep:], proposal.dists[keep:]
        return drafts

    def _image_step(self, t: Turn) -> None:
        try:
            image_turn.eval_next(self._open_vision(), self._ctx, t, self._batch_cap)
        except IgiError as e:  # a full context, an encoder failure: this reply ends, typed
            self._rollback(t)
            self._end_turn(t, error=e)
        self._vision_idle()  # the embeddings are in the KV cache: the encoder can go

    def _time_step(self, fed: Fed, drafts: dict[int, Proposal], seconds: float) -> None:
        if not drafts:
            self._token_s = batching.learn_speed(self._token_s, self._batch.n_tokens, seconds)
        if any(take != 1 for _t, take, _ in fed):
            return  # a prompt chunk rode along: not a decode step's time
        self._drafting.time_step(bool(drafts), seconds)

    def _token_budget(self) -> int:
        """Tokens for the next step: about ``max_step_s`` of work at the measured speed."""
        n = batching.token_budget(self.config, self.plan, self.gpu is not None,
                                  self._batch_cap, self._token_s)
        self.step_stats["chunk"] = n
        return n

    def _fill_batch(self, turns: list[Turn], budget: int,
                    drafts: dict[int, Proposal] | None = None) -> Fed:
        """Up to ``budget`` pending tokens in the (reused) llama_batch, then the drafts
        (runtime/batching.py). Returns (turn, tokens taken, batch index of its logits or -1)
        per turn fed."""
        fed = batching.fill_batch(self._batch, self._batch_cap, turns, budget)
        if drafts:
            batching.add_drafts(self._batch, self._batch_cap, self._outputs_cap, fed, drafts)
        return fed

    def _sample(self, t: Turn, idx: int) -> None:
        assert t.chain is not None
        try:
            tok = t.chain.sample(self._ctx, idx, t.session.n_sampled)
        except IgiError as e:  # a grammar past its per-step limits: this reply ends, typed
            self._rollback(t)
            self._end_turn(t, error=e)
            return
        self._take(t, tok)

    def _take(self, t: Turn, tok: int) -> bool:
        """Add a sampled token to the reply (runtime/replies.py); False once the reply has
        ended. ``t.feed`` must be empty (what was fed is decoded)."""
        assert self._vocab is not None
        end = replies.take(t, tok, self._vocab)
        if end is None:
            return True
        reason, visible_end = end
        self._end_turn(t, reason=reason, visible_end=visible_end)
        return False

    # ============================================================ engine thread: replies

    def _rollback(self, t: Turn) -> None:
        """Undo a turn that produced nothing: the conversation is as before the request."""
        replies.rollback(t, self._mem)

    def _end_turn(
        self,
        t: Turn,
        *,
        reason: str = "stop",
        error: BaseException | None = None,
        visible_end: int | None = None,
    ) -> None:
        replies.detach(t)
        self._vision_idle()
        if error is None and not t.generated and reason == "cancelled":
            # cancelled before the first token: as if the line was never said
            self._rollback(t)
        elif error is None:
            visible_end = replies.commit(t, visible_end)
        replies.settle(t, reason, error, visible_end)

    # ============================================================ engine thread: state

    def _snapshot(self, sid: str) -> tuple[bytes, bytes]:
        """(JSON header, KV bytes) of an idle session; packing them into the file format (a
        copy and a checksum over the whole state) is left to the I/O thread."""
        s = self._table.get(sid)
        if s.turn is not None:
            raise SessionBusyError(f"session '{sid}' is replying; snapshot it when it is idle")
        self._need_vocab()
        return engine_state.capture(self._ctx, s, engine_state.fingerprint(self.inventory),
                                    engine_state.kv_format(self.plan))

    def _restore(self, meta: dict[str, Any], kv: bytes | memoryview, sid: str | None) -> str:
        """A session from a verified snapshot (:func:`snapshot.unpack`). Everything is checked
        before a session slot is taken, and a failure after that gives the slot back."""
        self._need_vocab()
        saved, same_format = engine_state.check(
            meta, kv, model=engine_state.fingerprint(self.inventory),
            kv_fmt=engine_state.kv_format(self.plan), n_ctx=self.config.n_ctx,
            n_vocab=self.inventory.arch.n_vocab)
        if self._table.free_seqs:  # else the table refuses it: TooManySessionsError
            self._admit_restore(len(saved.tokens) + saved.image_cells)
        new_id = self._table.open(None, saved.params, saved.priority, sid)
        s = self._sessions[new_id]
        try:
            restored = (engine_state.set_seq_state(self._ctx, self._mem, s.seq, kv)
                        if same_format else True)
        except BaseException:
            self._close_session(new_id)
            raise
        if not restored:
            self._close_session(new_id)
            raise InvalidStateError(
                "llama.cpp rejected the saved KV state (no room in the context, or damaged)"
            )
        engine_state.apply(s, saved, same_format)
        return new_id

    def _admit_restore(self, cells: int) -> None:
        """A restored session holding ``cells`` must fit its share, as a line must (and its
        next reply token)."""
        verdict = self.share.admit(cells + 1, [_claim(o) for o in self._sessions.values()])
        if verdict is Admit.NEVER:
            raise InvalidStateError(
                f"the saved session holds {cells} cells; one session may hold at most "
                f"{self.share.most} of this engine's {self.share.n_ctx}")
        if verdict is Admit.WAIT:
            raise ContextFullError(
                f"the saved session holds {cells} cells, but other sessions hold the shared "
                "context's cells now; retry when their replies end or they close")


def _claim(s: Session) -> int:
    """KV cells ``s`` holds plus those its reply in progress was admitted for (the rest of
    its prompt and images, the sampled token to decode)."""
    t = s.turn
    ahead = len(t.feed) + image_turn.cells(t.images) if t is not None else 0
    return len(s.tokens) + s.image_cells + ahead
