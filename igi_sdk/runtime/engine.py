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
"""

from __future__ import annotations

import ctypes
import errno
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp
import numpy as np

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
    TooManySessionsError,
    UnknownSessionError,
    VisionUnavailableError,
)
from igi_sdk.model import ModelInventory, default_model_path, read_inventory
from igi_sdk.planner import Plan
from igi_sdk.planner.speculative import draft_n_ctx
from igi_sdk.runtime import _native, image_turn, loader, snapshot
from igi_sdk.runtime.devices import Device
from igi_sdk.runtime.generation import Generation, GenerationResult
from igi_sdk.runtime.image_turn import ImageInput, MediaMark
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.placement import LoadReport
from igi_sdk.runtime.sampling import (
    ENGINE_STACK_BYTES,
    SamplerChain,
    SamplingParams,
    prepare_grammar,
)
from igi_sdk.runtime.session import Session, Turn
from igi_sdk.runtime.speculative import (
    Acceptance,
    Drafter,
    DraftRequest,
    Proposal,
    SpeculativeConfig,
    StepTimes,
    put_token,
    speculative_pick,
)
from igi_sdk.runtime.text import Vocab, parts_after, stop_scan
from igi_sdk.runtime.vision import FlashAttn, VisionContext, VisionOptions

T = TypeVar("T")
log = logging.getLogger("igi_sdk.runtime")

# the first prompt chunk on a fresh placement, before its per-token cost is known
_PROBE_CHUNK = 32


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = 4096  # KV cells shared by all sessions
    max_sessions: int = 8  # llama.cpp sequences
    n_batch: int = 512  # tokens per llama_decode across all sessions
    n_threads: int = 0  # 0 = leave the game cores (loader.default_threads, IGI_SDK_THREADS)
    max_prompt_tokens: int = 0  # per chat turn; 0 = limited by the context only
    # one decode step's target duration: prompts are fed in chunks that take about this long,
    # so commands wait at most about one such step (copy-compute plans feed at least a whole
    # ubatch, since each chunk streams the CPU-resident weights once)
    max_step_s: float = 0.05
    # fixed prompt tokens per step instead (0 = sized from max_step_s). llama.cpp's kernels sum
    # in an order that depends on the batch size, so a split that follows the measured speed can
    # change the last bits of the logits from run to run; a fixed split makes seeded replies
    # reproducible on one machine and plan
    prefill_chunk: int = 0
    # speculative decoding: a draft GGUF with the model's vocabulary (None: no drafting)
    draft_model: str | None = None
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # the model's vision projector (mmproj GGUF): chat turns may then carry images (None: text
    # only, an image is VisionUnavailableError).
    mmproj: str | None = None
    # the encoder on the GPU (all its weights in VRAM: mtmd has no per-tensor placement; see
    # planner/vision.py for when that fits), its flash attention, and whether its context stays
    # open between images. False: opened for an image turn's encodes and freed once its
    # embeddings are in the KV cache, so its weights and compute buffer never sit beside the
    # LM's for longer than the image steps (each reopen reads the mmproj again). None: freed
    # when the encoder is on the GPU (its VRAM goes back to the game), kept on the CPU (host
    # memory is not what the game is short of, and rereading a 1.3 GB tower costs every turn)
    vision_gpu: bool = False
    vision_flash_attn: FlashAttn = "auto"
    vision_resident: bool | None = None
    vision_warmup: bool = False  # mtmd's warmup reserves for its largest image (Qwen: 1288 px)
    vision_max_tokens: int = 0  # per image, 0 = the model's limit; bounds the compute buffer

    @property
    def keeps_vision(self) -> bool:
        """Whether the vision context stays open between image turns (``vision_resident``)."""
        return self.vision_resident if self.vision_resident is not None else not self.vision_gpu

    @property
    def outputs_per_step(self) -> int:
        """Logits rows one step may ask for: one per session, plus the drafts it verifies
        (the planner's ``Workload.n_outputs``)."""
        return self.max_sessions * (1 + (self.speculative.k if self.draft_model else 0))


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
        self._vision: VisionContext | None = None
        self._vision_checked = False
        self._vision_plan = vision_plan
        self._lent_from: Plan | None = None  # the LM's placement while the encoder borrows
        self.vision_borrows = 0  # image turns that moved the LM for the encoder
        self.vision_opens = 0  # mtmd contexts opened by this engine (a reopen per image turn
        # when not resident)
        self._parked: bytes | None = None  # the context's state while no placement is loaded
        self._sessions: dict[str, Session] = {}
        self._free_seqs = list(range(self.config.max_sessions))
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
        self._drafter: Drafter | None = None
        self._acceptance: dict[str, Acceptance] = {}  # per session id
        self._spec_times = StepTimes()
        self._spec_totals = {"drafted": 0, "accepted": 0, "steps": 0}
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
                "speculative": self._speculative_status(), "vision": self._vision_status()}

    def _vision_status(self) -> dict[str, Any] | None:
        if not self.config.mmproj:
            return None
        vision = self._vision  # one read: the engine thread may close it meanwhile
        return {"open": vision is not None,
                "gpu": vision.options.use_gpu if vision is not None else None,
                "opens": self.vision_opens, "borrows": self.vision_borrows,
                "lent_from": self._lent_from.name if self._lent_from is not None else None}

    def _speculative_status(self) -> dict[str, Any]:
        drafter, totals = self._drafter, dict(self._spec_totals)
        times = self._spec_times
        return {
            "draft": str(drafter.path) if drafter else None,
            "draft_memory": drafter.memory if drafter else None,
            "k": self.config.speculative.k,
            **totals,
            "alpha": round(totals["accepted"] / totals["drafted"], 4) if totals["drafted"]
            else None,
            "step_s": {"plain": times.plain_s, "verify": times.verify_s, "draft": times.draft_s},
            "sessions": {sid: a.figures() for sid, a in list(self._acceptance.items())},
        }

    def drop_draft_async(self) -> Future[bool]:
        return self._submit(self._drop_draft)

    def drop_draft(self) -> bool:
        """Free the draft model (VRAM pressure: it is the first thing to go); replies in
        progress go on without drafting. True if there was one."""
        return self.drop_draft_async().result()

    def open_session_async(
        self,
        system_prompt: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        priority: int = 0,
        session_id: str | None = None,
    ) -> Future[str]:
        params = sampling or SamplingParams()
        return self._submit(lambda: self._open(system_prompt, params, priority, session_id))

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
        drafts = self._acceptance
        return {sid: {"tokens": len(s.tokens) + s.image_cells, "busy": s.turn is not None,
                      "priority": s.priority,
                      **({"draft": drafts[sid].figures()} if sid in drafts else {})}
                for sid, s in list(self._sessions.items())}

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
        out: Future[Generation] = Future()
        if max_tokens < 1:
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
        # start after commands sent after it.

        def relay(f: Future[Generation]) -> None:
            e = f.exception()
            if out.cancelled():  # the caller gave up on this chat: stop the reply it started
                if e is None:
                    f.result().cancel()
            elif e is None:
                out.set_result(f.result())
            else:
                out.set_exception(e)

        def prepared(f: Future[str | None]) -> None:
            e = f.exception()
            if out.cancelled():
                return
            if e is not None:
                out.set_exception(e)
                return
            start(f.result()).add_done_callback(relay)

        try:
            self._io.submit(prepare_grammar, grammar, json_schema).add_done_callback(prepared)
        except RuntimeError:  # the I/O pool is shut down: the engine is closing
            out.set_exception(EngineClosedError("the engine is closed"))
        return out

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
        return _then(self._submit(lambda: self._snapshot(session_id)),
                     lambda parts: snapshot.pack(*parts), self._io)

    def snapshot(self, session_id: str) -> bytes:
        """The session's whole state (KV cache + conversation) as bytes; it must be idle."""
        return self.snapshot_async(session_id).result()

    def restore_async(self, data: bytes, *, session_id: str | None = None) -> Future[str]:
        # the bytes are verified (length, checksum) on the I/O thread before the engine sees them
        return _chain(self._on_io(lambda: snapshot.unpack(data)),
                      lambda unpacked: self._submit(lambda: self._restore(*unpacked, session_id)))

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
        return _then(self._submit(lambda: self._snapshot(session_id)),
                     lambda parts: snapshot.save(target, snapshot.parts(*parts)), self._io)

    def save_session(self, session_id: str, path: str | Path) -> None:
        self.save_session_async(session_id, path).result()

    def load_session_async(self, path: str | Path, *,
                           session_id: str | None = None) -> Future[str]:
        p = Path(path)

        def read() -> tuple[dict[str, Any], memoryview]:
            try:
                data = p.read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                raise InvalidStateError(f"no session save '{p.name}'") from None
            except OSError as e:
                if e.errno == errno.ENAMETOOLONG:
                    raise InvalidStateError(f"no session save '{p.name[:64]}...' (the name is "
                                            "too long for the file system)") from None
                raise snapshot.io_error(e, p.name, "read") from None
            return snapshot.unpack(data)

        return _chain(self._on_io(read), lambda unpacked: self._submit(
            lambda: self._restore(*unpacked, session_id)))

    def load_session(self, path: str | Path, *, session_id: str | None = None) -> str:
        return self.load_session_async(path, session_id=session_id).result()

    def _on_io(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the I/O thread (file work and checksums stay off the engine thread)."""
        try:
            return self._io.submit(fn)
        except RuntimeError:  # the pool is shut down: the engine is closing
            fut: Future[T] = Future()
            fut.set_exception(EngineClosedError("the engine is closed"))
            return fut

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
                self._load_draft(self.config.draft_model)
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
            if self._lent_from is not None:
                self._give_back()

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
            self._drop_draft()
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
        if self.config.mmproj and (self._keeps_vision or not self._vision_checked):
            try:  # mtmd keeps the model's vocabulary: opened after it, closed before it
                self._open_vision(check=not self._keeps_vision)
            except BaseException:
                self._unload()
                raise
            self._vision_checked = True
            self._vision_idle()

    def _vision_options(self, *, check: bool = False, gpu: bool | None = None) -> VisionOptions:
        c = self.config
        if check:  # the first load's check that the mmproj fits the model: no VRAM for it
            return VisionOptions(n_threads=c.n_threads)
        return VisionOptions(use_gpu=c.vision_gpu if gpu is None else gpu,
                             flash_attn=c.vision_flash_attn,
                             n_threads=c.n_threads, warmup=c.vision_warmup,
                             image_max_tokens=c.vision_max_tokens)

    def _open_vision(self, *, check: bool = False) -> VisionContext:
        """The vision context, opened if it is not (engine thread)."""
        if self._vision is None:
            if not self.config.mmproj:
                raise VisionUnavailableError(
                    "this model was loaded without a vision projector (mmproj): it cannot see "
                    "images; load it with its mmproj, or send the line without images")
            gpu = None if check else self._place_encoder()
            self._vision = VisionContext(self._model, self.config.mmproj,
                                         self._vision_options(check=check, gpu=gpu))
            self.vision_opens += 1
        return self._vision

    @property
    def _keeps_vision(self) -> bool:
        # an encoder that borrows the LM's VRAM must give it back after every image turn
        return self.config.keeps_vision and self._vision_plan is None

    def _place_encoder(self) -> bool:
        """Whether the encoder about to open goes on the GPU, moving the LM to
        ``vision_plan``'s placement first where that is smaller (engine thread). A placement
        that fails to load puts the old one back and raises its typed error."""
        if not self.config.vision_gpu:
            return False
        if self._vision_plan is None or self._lent_from is not None:
            return True
        target = self._vision_plan(self.plan)
        if target is None:
            return False
        if target != self.plan:
            main = self.plan
            self._move(target)
            self._lent_from = main
            self.vision_borrows += 1
        return True

    def _give_back(self) -> None:
        """Once the encoder is closed, move the LM back to the placement it lent from. If that
        fails the LM stays on the smaller one, which fits (loaded a moment ago)."""
        if self._lent_from is None or self._vision is not None:
            return
        main, self._lent_from = self._lent_from, None
        try:
            self._move(main)
        except IgiError as e:
            log.warning("could not move the model back after an image turn (%s); it stays on "
                        "the placement used for the encoder", e)

    def _move(self, plan: Plan) -> None:
        """Reshard to ``plan`` on the engine thread, keeping every session and reply; on a
        failed load the previous placement is loaded again and the error raised."""
        previous = self.plan
        ops = EngineOps(self)
        ops.park_and_release(briefly=True)
        try:
            ops.load_and_restore(plan)
        except IgiError:
            try:
                ops.load_and_restore(previous)
            except BaseException:
                self.state = "unavailable"  # nothing loads: the arbiter's recovery takes over
                raise
            raise

    def _vision_idle(self) -> None:
        """Free a non-resident vision context once no reply has an image left to encode."""
        if self._keeps_vision or self._vision is None:
            return
        if any(t.images for t in self._active_turns()):
            return
        vision, self._vision = self._vision, None
        vision.close()

    def _load_draft(self, path: str | Path) -> None:
        c = self.config
        assert self._vocab is not None
        # its sequences mirror the sessions', plus the drafts beyond them
        settings = ContextSettings(draft_n_ctx(c.n_ctx, c.max_sessions, c.speculative.k),
                                   c.max_sessions, c.n_batch, c.n_threads)
        self._drafter = Drafter(path, self._vocab.vocab, settings,
                                self.plan.copy_compute_min_batch)

    def _drop_draft(self) -> bool:
        drafter, self._drafter = self._drafter, None
        if drafter is not None:
            drafter.close()
        return drafter is not None

    def _unload(self) -> None:
        """Free the placement; every handle into it is dropped with it."""
        vision, self._vision = self._vision, None
        if vision is not None:  # its chunks of pending images too: they are made again
            vision.close()
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

    def _get(self, session_id: str) -> Session:
        s = self._sessions.get(session_id)
        if s is None:
            raise UnknownSessionError(f"no session '{session_id}' (closed, or never opened)")
        return s

    def _open(
        self, system_prompt: str | None, params: SamplingParams, priority: int, sid: str | None
    ) -> str:
        if not self._free_seqs:
            raise TooManySessionsError(
                f"all {self.config.max_sessions} session slots are in use; close one first"
            )
        sid = sid or uuid.uuid4().hex[:12]
        if sid in self._sessions:
            raise SessionBusyError(f"session '{sid}' already exists")
        messages = ([{"role": "system", "content": system_prompt.replace(
                        image_turn.IMAGE_SLOT, "")}]
                    if system_prompt else [])
        seq = self._free_seqs.pop(0)
        self._sessions[sid] = Session(sid, seq, params, priority, messages)
        return sid

    def _close_session(self, sid: str) -> None:
        s = self._get(sid)
        if s.turn is not None:
            self._end_turn(s.turn, error=GenerationCancelled(f"session '{sid}' was closed"))
        if self._mem is not None:  # else: dropped when the parked state is put back
            llama_cpp.llama_memory_seq_rm(self._mem, s.seq, -1, -1)
        if self._drafter is not None:
            self._drafter.forget(s.seq)
        self._acceptance.pop(sid, None)
        del self._sessions[sid]
        self._free_seqs.append(s.seq)
        self._free_seqs.sort()

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
        s = self._get(sid)
        if s.turn is not None:
            raise SessionBusyError(f"session '{sid}' is still replying; cancel it or wait")
        vocab = self._need_vocab()
        if images and not self.config.mmproj:
            self._open_vision()  # VisionUnavailableError
        # the chat template is C text: a NUL would cut the message short; an image is a slot
        # character in the content (image_turn.py), which player text cannot hold
        marker = self._vision_options().media_marker if self.config.mmproj else ""
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
            self._check_prompt(n_prompt, base, pending)
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

    def _check_prompt(self, n_prompt: int, base: int, pending: list[Any]) -> None:
        """A line of ``n_prompt`` KV cells after ``base`` must fit (PromptTooLongError)."""
        if n_prompt == 0:
            raise PromptTooLongError("the chat template produced no tokens for this line")
        images = image_turn.cells(pending) - sum(len(p.after) for p in pending)
        of_images = f" ({images} of them for its images)" if images else ""
        if base + n_prompt + 1 > self.config.n_ctx - 1:
            raise PromptTooLongError(
                f"this line needs {n_prompt} tokens{of_images} and the conversation already "
                f"holds {base}; the context has {self.config.n_ctx}. Shorten the line, send "
                "smaller or fewer images, or open a new session"
            )
        if self.config.max_prompt_tokens and n_prompt > self.config.max_prompt_tokens:
            raise PromptTooLongError(
                f"this line is {n_prompt} tokens{of_images}; the limit is "
                f"{self.config.max_prompt_tokens}"
            )

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
        waiting = [t for t in turns if t.images and not t.feed]
        if waiting:  # an image is a step of its own: the encoder, then its embeddings
            self._image_step(waiting[0])
            return
        budget = self._token_budget()
        drafts = self._propose(turns, budget)
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
                "the shared context is full; close idle sessions or raise n_ctx"))
            return
        if rc != 0:
            for t, _, _ in fed:
                self._rollback(t)
                self._end_turn(t, error=InferenceError(f"llama_decode failed ({rc})"))
            return
        for t, take, idx in fed:
            proposal = drafts.get(t.session.seq)
            if proposal is not None:
                self._verify(t, proposal)
                continue
            t.session.tokens.extend(t.feed[:take])
            del t.feed[:take]
            if idx >= 0:
                self._sample(t, idx)

    def _image_step(self, t: Turn) -> None:
        try:
            image_turn.eval_next(self._open_vision(), self._ctx, t, self._batch_cap)
        except IgiError as e:  # a full context, an encoder failure: this reply ends, typed
            self._rollback(t)
            self._end_turn(t, error=e)
        self._vision_idle()  # the embeddings are in the KV cache: the encoder can go

    def _time_step(self, fed: list[tuple[Turn, int, int]], drafts: dict[int, Proposal],
                   seconds: float) -> None:
        if not drafts:
            self._learn_speed(self._batch.n_tokens, seconds)
        if any(take != 1 for _t, take, _ in fed):
            return  # a prompt chunk rode along: not a decode step's time
        decay = self.config.speculative.decay
        self._spec_times.add("verify_s" if drafts else "plain_s", seconds, decay)

    def _token_budget(self) -> int:
        """Tokens for the next step: about ``max_step_s`` of work at the measured speed."""
        cap = self._batch_cap
        plan = self.plan
        if plan.op_offload and self.gpu is not None and plan.n_ubatch > 1:
            # each chunk streams the CPU-resident weights once: smaller chunks multiply that
            floor = min(cap, plan.n_ubatch)
        else:
            floor = 1
        if self.config.prefill_chunk > 0:
            budget = self.config.prefill_chunk
        elif self._token_s is None:
            budget = _PROBE_CHUNK
        else:
            budget = int(self.config.max_step_s / max(self._token_s, 1e-7))
        n = max(floor, min(cap, budget))
        self.step_stats["chunk"] = n
        return n

    def _learn_speed(self, n_tokens: int, seconds: float) -> None:
        if n_tokens < 8:  # single-token steps are dominated by fixed costs
            return
        per = seconds / n_tokens
        self._token_s = per if self._token_s is None else 0.7 * self._token_s + 0.3 * per

    def _fill_batch(self, turns: list[Turn], budget: int,
                    drafts: dict[int, Proposal] | None = None) -> list[tuple[Turn, int, int]]:
        """Put up to ``budget`` pending tokens in the (reused) llama_batch; every decoding
        reply gets its one token even past the budget (bounded by the session count). Then
        the drafts (:meth:`_add_drafts`).

        Returns (turn, tokens taken, batch index of its logits or -1) per turn fed."""
        batch, cap = self._batch, self._batch_cap
        fed: list[tuple[Turn, int, int]] = []
        n = 0
        for t in turns:
            room = max(budget - n, 1 if len(t.feed) == 1 else 0)
            take = min(len(t.feed), room, cap - n)
            if take <= 0:
                continue
            pos0, seq = len(t.session.tokens), t.session.seq
            for i in range(take):
                batch.token[n + i] = t.feed[i]
                batch.pos[n + i] = pos0 + i
                batch.n_seq_id[n + i] = 1
                batch.seq_id[n + i][0] = seq
                batch.logits[n + i] = 0
            # the prompt is complete (no image left to read): sample after it
            wants_logits = take == len(t.feed) and not t.images
            if wants_logits:
                batch.logits[n + take - 1] = 1
            fed.append((t, take, n + take - 1 if wants_logits else -1))
            n += take
        batch.n_tokens = n
        if drafts:
            self._add_drafts(fed, drafts)
        return fed

    def _add_drafts(self, fed: list[tuple[Turn, int, int]], drafts: dict[int, Proposal]) -> None:
        """Append the drafts of the decoding replies after the step's plain tokens, logits at
        each: the plain tokens (and so the split of prompts into chunks) and their KV cells are
        those of a step without drafts; drafts past the batch's capacity are cut."""
        batch = self._batch
        n = batch.n_tokens
        room = self._batch_cap - n
        # logits rows: llama.cpp aborts past the context's n_outputs_max
        rows = min(room, self._outputs_cap - sum(1 for _, _, idx in fed if idx >= 0))
        for t, take, idx in fed:
            proposal = drafts.get(t.session.seq)
            if proposal is None:
                continue
            keep = min(len(proposal.tokens), rows) if take == 1 and idx >= 0 else 0
            if keep == 0:
                del drafts[t.session.seq]
                continue
            del proposal.tokens[keep:], proposal.dists[keep:]
            pos0, seq = len(t.session.tokens) + 1, t.session.seq
            proposal.rows = [idx, *range(n, n + keep)]
            for i, tok in enumerate(proposal.tokens):
                put_token(batch, n + i, tok, pos0 + i, seq, True)
            n += keep
            rows -= keep
        batch.n_tokens = n

    def _sample(self, t: Turn, idx: int) -> None:
        assert t.chain is not None
        self._take(t, t.chain.sample(self._ctx, idx, t.session.n_sampled))

    def _take(self, t: Turn, tok: int) -> bool:
        """Add a sampled token to the reply (emit text, stop strings, end of turn); False once
        the reply has ended. ``t.feed`` must be empty (what was fed is decoded)."""
        assert self._vocab is not None
        s = t.session
        s.n_sampled += 1
        s.history.append(tok)
        if t.t_first is None:
            t.t_first = time.perf_counter()
        if self._vocab.is_eog(tok) and not t.ignore_eos:
            t.generated.append(tok)
            self._end_turn(t, reason="stop")
            return False
        t.generated.append(tok)
        t.raw += t.decoder.decode(self._vocab.piece(tok))
        visible_end, hit = stop_scan(t.raw, t.emitted, t.stop)
        if hit:
            t.session.pending = [tok]
            self._emit_upto(t, visible_end)
            self._end_turn(t, reason="stop_string", visible_end=visible_end)
            return False
        self._emit_upto(t, visible_end)
        if len(t.generated) >= t.max_tokens:
            t.session.pending = [tok]
            self._end_turn(t, reason="length")
            return False
        t.feed = [tok]
        return True

    # ============================================================ engine thread: drafting

    def _propose(self, turns: list[Turn], budget: int) -> dict[int, Proposal]:
        """Draft tokens for the decoding replies where drafting is on (by sequence). They come
        on top of the step's token budget (at most k per decoding reply), so that prompt chunks
        are split as without drafts; the draft's catch-up is bounded by the budget."""
        drafter, cfg = self._drafter, self.config.speculative
        if drafter is None or (cfg.adaptive and self._spec_times.plain_count < cfg.warmup_steps):
            return {}  # adaptive: a plain step's time is known before anything is drafted
        requests: list[DraftRequest] = []
        for t in turns:
            k = self._draft_k(t)
            if k <= 0:
                continue
            s = t.session
            sampled = not s.params.greedy
            requests.append(DraftRequest(
                s.seq, [*s.tokens, t.feed[0]], k, s.params, s.history,
                # the step's draws, reproducible from the session's seed and step
                np.random.default_rng([s.params.seed, s.n_sampled, 0x5bec]) if sampled
                else None))
        if not requests:
            return {}
        t0 = time.perf_counter()
        proposals, decodes = drafter.propose(requests, catch_up=budget)
        if decodes:
            self._spec_times.add("draft_s", (time.perf_counter() - t0) / decodes, cfg.decay)
        return proposals

    def _draft_k(self, t: Turn) -> int:
        """Tokens to draft for ``t`` this step (0: none). Off for grammar replies: the draft
        proposes unconstrained text that the grammar would mostly refuse."""
        s, cfg = t.session, self.config.speculative
        if len(t.feed) != 1 or t.grammar is not None or t.chain is None or s.n_images:
            return 0  # the draft cannot see images
        k = min(cfg.k,
                t.max_tokens - len(t.generated) - 1,  # the reply's last token needs no draft
                self.config.n_ctx - len(s.tokens) - 3)  # as a plain step, the context allows
        if k <= 0:
            return 0
        acceptance = self._acceptance.setdefault(s.id, Acceptance())
        return k if acceptance.wants_draft(cfg) else 0

    def _verify(self, t: Turn, proposal: Proposal) -> None:
        """Walk the verify positions (the fed token, then the drafts; logits at the batch rows
        ``proposal.rows``): keep drafts while the target agrees, take the target's token at the
        first disagreement, and cut the cache after the last position used."""
        s, cfg = t.session, self.config.speculative
        fed = [t.feed[0], *proposal.tokens]
        used = kept = 0
        for i in range(len(fed)):
            tok, agreed = self._verify_pick(t, proposal.rows[i], proposal, i)
            used, kept = i + 1, kept + agreed
            t.feed = []
            if not self._take(t, tok) or not agreed:
                break
        # the cache keeps the tokens whose logits were used; the last pick is the next feed
        s.tokens.extend(fed[:used])
        llama_cpp.llama_memory_seq_rm(self._mem, s.seq, len(s.tokens), -1)
        k = len(proposal.tokens)
        acceptance = self._acceptance.setdefault(s.id, Acceptance())
        acceptance.record(k, kept, cfg.decay)
        acceptance.judge(cfg, self._spec_times.break_even(k))
        self._spec_totals["drafted"] += k
        self._spec_totals["accepted"] += kept
        self._spec_totals["steps"] += 1

    def _verify_pick(self, t: Turn, idx: int, proposal: Proposal, i: int) -> tuple[int, bool]:
        """The target's token at verify position ``i``, and whether it keeps draft ``i``."""
        assert t.chain is not None and self._vocab is not None
        s, k = t.session, len(proposal.tokens)
        if i == k or proposal.rng is None:
            # greedy (the chain's pick, exactly as without a draft), or the bonus token after k
            # kept drafts (an ordinary sample from the target)
            tok = t.chain.sample(self._ctx, idx, s.n_sampled)
            return tok, i < k and tok == proposal.tokens[i]
        p = t.chain.distribution(self._ctx, idx, self._vocab.n_tokens)
        tok, kept = speculative_pick(p, proposal.dists[i], proposal.tokens[i], proposal.rng)
        t.chain.accept(tok)  # penalties and grammar see it as if sampled
        return tok, kept

    def _emit_upto(self, t: Turn, end: int) -> None:
        if end > t.emitted:
            t.handle._emit(t.raw[t.emitted : end])
            t.emitted = end

    def _rollback(self, t: Turn) -> None:
        """Undo a turn that produced nothing: the conversation is as before the request."""
        s = t.session
        if self._mem is not None:  # else: trimmed when the parked state is put back
            llama_cpp.llama_memory_seq_rm(self._mem, s.seq, t.start_tokens, -1)
        del s.tokens[t.start_tokens :]
        if t.media is not None:
            t.media.restore(s)
        s.pending = list(t.start_pending)
        s.messages = s.messages[:-1]

    def _end_turn(
        self,
        t: Turn,
        *,
        reason: str = "stop",
        error: BaseException | None = None,
        visible_end: int | None = None,
    ) -> None:
        s = t.session
        if t.chain is not None:
            t.chain.close()
            t.chain = None
        image_turn.release(t.images)
        s.turn = None
        self._vision_idle()
        if error is None and not t.generated and reason == "cancelled":
            # cancelled before the first token: as if the line was never said
            self._rollback(t)
        elif error is None:
            if t.feed and t.generated:  # sampled but not decoded yet
                s.pending = [t.generated[-1]]
            t.raw += t.decoder.decode(b"", final=True)
            if visible_end is None:
                visible_end, _ = stop_scan(t.raw, t.emitted, t.stop, final=True)
                self._emit_upto(t, visible_end)
            # NUL bytes (a byte-level token can decode to one) cannot go through the C chat
            # template: leave them out of both sides so the next turn's prefix still matches
            said = image_turn.clean(t.raw)
            s.messages.append({"role": "assistant", "content": said})
            s.committed_text = t.prompt_text + said
        now = time.perf_counter()
        if error is not None:
            t.handle._fail(error)
            return
        t.handle._finish(GenerationResult(
            session_id=s.id,
            text=t.raw[:visible_end],
            tokens=tuple(t.generated),
            finish_reason=reason,
            prompt_tokens=t.prompt_tokens,
            completion_tokens=len(t.generated),
            ttft_s=(t.t_first or now) - t.t0,
            total_s=now - t.t0,
        ))

    # ============================================================ engine thread: state

    def _fingerprint(self) -> dict[str, Any]:
        a = self.inventory.arch
        return {"arch": a.architecture, "n_layers": a.n_layers, "n_embd": a.n_embd,
                "n_vocab": a.n_vocab, "tensors_bytes": self.inventory.total_bytes()}

    def _snapshot(self, sid: str) -> tuple[bytes, bytes]:
        """(JSON header, KV bytes) of an idle session; packing them into the file format (a
        copy and a checksum over the whole state) is left to the I/O thread."""
        s = self._get(sid)
        if s.turn is not None:
            raise SessionBusyError(f"session '{sid}' is replying; snapshot it when it is idle")
        self._need_vocab()
        if s.reread:
            raise EngineUnavailableError(
                f"session '{sid}' is re-reading its conversation after a lost placement; save "
                "it after its next reply")
        kv = self._seq_state(s.seq)
        meta = {
            "model": self._fingerprint(), "kv_format": self._kv_format(),
            "params": s.params.model_dump(),
            "priority": s.priority, "messages": s.messages, "committed_text": s.committed_text,
            "tokens": s.tokens, "pending": s.pending, "history": s.history[-4096:],
            "n_sampled": s.n_sampled, "image_cells": s.image_cells, "n_images": s.n_images,
        }
        return snapshot.header(meta), kv  # the header is encoded here: the lists are live

    def _seq_state(self, seq: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        return snapshot.copy_out(size, lambda buf: llama_cpp.llama_state_seq_get_data(
            self._ctx, buf, size, seq))

    def _set_seq_state(self, seq: int, kv: bytes | memoryview) -> bool:
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        if not kv:
            return True
        buf = (ctypes.c_uint8 * len(kv)).from_buffer_copy(kv)
        return llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(kv), seq) > 0

    def _restore(self, meta: dict[str, Any], kv: bytes | memoryview, sid: str | None) -> str:
        """A session from a verified snapshot (:func:`snapshot.unpack`). Everything is checked
        before a session slot is taken, and a failure after that gives the slot back."""
        self._need_vocab()
        if meta.get("model") != self._fingerprint():
            raise InvalidStateError("this session was saved with another model")
        try:
            fields = _snapshot_fields(meta, self.inventory.arch.n_vocab)
        except Exception as e:  # noqa: BLE001 - a well-formed file with bad content
            raise InvalidStateError(f"damaged session snapshot: {e}") from None
        params, messages, committed, tokens, pending, history, n_sampled, priority = fields[:8]
        image_cells, n_images = fields[8:]
        if len(tokens) + image_cells >= self.config.n_ctx:
            raise InvalidStateError("the saved session is longer than this engine's context")
        if tokens and not kv:
            raise InvalidStateError("the session snapshot has a conversation but no KV state")
        same_format = meta.get("kv_format", self._kv_format()) == self._kv_format()
        if n_images and not same_format:
            raise InvalidStateError(
                "this session has images and was saved with another KV cache format: its cells "
                "cannot be read here and saves do not keep images to re-read it")
        new_id = self._open(None, params, priority, sid)
        s = self._sessions[new_id]
        try:
            restored = self._set_seq_state(s.seq, kv) if same_format else True
        except BaseException:
            self._close_session(new_id)
            raise
        if not restored:
            self._close_session(new_id)
            raise InvalidStateError(
                "llama.cpp rejected the saved KV state (no room in the context, or damaged)"
            )
        s.messages, s.committed_text, s.tokens = messages, committed, tokens
        s.pending, s.history, s.n_sampled = pending, history, n_sampled
        s.image_cells, s.n_images = image_cells, n_images
        if not same_format:
            # saved on a plan with another KV format (a q8_0 cache, restored on an f16 one):
            # llama.cpp cannot read those cells, so the conversation is read again on its
            # next turn instead
            s.tokens, s.pending, s.reread = [], [], True
        return new_id

    def _kv_format(self) -> str:
        """The KV cache's cell format ("f16/f16", "q8_0/q8_0"): saves record it, since
        llama.cpp reads a sequence's cells back only into a cache of the same format."""
        return f"{self.plan.type_k}/{self.plan.type_v}"

    def _ctx_state(self) -> bytes:
        size = llama_cpp.llama_state_get_size(self._ctx)
        return snapshot.copy_out(size, lambda buf: llama_cpp.llama_state_get_data(
            self._ctx, buf, size))

    def _set_ctx_state(self, data: bytes) -> bool:
        buf = (ctypes.c_uint8 * max(len(data), 1)).from_buffer_copy(data or b"\0")
        return llama_cpp.llama_state_set_data(self._ctx, buf, len(data)) == len(data)


def _snapshot_fields(meta: dict[str, Any], n_vocab: int) -> tuple[Any, ...]:
    """The typed fields of a snapshot header (ValueError/TypeError/KeyError if any is wrong)."""

    def token_list(key: str) -> list[int]:
        xs = meta[key]
        if not isinstance(xs, list) or not all(
                type(x) is int and 0 <= x < n_vocab for x in xs):
            raise ValueError(f"'{key}' is not a list of token ids")
        return xs

    def integer(key: str, default: int | None = None) -> int:
        x = meta.get(key, default)
        if type(x) is not int:
            raise ValueError(f"'{key}' is not an integer")
        return x

    messages, committed = meta["messages"], meta["committed_text"]
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("'messages' is not a list of chat messages")
    if not isinstance(committed, str):
        raise ValueError("'committed_text' is not text")
    if not isinstance(meta["params"], dict):
        raise ValueError("'params' is not a map")
    n_sampled = integer("n_sampled")
    if n_sampled < 0:
        raise ValueError("'n_sampled' is negative")
    image_cells, n_images = integer("image_cells", 0), integer("n_images", 0)
    if image_cells < 0 or n_images < 0:
        raise ValueError("'image_cells' or 'n_images' is negative")
    return (SamplingParams(**meta["params"]), messages, committed, token_list("tokens"),
            token_list("pending"), token_list("history"), n_sampled, integer("priority", 0),
            image_cells, n_images)


def _chain(first: Future, then: Callable[[Any], Future[T]]) -> Future[T]:
    """A future of ``then(result of first)``'s result: ``then`` is called (on the thread that
    finished ``first``) and must return at once with a future; nothing blocks on the way."""
    out: Future[T] = Future()

    def relay(f: Future) -> None:
        try:
            out.set_result(f.result())
        except BaseException as e:  # noqa: BLE001 - handed on
            out.set_exception(e)

    def step(f: Future) -> None:
        try:
            then(f.result()).add_done_callback(relay)
        except BaseException as e:  # noqa: BLE001 - handed on
            out.set_exception(e)

    first.add_done_callback(step)
    return out


class EngineOps:
    """The low-level steps of a reshard, valid only inside :meth:`Engine.exclusive` (on the
    engine thread). The order and the fallbacks are the caller's (the arbiter's state
    machine); these only guarantee that a failed step leaves no dangling handle."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    @property
    def plan(self) -> Plan:
        return self._e.plan

    @property
    def loaded(self) -> bool:
        return self._e._ctx is not None

    def park_and_release(self, *, briefly: bool = False) -> None:
        """Copy the whole context's state to host memory, then free the placement (``briefly``:
        the engine thread loads another at once, so the engine is not shown as unavailable
        meanwhile, and the arbiter does not step in).

        The whole context, not one sequence at a time: llama.cpp puts it back cell for cell in
        the same order, so attention sums over the same layout and replies continue bit for bit
        where the arithmetic is the same (per-sequence restores regroup the cells)."""
        e = self._e
        if e._ctx is None:
            return  # already released (unavailable): the parked state is still there
        e._parked = e._ctx_state()
        for s in e._sessions.values():
            if s.turn and s.turn.chain:  # grammar samplers point into the old vocab
                s.turn.chain.close()
                s.turn.chain = None
        e._unload()
        if not briefly:
            e.state = "unavailable"

    def load_and_restore(self, plan: Plan) -> None:
        """Load ``plan`` and put the parked state back; raises the load's typed error and
        leaves the engine unloaded (and the state parked) when it fails."""
        e = self._e
        if e._ctx is not None:
            raise InvalidStateError("release the current placement first")
        e._lent_from = None  # a reshard from outside decides the placement from here on
        t0 = time.perf_counter()
        e._load(plan)  # frees whatever it allocated when it fails
        e.state = "ready"
        parked, e._parked = e._parked, None
        lost = parked is not None and not e._set_ctx_state(parked)
        for s in e._sessions.values():
            # the parked state holds what the sessions held when it was taken: drop what
            # closed sessions and rolled-back turns left behind since
            if lost:
                llama_cpp.llama_memory_seq_rm(e._mem, s.seq, -1, -1)
                s.tokens, s.pending, s.reread, s.image_cells = [], [], True, 0
            else:
                llama_cpp.llama_memory_seq_rm(e._mem, s.seq, len(s.tokens), -1)
        used = {s.seq for s in e._sessions.values()}
        for seq in range(e.config.max_sessions):
            if seq not in used:
                llama_cpp.llama_memory_seq_rm(e._mem, seq, -1, -1)
        for s in e._sessions.values():
            if s.turn is None:
                continue
            if lost:  # its tokens are gone with the cache: end it, the conversation stays
                e._rollback(s.turn)
                e._end_turn(s.turn, error=InferenceError(
                    "the reply was interrupted while the model moved; send the line again"))
            else:
                s.turn.chain = e._make_chain(s.turn)
        if lost:
            log.error("the parked state did not restore; sessions will re-read their history")
        e.reshard_count += 1
        e.last_reshard_s = time.perf_counter() - t0

    def fail_active(self, error: IgiError) -> None:
        """End every active reply with ``error`` (no placement could be loaded); each turn is
        rolled back, so the conversation is as before the line."""
        e = self._e
        for t in e._active_turns():
            e._rollback(t)
            e._end_turn(t, error=error)


def _then(fut: Future, fn: Callable[[Any], T], pool: ThreadPoolExecutor) -> Future[T]:
    """A future of ``fn(result of fut)``, run on ``pool`` (errors pass through)."""
    out: Future[T] = Future()

    def done(f: Future) -> None:
        try:
            value = f.result()
        except BaseException as e:  # noqa: BLE001 - handed on
            out.set_exception(e)
            return

        def run() -> None:
            try:
                out.set_result(fn(value))
            except BaseException as e:  # noqa: BLE001 - handed on
                out.set_exception(e)

        try:
            pool.submit(run)
        except RuntimeError:  # the pool is shut down: the engine is closing
            out.set_exception(EngineClosedError("the engine is closed"))

    fut.add_done_callback(done)
    return out
