"""The engine thread: the state it owns and everything it runs (runtime/engine.py's ``Engine``
is the thin facade other threads use).

:class:`EngineCore` takes typed commands (runtime/commands.py) from one queue, runs decode steps
between them as the pure scheduler decides (runtime/scheduler.py), and posts every outcome and
every reply's events to the outbox (igi_sdk/events.py). It owns the loaded :class:`Placement`,
the sessions and their turns, the parked state of a reshard, the vision encoder and the draft
model. Its reads for ``stats`` and listings (``status``, ``context_status``, ``session_info``)
are safe from any thread; everything else runs on the engine thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp

from igi_sdk import threads
from igi_sdk.errors import (
    ContextFullError,
    EngineClosedError,
    EngineUnavailableError,
    GenerationCancelled,
    IgiError,
    InferenceError,
    InvalidStateError,
    SessionBusyError,
    VisionUnavailableError,
)
from igi_sdk.events import Outbox, SessionFigures
from igi_sdk.model import ModelInventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import (
    _native,
    abort,
    background_load,
    batching,
    engine_ops,
    engine_state,
    image_turn,
    kv_cells,
    launch_ahead,
    loader,
    memory_turn,
    oneshot,
    prefix,
    replies,
    scheduler,
    tools,
)
from igi_sdk.runtime import commands as C
from igi_sdk.runtime.batching import Fed
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.context_share import Admit, ContextShare
from igi_sdk.runtime.crowd import CrowdWatch
from igi_sdk.runtime.devices import Device
from igi_sdk.runtime.drafting import Drafting
from igi_sdk.runtime.encoder import Encoder, EncoderRoom
from igi_sdk.runtime.engine_ops import LoadOutcome
from igi_sdk.runtime.generation import Generation
from igi_sdk.runtime.image_turn import ImageInput, MediaMark
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.overrides import LoadReport
from igi_sdk.runtime.placement import Placement
from igi_sdk.runtime.sampling import SamplerChain, SamplingOverride
from igi_sdk.runtime.session import Session, SessionTable, Turn
from igi_sdk.runtime.speculative import Proposal
from igi_sdk.runtime.text import Part, Vocab, parts_after
from igi_sdk.runtime.threadpool import ThreadRunner
from igi_sdk.runtime.vision import VisionContext

__all__ = ["EngineCore"]

T = TypeVar("T")
log = logging.getLogger("igi_sdk.runtime")


class EngineCore:
    """One model's engine-thread state and loop (see the module doc)."""

    def __init__(self, model_path: Path, inventory: ModelInventory, plan: Plan,
                 config: EngineConfig, *, progress: Callable[[float], None] | None,
                 encoder_room: EncoderRoom | None, outbox: Outbox) -> None:
        self.model_path, self.inventory, self.config = model_path, inventory, config
        self.plan = plan
        self.report = LoadReport()
        self.gpu: Device | None = None
        self.reshard_count = 0
        self.last_reshard_s = 0.0
        self.last_load_s: float | None = None  # the last placement's load (what a grow costs)
        # the last move's parts: state parked (MB), seconds to park, close, restore
        self.last_move: dict[str, float] = {}
        self.state = "loading"  # "ready" | "moving" | "unavailable" | "closed"
        self._progress = progress
        self._placed: Placement | None = None
        self._encoder = Encoder(config, encoder_room)
        self._embedder = oneshot.Embedder()  # opened on the first embed, closed with placements
        # the context's state while no placement is loaded, in the one buffer kept for it
        self._parked: engine_state.ParkedState | None = None
        self._park_buffer = engine_state.ParkBuffer()
        # the warm all-CPU placement (config.standby) and the placement loading behind the
        # decode (runtime/background_load.py): the job, the LoadFirstFitting it answers, the
        # candidates left after it and the failures so far
        self._host: Placement | None = None
        self._host_job: background_load.LoadJob | None = None
        self._job: background_load.LoadJob | None = None
        self._job_for: C.LoadFirstFitting | None = None
        self._job_rest: list[Plan] = []
        self._job_failures: list[tuple[str, str]] = []
        self._job_t0 = 0.0
        self._tickets = 0
        self._held: deque[C.Command] = deque()  # model work waiting for a reshard to end
        self._unsent: list[Callable[[], None]] = []  # reply events for the next decode
        self._launched = False  # the step in progress has called llama_decode
        # the decode launched ahead of its step (_launch_ahead), read by the next step
        self._in_flight: launch_ahead.InFlight | None = None
        self._taken: C.Command | None = None  # the command the loop holds, not yet run
        # the last llama_decode: its call's seconds, and from the call to its logits read
        self._decode_call_s = self._decode_step_s = 0.0
        self._table = SessionTable(config.max_sessions)
        # who may take how many KV cells: one line cannot starve the other sessions
        self.share = ContextShare.of(config.n_ctx, config.max_sessions, config.context_floor,
                                     config.session_ctx)
        self._sessions: dict[str, Session] = self._table.by_id  # the table's, by id
        self._turn_counter = 0
        self._commands: queue.SimpleQueue[C.Command] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        self._closed = False
        self._outbox = outbox
        # frame pacing (pause between steps, until when): one tuple, replaced whole by any
        # thread (a frame report) and read once per step
        self.pacing: tuple[float, float] = (0.0, float("inf"))
        self._steps = 0
        self._token_s: float | None = None  # measured seconds per prompt token on this plan
        self._decode_s: float | None = None  # measured time of a step of decoding replies alone
        # (token_s, decode_s) measured on each placement decoded on before
        self._speeds: dict[PlanKey, tuple[float | None, float | None]] = {}
        self._placed_before: PlanKey | None = None
        # target_s: the last step's target length (longer while NPCs wait to start beside
        # talking ones: scheduler.step_target); chunk: its token budget
        self.step_stats = {"max_s": 0.0, "last_s": 0.0, "chunk": 0, "failures": 0,
                           "interrupted": 0, "target_s": 0.0, "reclaimed": 0,
                           "shared_prefix_tokens": 0, "launched_ahead": 0,
                           "ahead_dropped": 0}
        self._drafting = Drafting(config, self._take)
        self.crowd = CrowdWatch(config.talking)  # engine thread writes, stats reads
        # the CPU threads' count and wait, chosen while running (runtime/threadpool.py)
        self.threads = ThreadRunner.for_engine(config.n_threads, config.thread_wait,
                                               config.adapt_threads, config.exact_threads)
        # a long prompt chunk ends early when a command or a cancel comes (runtime/abort.py)
        self._abort = abort.AbortFlag()
        # the step after an interrupted one runs to its end (a time-bounded chunk): commands
        # sent faster than a ubatch takes must not stall the prompt
        self._interrupted = False
        self._handlers: dict[type[C.Command], Callable[[Any], object]] = {
            C.OpenSession: self._on_open_session, C.CloseSession: self._on_close_session,
            C.ListSessions: lambda _c: list(self._sessions), C.StartReply: self._on_start_reply,
            C.Tokenize: self._on_tokenize,
            C.Detokenize: lambda c: oneshot.detokenize(self._need_vocab(), c.tokens),
            C.Embed: self._on_embed,
            C.Snapshot: lambda c: self._snapshot(c.session_id),
            C.Restore: lambda c: self._restore(c.meta, c.kv, c.session_id),
            C.SetPriority: self._on_set_priority, C.DropDraft: lambda _c: self._drafting.drop(),
            C.RestoreDraft: lambda _c: self._restore_draft(), C.Release: self._on_release,
            C.LoadFirstFitting: self._on_load_first_fitting, C.Shutdown: self._on_shutdown,
            C.PlacementReady: self._on_placement_ready,
            C.Inspect: lambda c: c.read(),
        }
        # llguidance (not llama.cpp's recursive GBNF parser) applies grammars on this thread
        # and compiles them on the I/O thread, so the platform's default stack does
        self._ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(self._ready,),
                                        name=threads.ENGINE, daemon=True)

    def start(self) -> None:
        """Start the engine thread and load the first plan; raises the load's error here."""
        self._thread.start()
        self._ready.result()

    def submit(self, command: C.Command) -> Future:
        """Queue ``command`` (any thread); a closed engine fails it at once."""
        with self._submit_lock:  # checked and queued atomically: nothing queues after the end
            if self._closed or not self._thread.is_alive():
                command.done.set_exception(EngineClosedError("the engine is closed"))
            else:
                self._commands.put(command)
                if not isinstance(command, C.Inspect):
                    self._abort.arm()  # a prompt chunk in flight makes way for it
        return command.done

    def cancel_load(self) -> bool:
        """Give up the placement loading behind the decode (any thread; the game grew into
        the memory it was taking): the load stops at its next tensor and the sessions stay
        where they are. True if one was loading."""
        job = self._job
        if job is None:
            return False
        job.cancelled.set()
        return True

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        with self._submit_lock:
            return self._closed

    @property
    def _ctx(self) -> Any:
        return self._placed.ctx if self._placed is not None else None

    @property
    def _mem(self) -> Any:
        return self._placed.mem if self._placed is not None else None

    @property
    def _vocab(self) -> Vocab | None:
        return self._placed.vocab if self._placed is not None else None

    @property
    def _model(self) -> Any:
        return self._placed.model if self._placed is not None else None

    @property
    def _batch(self) -> Any:
        return self._placed.batch if self._placed is not None else None

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
                "talking": self.crowd.status(),
                "speculative": self._drafting.status(), "vision": self._encoder.status(),
                "threads": self.threads.status(),
                "standby": self.standby_status(),
                "context": self.context_status(), "folding": self.memory_status()}

    def memory_status(self) -> dict[str, int]:
        """Folds of conversations past their share, all sessions together (any thread)."""
        ms = [s.memory for s in list(self._sessions.values())]
        return {"max_tokens_per_session": self.share.most,
                "folding_sessions": sum(1 for m in ms if m.mode == "fold"),
                "folds": sum(m.folds for m in ms), "summaries": sum(m.summaries for m in ms),
                "dropped_turns": sum(m.dropped for m in ms),
                "summary_prompt_tokens": sum(m.summary_prompt_tokens for m in ms),
                "reread_tokens": sum(m.reread_tokens for m in ms)}

    def standby_status(self) -> dict[str, Any]:
        """The warm CPU placement and the load behind the decode (any thread)."""
        job, host = self._job, self._host
        return {"ready": host is not None, "decoding_on_it": host is not None
                and self._placed is host,
                "loading": job.plan.name if job is not None else None,
                "last_move": dict(self.last_move)}

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

    def _restore_draft(self) -> bool:
        c = self.config
        if not c.draft_model or self._drafting.drafter is not None or self._vocab is None:
            return False
        self._drafting.load(c.draft_model, self._vocab, self.plan.copy_compute_min_batch)
        return True

    def session_info(self) -> dict[str, SessionFigures]:
        """Tokens in context, whether replying, and priority of every session, read without
        waiting for the engine thread (figures of the last step, for listings)."""
        drafts = self._drafting.acceptance
        out: dict[str, SessionFigures] = {}
        for sid, s in list(self._sessions.items()):
            mem = s.memory
            info: SessionFigures = {"tokens": s.cells, "busy": s.turn is not None,
                                    "priority": s.priority, "max_tokens": self.share.most,
                                    "memory": mem.mode, "dropped_turns": mem.dropped}
            draft = drafts.get(sid)  # one read: the engine thread may drop it meanwhile
            if draft is not None:
                info["draft"] = draft.figures()
            out[sid] = info
        return out

    def set_pacing(self, step_delay_s: float, hold_s: float | None = None) -> None:
        """Pause between decode steps (frame pacing); 0 = as fast as possible. While paused,
        sessions of priority <= 0 are decoded every other step; player-facing ones every step.
        ``hold_s``: the pause lapses unless set again within this long (a game that stops
        sending frames — it quit, or paused — must not keep slowing inference)."""
        until = time.monotonic() + hold_s if hold_s is not None else float("inf")
        self.pacing = (max(0.0, float(step_delay_s)), until)  # one write: read whole

    def _pace(self) -> float:
        delay, until = self.pacing
        return delay if time.monotonic() < until else 0.0

    # ============================================================ engine thread: plumbing

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
        self._open_standby()
        try:
            self._loop()
        except BaseException:  # the thread must not die silently
            log.exception("the engine thread failed")
        finally:
            self._finish_thread()

    def _loop(self) -> None:
        while True:
            if not self._moving:  # model work held during a reshard runs first
                while self._held:
                    self._read_in_flight()
                    self._run_command(self._held.popleft())
            active = self._placed is not None and bool(self._active_turns())
            try:
                if not active:
                    # nothing to decode (or no placement to decode on): what is held goes now
                    self._hand_out(next_look_s=float("inf"))
                    command: C.Command | None = self._commands.get()
                elif (pace := self._pace()) > 0:  # paced: wait, but answer commands meanwhile
                    self._hand_out(next_look_s=pace)
                    command = self._commands.get(timeout=pace)
                else:
                    command = self._commands.get_nowait()
            except queue.Empty:
                command = None
            self._taken = command  # answered when the thread ends before it ran
            if command is not None:
                self._read_in_flight()  # no command meets a decode in flight
                # a command may take a while: what is held goes first
                self._hand_out(next_look_s=float("inf"))
            while command is not None:
                if isinstance(command, C.Shutdown):
                    self._dispatch(command)
                    return
                self._dispatch(command)
                if not self._moving and self._held:
                    break  # the reshard ended: its held work before newer commands
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
                self._taken = command
            if self._placed is not None and self._active_turns():
                self._guarded_step()
            if self._encoder.lent_from is not None and self._placed is not None:
                self._read_in_flight()
                self._encoder.give_back(self._move)

    @property
    def _moving(self) -> bool:
        return self.state == "moving"

    def _dispatch(self, command: C.Command) -> None:
        """Run one command and post its outcome (the outbox completes its future)."""
        threads.expect(threads.ENGINE, type(command).__name__)
        # from here the command is answered (its outcome goes through the outbox, which may
        # complete it after this thread ends): no longer the loop's to answer
        self._taken = None
        if not command.done.set_running_or_notify_cancel():
            return  # the caller gave up on it before it ran
        if command.needs_model and self._moving:
            self._held.append(command)
            return
        self._run_command(command)

    def _run_command(self, command: C.Command) -> None:
        try:
            value = self._handlers[type(command)](command)
        except BaseException as e:  # noqa: BLE001 - every error goes to the caller
            self._outbox.settle(command.done, error=e)
        else:
            if value is not _LATER:
                self._outbox.settle(command.done, value)

    def _read_in_flight(self) -> None:
        """Read the decode in flight, if any, and launch nothing after it: before a command,
        a held reshard or the encoder's move touches the context or the sessions."""
        if self._in_flight is not None:
            self._guarded_step(launch=False)

    def _guarded_step(self, *, launch: bool = True) -> None:
        """One decode step; a failure ends the replies it was computing, not the engine."""
        t0 = time.perf_counter()
        self._launched = False
        try:
            self._step(launch)
        except Exception as e:  # llama.cpp or sampler faults surface here
            log.exception("decode step failed")
            self.step_stats["failures"] += 1
            for t in self._active_turns():
                self._rollback(t)
                self._end_turn(t, error=InferenceError(f"decode step failed: {e}"))
        if not self._launched:  # no llama_decode to hand them out before
            self._hand_out()
        dt = time.perf_counter() - t0
        if not self._active_turns():
            self.threads.idle()  # no graph is coming: no thread spins for one
        self.step_stats["last_s"] = round(dt, 5)
        self.step_stats["max_s"] = round(max(self.step_stats["max_s"], dt), 5)

    def _finish_thread(self) -> None:
        """The thread is ending: later commands fail at once, queued ones fail now."""
        with self._submit_lock:
            self._closed = True
        self.state = "closed"
        if self._in_flight is not None and self._placed is not None:
            llama_cpp.llama_synchronize(self._ctx)  # no context closes under a graph
        self._in_flight = None
        for t in self._active_turns():
            t.session.turn = None
            t.handle._fail(EngineClosedError("the engine was closed"))
        self._hand_out()
        left = list(self._held)
        self._held.clear()
        taken = self._taken  # taken off the queue when the loop failed: answered, not lost
        if taken is not None and not taken.done.done() and all(c is not taken for c in left):
            left.append(taken)
        while True:
            try:
                left.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for command in left:
            if isinstance(command, C.PlacementReady) and command.outcome.placed is not None:
                command.outcome.placed.close()  # loaded behind the decode, never taken over
            if command.done.running() or command.done.set_running_or_notify_cancel():
                self._outbox.settle(command.done, error=EngineClosedError("the engine is closed"))
        try:
            self._drafting.drop()
            self._unload()
            self.threads.close()
        except Exception:  # best effort at exit
            log.exception("unload at exit failed")

    def _active_turns(self) -> list[Turn]:
        return [s.turn for s in self._sessions.values() if s.turn is not None]

    # ============================================================ engine thread: loading

    def _settings(self) -> ContextSettings:
        return ContextSettings(self.config.n_ctx, self.config.max_sessions,
                               self.config.n_batch, self.config.n_threads,
                               n_outputs=self.config.outputs_per_step,
                               extra_bufts=not self.config.exact_verify)

    def _load(self, plan: Plan) -> None:
        if self._host is not None and _same_plan(plan, self._host.plan):
            self._adopt(self._host)  # the standby is that plan, open already
            return
        t0 = time.perf_counter()
        placed = Placement.open(self.model_path, self.inventory, plan, self._settings(),
                                progress=self._progress)
        self.last_load_s = time.perf_counter() - t0
        self._adopt(placed)

    def _adopt(self, placed: Placement) -> None:
        """Decode on ``placed`` from now on (its state is the caller's to put back)."""
        plan = placed.plan
        self._placed = placed
        self.threads.attach(placed.ctx)
        self._abort.forget()
        self.report, self.gpu, self.plan = placed.report, placed.gpu, plan
        if self._placed_before is not None:  # what was measured there, for a move back to it
            self._speeds[self._placed_before] = (self._token_s, self._decode_s)
        self._placed_before = _plan_key(plan)
        # a placement met before starts from its own measured speeds (the standby is visited at
        # every reshard: a first chunk guessed from nothing is a long pause on the CPU), a new
        # one measures them again
        self._token_s, self._decode_s = self._speeds.get(_plan_key(plan), (None, None))
        self._drafting.placed(self.inventory, plan)  # its step costs are measured anew
        enc = self._encoder
        if self.config.mmproj and (enc.keeps or not enc.checked):
            try:  # mtmd keeps the model's vocabulary: opened after it, closed before it
                self._open_vision(check=not enc.keeps)
            except BaseException:
                self._placed, self.report = None, LoadReport()
                if placed is not self._host:  # the standby stays open for the next try
                    placed.close()
                raise
            enc.checked = True
            self._vision_idle()

    # ============================================================ engine thread: reshards

    def _open_standby(self) -> None:
        """Keep the CPU placement (config.standby) open beside a GPU one: opened behind the
        decode, on a loader thread, so the first reshard can already give the GPU back at once."""
        plan = self.config.standby
        if plan is None or self._host is not None or self._host_job is not None:
            return
        if self._placed is not None and _same_plan(plan, self._placed.plan):
            self._host = self._placed
            self._reserve_park_buffer()
            return
        self._tickets += 1
        self._host_job = background_load.LoadJob(self._tickets, plan)
        self._start_job(self._host_job)

    def _reserve_park_buffer(self) -> None:
        """Make the park buffer now, for the largest state this context can hold (every KV
        cell, every logits row), while nothing waits: a reshard must not allocate it while
        the game waits for the VRAM. Page-locked where the GPU backend has such memory."""
        if self._parked is not None:  # a state waits in it (a reshard under way): kept as is
            return
        plan, inv = self.plan, self.inventory
        bound = (inv.kv_bytes(self.config.n_ctx, plan.type_k, plan.type_v)
                 + self.config.outputs_per_step * inv.arch.n_vocab * 4 + (8 << 20))
        self._park_buffer.reserve(bound)
        log.info("park buffer: %d MiB (%s)", self._park_buffer.capacity >> 20,
                 "page-locked" if self._park_buffer.pinned else "pageable")

    def _start_job(self, job: background_load.LoadJob) -> None:
        """Open ``job``'s plan on a loader thread (the job is recorded before the thread
        starts: a cancel from another thread must find it)."""
        background_load.start(job, self.model_path, self.inventory, self._settings(),
                              self._deliver)

    def _deliver(self, done: background_load.LoadDone) -> bool:
        """Loader thread: hand the placement to the engine thread (False: the engine closed)."""
        fut = self.submit(C.PlacementReady(done))
        return not (fut.done() and fut.exception() is not None)

    def _on_release(self, command: C.Release) -> object:
        if self._host is not None and command.then_load:
            # the NPCs decode on the standby while the next placement loads; the command is
            # answered as soon as the GPU placement is closed (the arbiter grants the game's
            # reservations then), before the sessions' state is put into the standby
            answered: list[bool] = []

            def freed() -> None:
                answered.append(True)
                self._outbox.settle(command.done, None)

            try:
                self._to_host(freed)
            except Exception:
                if not answered:
                    raise
                # answered already: the state stays parked, the load that follows lands it
                log.exception("the sessions did not move onto the standby")
            return _LATER if answered else None
        self._release()
        self.state = "moving" if command.then_load else "unavailable"
        return None

    def _release(self) -> None:
        """Park the context's state and close the placement (engine_ops.park); the standby
        stays open (its state is parked all the same)."""
        self._give_up_job("the model is moving")
        if self._placed is None:
            return  # already released (unavailable): the parked state is still there
        self._encoder.close()  # its chunks of pending images too: they are made again
        self._embedder.close()  # made over the placement's model: it goes with it
        t0 = time.perf_counter()
        self._parked = engine_ops.park(self._placed, list(self._sessions.values()),
                                       self._park_buffer)
        t1 = time.perf_counter()
        if self._placed is not self._host:
            self._placed.close()
        self.last_move = {"state_mb": round(self._parked.size / 2**20, 1),
                          "park_s": round(t1 - t0, 4),
                          "close_s": round(time.perf_counter() - t1, 4)}
        self._placed = None
        self.report = LoadReport()  # nothing is placed now: memory() says so

    def _to_host(self, freed: Callable[[], None] | None = None) -> None:
        """Give the GPU placement back now and decode on the standby. ``freed`` runs once the
        GPU placement is closed (its VRAM is free), before the state moves into the standby."""
        host = self._host
        assert host is not None
        if self._placed is host:
            self._give_up_job("the model gives its VRAM back")
            return
        t0 = time.perf_counter()
        self._release()
        if freed is not None:
            freed()
        self._switch_to(host)
        self.last_reshard_s = time.perf_counter() - t0
        log.info("gave the GPU placement back and decode on the standby in %.4f s: %s",
                 self.last_reshard_s, self.last_move)

    def _switch_to(self, new: Placement) -> bool:
        """Move every session's state from the current placement (or the parked state) into
        ``new`` and decode on it; the old placement closes unless it is the standby. False:
        llama.cpp refused the state (replies read their tokens again and go on)."""
        if self._placed is not None:
            self._release()
        parked, self._parked = self._parked, None
        self._adopt(new)
        t0 = time.perf_counter()
        kept = engine_ops.restore(new, parked, list(self._sessions.values()),
                                  self.config.max_sessions)
        self.last_move["restore_s"] = round(time.perf_counter() - t0, 4)
        self._chains_after_move(kept)
        self.state = "ready"
        self.reshard_count += 1
        return kept

    def _chains_after_move(self, kept: bool) -> None:
        for s in self._sessions.values():
            t = s.turn
            if t is None:
                continue
            if kept or s.reread:  # a reply reading its tokens again goes on (engine_ops)
                t.chain = self._make_chain(t)
            else:  # an image reply's cells are gone with the cache: it ends, the session stays
                self._rollback(t)
                self._end_turn(t, error=InferenceError(
                    "the reply was interrupted while the model moved; send the line again"))

    def _on_load_first_fitting(self, command: C.LoadFirstFitting) -> object:
        if self._host is not None:
            return self._load_behind(command)
        if self._placed is not None:
            self.state = "ready"
            raise InvalidStateError("release the current placement first")
        self._encoder.lent_from = None  # a reshard from outside decides the placement now
        return self._land(command.candidates)

    def _load_behind(self, command: C.LoadFirstFitting) -> object:
        """With a standby: load the first candidate on a loader thread while the sessions
        decode where they are (the standby after a ``Release``, or the current GPU placement
        where the VRAM holds both: make-before-break) and switch at a step boundary
        (``_on_placement_ready``); the command is answered then. A candidate that is the
        standby, or the placement decoding now, lands at once."""
        self._encoder.lent_from = None  # a reshard from outside decides the placement now
        self._give_up_job("another load was asked for")
        self._job_for, self._job_failures = command, []
        self._job_rest, self._job_t0 = list(command.candidates), time.perf_counter()
        self._next_candidate()
        return _LATER

    def _next_candidate(self) -> None:
        host = self._host
        assert host is not None
        while self._job_rest:
            plan = self._job_rest.pop(0)
            if _same_plan(plan, host.plan):
                if self._placed is not host:
                    self._to_host()
                self._finish_load(plan.name)
                return
            if self._placed is not None and _same_plan(plan, self._placed.plan):
                self._finish_load(plan.name)
                return
            self._tickets += 1
            self._job = background_load.LoadJob(self._tickets, plan)
            self._start_job(self._job)
            return
        if self._placed is None:  # every candidate failed after a release: the standby
            self._to_host()
        self._finish_load(self._placed.plan.name if self._placed is not None else None)

    def _finish_load(self, landed: str | None, state_lost: bool = False) -> None:
        """Answer the LoadFirstFitting in progress."""
        command, self._job_for = self._job_for, None
        out = LoadOutcome(landed, tuple(self._job_failures),
                          time.perf_counter() - self._job_t0, state_lost)
        self._job_rest, self._job_failures = [], []
        if command is not None:
            self._outbox.settle(command.done, out)

    def _on_placement_ready(self, command: C.PlacementReady) -> None:
        done = command.outcome
        if done.job is self._host_job:
            self._host_job = None
            if done.placed is not None:
                self._host = done.placed
                self._reserve_park_buffer()
            else:
                log.warning("the standby CPU placement did not open (%s): a reshard stops the "
                            "replies while the next placement loads", done.error)
            return
        if done.job is not self._job:  # given up meanwhile
            if done.placed is not None:
                done.placed.close()
            return
        self._job = None
        plan = done.job.plan
        if done.placed is None:
            msg = done.error.message if done.error is not None else "did not load"
            log.warning("loading plan '%s' behind the decode failed: %s", plan.name, msg)
            self._job_failures.append((plan.name, msg))
            self._next_candidate()
            return
        self.last_load_s = done.seconds
        t0 = time.perf_counter()
        kept = self._switch_to(done.placed)
        self.last_reshard_s = time.perf_counter() - t0
        log.info("now on plan '%s' (loaded in %.3f s behind the decode, switched in %.4f s: "
                 "%s)", plan.name, done.seconds, self.last_reshard_s, self.last_move)
        self._finish_load(plan.name, state_lost=not kept)

    def _give_up_job(self, why: str) -> None:
        """Cancel the load behind the decode, if any; its LoadFirstFitting is answered with
        the placement the sessions decode on now."""
        job = self._job
        if job is None:
            return
        job.cancelled.set()
        self._job = None
        self._job_failures.append((job.plan.name, f"given up: {why}"))
        self._finish_load(self._placed.plan.name if self._placed is not None else None)

    def _land(self, candidates: Sequence[Plan]) -> LoadOutcome:
        """Load the first candidate that loads and put the parked state back; else the engine
        is unavailable and active replies end, typed (their lines rolled back)."""
        t0 = time.perf_counter()
        failures: list[tuple[str, str]] = []
        landed: Plan | None = None
        for plan in candidates:
            try:
                self._load(plan)  # frees whatever it allocated when it fails
            except IgiError as e:
                log.warning("loading plan '%s' failed: %s", plan.name, e)
                failures.append((plan.name, e.message))
                continue
            landed = plan
            break
        if landed is None or self._placed is None:
            self.state = "unavailable"
            for t in self._active_turns():
                self._rollback(t)
                self._end_turn(t, error=EngineUnavailableError(
                    "no placement of the model fits the memory that is free now; the "
                    "conversation is kept — send the line again shortly"))
            return LoadOutcome(None, tuple(failures), time.perf_counter() - t0)
        self.state = "ready"
        parked, self._parked = self._parked, None
        kept = engine_ops.restore(
            self._placed, parked, list(self._sessions.values()), self.config.max_sessions)
        self._chains_after_move(kept)
        self.reshard_count += 1
        self.last_reshard_s = time.perf_counter() - t0
        return LoadOutcome(landed.name, tuple(failures), self.last_reshard_s, not kept)

    def _move(self, candidates: Sequence[Plan]) -> Plan | None:
        """The vision encoder's own reshard, with the arbiter's two steps: release, then the
        first of ``candidates`` that loads (None: none did, the engine is unavailable)."""
        self._release()
        out = self._land(candidates)
        return next((p for p in candidates if p.name == out.landed), None)

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
            if self._placed is None:
                raise EngineUnavailableError(
                    "the model could not be placed for the vision encoder (no placement "
                    "loads in the memory that is free now); the conversation is kept — "
                    "send the line again shortly")
            enc.context = VisionContext(self._model, self.config.mmproj,
                                        enc.options(check=check, gpu=gpu))
            enc.opens += 1
        return enc.context

    def _vision_idle(self) -> None:
        """Free a non-resident vision context once no reply has an image left to encode."""
        self._encoder.idle(self._active_turns())

    def _unload(self) -> None:
        """Free the placement and the standby; every handle into them is dropped with them."""
        self._encoder.close()  # its chunks of pending images too: they are made again
        self._embedder.close()
        self._give_up_job("the engine is closing")
        if self._host_job is not None:
            self._host_job.cancelled.set()
            self._host_job = None
        placed, self._placed = self._placed, None
        host, self._host = self._host, None
        self.report = LoadReport()  # nothing is placed now: memory() says so
        if placed is not None:
            placed.close()
        if host is not None and host is not placed:
            host.close()
        if self._parked is None:
            self._park_buffer.close()

    def _on_shutdown(self, _command: C.Shutdown) -> None:
        for s in list(self._sessions.values()):
            if s.turn is not None:
                self._end_turn(s.turn, error=EngineClosedError("the engine was closed"))
        self._unload()

    def _need_placed(self) -> Placement:
        if self._placed is None:
            raise EngineUnavailableError(
                "the model is not loaded right now (no placement fits the memory that is free); "
                "the sessions are kept — retry shortly")
        return self._placed

    def _need_vocab(self) -> Vocab:
        if self._vocab is None:
            raise EngineUnavailableError(
                "the model is not loaded right now (no placement fits the memory that is free); "
                "the sessions are kept — retry shortly")
        return self._vocab

    # ============================================================ engine thread: sessions

    def _on_open_session(self, c: C.OpenSession) -> str:
        return self._table.open(c.system_prompt, c.params, c.priority, c.session_id,
                                history=c.history,
                                memory=memory_turn.M.Memory(
                                    "off" if c.memory == "off" else "fold", pinned=c.pinned,
                                    reminder=c.reminder))

    def _on_close_session(self, c: C.CloseSession) -> None:
        self._close_session(c.session_id)

    def _on_set_priority(self, c: C.SetPriority) -> None:
        s = self._sessions.get(c.session_id)
        if s is not None:
            s.priority = c.priority

    def _on_start_reply(self, c: C.StartReply,
                        resume: memory_turn.Resume | None = None) -> Generation:
        if resume is None:  # a conversation past its share folds first (runtime/memory.py)
            first = self._fold_first(c)
            if isinstance(first, Generation):
                return first  # its summary is written first, then the line starts
            resume = first
        return self._start_turn(c.session_id, c.text, c.max_tokens, c.stop, c.grammar,
                                c.ignore_eos, c.images, c.reply, c.streamed, c.tools,
                                c.tool_results, c.history, raw=c.raw,
                                resume=resume, sampling=c.sampling, logprobs=c.logprobs,
                                mixed=c.mixed)

    def _fold_first(self, c: C.StartReply) -> Generation | memory_turn.Resume | None:
        """Fold the session's oldest turns out of the context when the line would not fit
        its share: the model summarises them first (a summary turn on the session's own
        sequence, whose handle is the line's), or, without room for that, they are dropped.
        None: nothing to fold (the line's own checks go on as ever)."""
        s, vocab = self._sessions.get(c.session_id), self._vocab
        if s is not None and vocab is not None and c.raw is None and s.turn is None:
            # a line no fold can make room for is refused, whatever the memory mode
            memory_turn.check_line(vocab, s, image_turn.user_content(c.text, 0), c.max_tokens,
                                   self.share.most)
        if (s is None or s.turn is not None or c.images or vocab is None
                or c.history is not None or c.raw is not None):  # a rewrite: the client's
            return None
        others = [_claim(o) for o in self._sessions.values() if o is not s]
        job = memory_turn.prepare(vocab, s, c, min(self.share.room(others), self.share.most),
                                  self.share.most)
        if not isinstance(job, memory_turn.Summary):
            return job  # nothing to fold, or dropped without a summary (no room for one)
        handle = Generation(c.session_id, reply=c.reply,
                            outbox=self._outbox if c.streamed else None,
                            interrupt=self._abort.arm, held=self._unsent,
                            stream_every_s=self.config.stream_every_s)
        turn = memory_turn.turn(s, handle, job, self._turn_counter + 1)
        turn.chain = self._make_chain(turn)
        self._turn_counter += 1
        memory_turn.start(s, turn, self._mem)
        return handle

    def _summary_ended(self, t: Turn, reason: str, error: BaseException | None) -> None:
        """A summary turn ended: its text becomes the memory and the line starts (with the
        same handle), or the line ends with it (cancelled, failed)."""
        resume = memory_turn.ended(t, self._mem, error, cancelled=reason == "cancelled")
        if resume is None:  # failed, or cancelled: as if the line was never said
            replies.settle(t, reason, error, 0)
            return
        try:
            self._on_start_reply(t.memo.line, resume)
        except BaseException as e:  # noqa: BLE001 - the line's handle carries it
            t.handle._fail(e)

    def _on_embed(self, c: C.Embed) -> oneshot.EmbedChunk:
        # beside talking NPCs, about one step's worth of tokens a decode (one input at least:
        # a pooled input is read whole); alone, as many as the embeddings context takes
        budget = oneshot.EMBED_CTX
        if self._active_turns() and self._token_s:
            budget = int(self.config.max_step_s / self._token_s)
        return self._embedder.embed(
            self._need_placed(), self._need_vocab(), c.inputs, c.start, budget=budget,
            normalize=c.normalize, n_threads=self._settings().n_threads
            or loader.default_threads())

    def _on_tokenize(self, c: C.Tokenize) -> object:
        out = oneshot.tokenize(self._need_vocab(), c.text, add_special=c.add_special,
                               parse_special=c.parse_special, with_pieces=c.with_pieces)
        return out if c.with_pieces else out.tokens

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
        images: tuple[ImageInput, ...] = (),
        reply: int = 0,
        streamed: bool = False,
        tool_plan: tools.ToolPlan | None = None,
        tool_results: tuple[tuple[str, str], ...] = (),
        history: tuple[tuple[str, str], ...] | None = None,
        raw: str | None = None,
        *,
        resume: memory_turn.Resume | None = None,
        sampling: SamplingOverride | None = None,
        logprobs: int | None = None,
        mixed: oneshot.Mixed | None = None,
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
        earlier = s.messages if history is None else prefix.rewritten(s.messages, history)
        prefill = not tool_results and prefix.is_prefill(earlier, user_text, bool(images),
                                                         history is not None)
        # a line may be only the results of the previous reply's calls (tools.py)
        line = [{"role": "user", "content": content}] if content or not tool_results else []
        messages = earlier if prefill else [*earlier, *tools.result_messages(tool_results),
                                            *line]
        # bounded before the template and the tokenizer run over it (both on this thread: a
        # 7.9 MB history held every NPC for 15 s before it was refused)
        replies.check_text_fits(vocab, messages, s.committed_text, s.cells, self.share)
        # special tokens come from the template's markup only: every content is data; the
        # line's tools close the system prompt (the same text for the same tools). A raw
        # prompt has no template: it is all data, or read as llama-server reads one
        if raw is not None:
            parts = [(user_text, raw == "markup")]
        else:
            block = tool_plan.block if tool_plan is not None else ""
            # the reminder goes right before a player's line; none where the conversation
            # would be read again whole for it (images: their cells are not tokens) or where
            # the line is a continued reply or only tool results
            note = "" if prefill or not line or s.n_images or images else s.memory.reminder
            shown = tools.with_tools(memory_turn.M.reminded(messages, note, len(messages) - 1),
                                     block, tools.renders_tool_role(vocab.template))
            parts = (_open_parts(vocab, shown) if prefill
                     else vocab.prompt_parts(shown, add_assistant=True))
        full = "".join(text for text, _ in parts)
        reset = s.reread or not full.startswith(s.committed_text)
        keep = -1  # >= 0: the cache's first ``keep`` tokens are kept, the rest is read
        if reset and not s.n_images and not images:
            # a rewritten history, or a template that renders it differently now: only what
            # differs from the cache's tokens is read (images: cells are not tokens, re-read)
            new = vocab.tokenize_parts(parts, add_special=True)
            keep = prefix.keep(s.tokens, new)
        vision = self._open_vision() if images or (reset and s.images) else None
        vocab = self._need_vocab()  # opening the encoder may have moved the model (encoder_room)
        if mixed is not None:  # a raw prompt with token ids (a completion's own new session)
            if s.tokens or s.image_cells:
                raise InvalidStateError("a prompt of token ids starts a new session")
            feed, base = oneshot.mixed_tokens(vocab, mixed, markup=raw == "markup"), 0
            pending: list[image_turn.PendingImage] = []
        elif keep >= 0:
            feed, base = new[keep:], keep
            pending = []
        elif reset:  # the template re-rendered history differently: re-read it all
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
            self._reclaim_idle(base + n_prompt + 2, but=s)  # as check_prompt counts it
            others = [_claim(o) for o in self._sessions.values() if o is not s]
            replies.check_prompt(self.config, n_prompt, base, pending, self.share, others)
            handle = (resume.handle if resume is not None and resume.handle is not None
                      else Generation(sid, reply=reply,
                                      outbox=self._outbox if streamed else None,
                                      interrupt=self._abort.arm, held=self._unsent,
                                      stream_every_s=self.config.stream_every_s))
            turn = Turn(
                session=s, handle=handle, feed=feed, prompt_text=full, prompt_tokens=n_prompt,
                max_tokens=max_tokens, stop=stop, grammar=grammar, start_tokens=len(s.tokens),
                cached_cells=base, start_pending=list(s.pending), order=self._turn_counter + 1,
                ignore_eos=ignore_eos, images=pending, tools=tool_plan, prefill=prefill,
                logprobs=logprobs,
                params=sampling.apply(s.params) if sampling is not None else None,
            )
            if tool_plan is not None and tool_plan.grammar is not None:
                turn.grammar, turn.calls = tool_plan.grammar, tools.CallReader()
            turn.chain = self._make_chain(turn)  # InvalidGrammarError before any state moves
        except BaseException:
            image_turn.release(pending)
            raise
        self._turn_counter += 1
        if resume is not None:  # the line after a fold: what it reads again is its cost
            turn.folded = (resume.dropped, resume.summarised)
            s.memory.reread_tokens += n_prompt
        if keep >= 0 and not llama_cpp.llama_memory_seq_rm(self._mem, s.seq, keep, -1):
            # a cache that cannot drop a tail (recurrent layers): read it all
            turn.feed, turn.cached_cells, turn.prompt_tokens = list(new), 0, len(new)
            keep = -1
        if keep >= 0:
            s.kept_prefix(turn, keep)
        elif reset:
            llama_cpp.llama_memory_seq_rm(self._mem, s.seq, -1, -1)
            s.reread_for(turn)
        if not s.tokens and not pending and not s.n_images:
            self._share_prefix(turn)
        turn.media = MediaMark.of(s)
        s.begin(turn, messages, list(images))
        return handle

    def _share_prefix(self, t: Turn) -> None:
        """A line whose session's cache is empty starts from the longest prefix of its prompt
        that another session's cache holds (kv_cells.share_prefix): NPCs with one system
        prompt (and tool block), a request's other choices (``n`` > 1) and a conversation
        re-read after its cells went to another read only what differs."""
        model = self._model
        if (not self.config.share_prefixes or model is None
                # fixed chunks make seeded replies repeat: a prompt read from shared cells
                # computes its last token alone, which changes the logits' last bits
                or self.config.prefill_chunk > 0
                or self._drafting.drafter is not None  # the draft's cache lacks the prefix
                or llama_cpp.llama_model_is_recurrent(model)  # a state, not cells: no prefix
                or llama_cpp.llama_model_is_hybrid(model)):
            return
        shared = kv_cells.share_prefix(t, list(self._sessions.values()), self._mem)
        self.step_stats["shared_prefix_tokens"] += shared

    def _make_chain(self, turn: Turn) -> SamplerChain:
        s = turn.session
        # a summary: greedy; a line with its own sampling: the session's merged with it
        params = turn.memo.params if turn.memo is not None else (turn.params or s.params)
        return SamplerChain(params, self._need_vocab().vocab, grammar=turn.grammar,
                            history=s.history, reply_tokens=turn.generated,
                            logprobs=turn.logprobs)

    # ============================================================ engine thread: decoding

    def _step(self, launch: bool = True) -> None:
        """One llama_decode for every reply the scheduler serves this step (``launch``: the
        next one may be launched before this one's tokens are taken)."""
        if self._in_flight is not None:  # launched ahead: its step is the reading
            flight, self._in_flight = self._in_flight, None
            self._steps += 1
            self._read_step(flight.fed, {}, flight.t0, launch)
            return
        turns = self._active_turns()
        for t in turns:
            if t.handle.cancelled:
                self._end_turn(t, reason="cancelled")
        turns = [t for t in turns if t.session.turn is t]
        self._steps += 1
        if not turns:
            return
        rooms = self._rooms()
        for t in turns:  # a reply at its room grows into idle sessions' cells first
            claim = _claim(t.session)
            if t.generated and claim >= rooms[t.session.id]:
                left = max(1, t.max_tokens - len(t.generated))
                if self._reclaim_idle(min(self.share.most, claim + left + 1), but=t.session):
                    rooms = self._rooms()
        by_seq = {t.session.seq: t for t in turns}
        decision = scheduler.decide(
            [scheduler.Reply(t.session.seq, t.session.priority, t.order, len(t.feed),
                             len(t.images), len(t.generated), _claim(t.session),
                             rooms[t.session.id]) for t in turns],
            paced=self._pace() > 0, step=self._steps)
        for seq in decision.out_of_room:
            # the reply reached its session's share of the context: it ends as at
            # max_tokens, so that other sessions keep the cells they are guaranteed
            self._end_turn(by_seq[seq], reason="length")
        if decision.image is not None:  # the encoder, then its embeddings: a step of its own
            self._image_step(by_seq[decision.image])
            return
        turns = [by_seq[seq] for seq in decision.decode]
        if not turns:
            return
        # a reply whose next input is one token is decoding: its token gap is at stake
        decoding = sum(1 for t in turns if len(t.feed) == 1)
        others_decoding = decoding > 0
        # a command or a cancel interrupts a long step (runtime/abort.py): text only, where
        # batch positions are the session's tokens (never with fixed chunks: an interrupt would
        # move their bounds, and replies would depend on when commands came); the step after
        # an interrupted one runs whole, and short, so that every reply moves on
        abortable = (self._abort.available and not self._interrupted
                     and self.config.prefill_chunk == 0
                     and not any(t.images or t.session.image_cells for t in turns))
        step_s = self.config.max_step_s if self._interrupted else self._step_target(turns)
        self._interrupted = False
        # prompt chunks alone may be as large as the batch; beside talking NPCs, steps longer
        # than the step target only where they too can be interrupted
        interruptible = abortable and not others_decoding
        if not abortable:
            step_s = min(step_s, self.config.max_step_s)
        self.step_stats["target_s"] = round(step_s, 4)
        budget = self._token_budget(others_decoding=others_decoding,
                                    interruptible=interruptible, decoding=decoding,
                                    step_s=step_s)
        drafts = self._within_share(self._drafting.propose(turns, budget, self.threads.count),
                                    turns, rooms)
        fed = self._fill_batch(turns, budget, drafts)
        watch = abortable and (interruptible or step_s > self.config.max_step_s)
        if watch and not drafts:
            self._abort.clear()
            if not self._commands.empty() or any(t.handle.cancelled for t in turns):
                self._abort.arm()  # came before the clear: answered after one graph node
            self._abort.watch(self._ctx)
        else:
            self._abort.unwatch(self._ctx)
        # where the held events go (_hand_out): a decode whose call returned in well under
        # its step (the call to its logits read) queued its graph on the GPU, and they go
        # right after the call, while the device computes; one that computes in the call (the
        # CPU's work) takes them before it, so that no text waits for a whole step
        queued = self._decode_call_s < 0.5 * self._decode_step_s
        # text waiting for a later piece goes now if this step outlasts its wait: one that
        # reads a prompt chunk takes about its target, a decode step about the last one
        reads_prompt = any(take > 1 for _, take, _ in fed)
        if not queued:
            self._hand_out(next_look_s=step_s if reads_prompt else None)
        self._launched = True
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        self._decode_call_s = time.perf_counter() - t0
        if queued:
            self._hand_out()
        if rc == abort.ABORTED and watch and not drafts:
            self._keep_interrupted(fed)  # decoding replies feed their token again
            return
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
        self._read_step(fed, drafts, t0, launch)

    def _read_step(self, fed: Fed, drafts: dict[int, Proposal], t0: float,
                   launch: bool) -> None:
        """The decoded tokens join their sessions, and each reply samples from its logits
        and takes its token; where the next step can be foreseen, it is launched between the
        two (:meth:`_launch_ahead`)."""
        picks: list[tuple[Turn, int]] = []
        for t, take, idx in fed:
            proposal = drafts.get(t.session.seq)
            if proposal is not None:
                assert self._vocab is not None
                self._drafting.verify(t, proposal, self._ctx, self._mem, self._vocab)
                continue
            t.session.decoded(t.feed[:take])
            del t.feed[:take]
            if idx >= 0 and (tok := self._pick(t, idx)) is not None:
                picks.append((t, tok))
        self._decode_step_s = time.perf_counter() - t0
        if all(take == 1 for _t, take, _ in fed):
            # drafting weighs a step's whole cost, its picks too: a verify pass reads and
            # walks k + 1 logits rows where a plain step reads one, which the decode call's
            # time alone left out (on an H200, passes of 45 ms against verify calls of 39)
            self._drafting.time_step(drafts, self._decode_step_s)
        if launch and not drafts and self._foreseen(fed, picks):
            self._launch_ahead(picks)
        for t, tok in picks:
            self._take(t, tok)
        if self._in_flight is not None:
            self._hand_out()  # the device computes the next step meanwhile

    def _foreseen(self, fed: Fed, picks: list[tuple[Turn, int]]) -> bool:
        """Whether the next step may be launched before these picks are taken
        (runtime/launch_ahead.py)."""
        if not launch_ahead.device_queues(self.config.launch_ahead, on_gpu=self.gpu is not None,
                                          call_s=self._decode_call_s,
                                          step_s=self._decode_step_s):
            return False
        quiet = not (self._drafting.enabled or self._held or self._moving or self._pace() > 0
                     or not self._commands.empty())
        vocab, rooms = self._need_vocab(), self._rooms()
        nexts = [launch_ahead.Next(len(t.generated), t.max_tokens,
                                   vocab.is_eog(tok) and not t.ignore_eos, t.handle.cancelled,
                                   bool(t.images), len(t.session.tokens), rooms[t.session.id])
                 for t, tok in picks]
        return launch_ahead.foreseen([take for _t, take, _i in fed], quiet=quiet,
                                     active=len(self._active_turns()), nexts=nexts)

    def _launch_ahead(self, picks: list[tuple[Turn, int]]) -> None:
        """Queue the next step's decode now: the device computes it while this step's tokens
        are taken and their events handed out. A decode that fails here launches nothing
        (llama.cpp leaves the cache as it was): the next step feeds the tokens as usual."""
        p = self._need_placed()
        fed = batching.fill_next(p.batch, p.batch_cap, picks)
        self._abort.unwatch(self._ctx)
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        call_s = time.perf_counter() - t0
        if rc != 0:
            return
        self._decode_call_s = call_s
        self._launched = True
        self._in_flight = launch_ahead.InFlight(fed, t0)
        self._time_step(fed, {}, call_s)
        self.step_stats["launched_ahead"] += 1

    def _drop_in_flight(self, t: Turn) -> None:
        """``t`` ends while its next token is in a decode launched ahead: that token's cell
        goes, and the cache holds the session's tokens again."""
        flight = self._in_flight
        if flight is None or not any(f[0] is t for f in flight.fed):
            return
        flight.fed[:] = [f for f in flight.fed if f[0] is not t]
        if self._mem is not None:
            llama_cpp.llama_memory_seq_rm(self._mem, t.session.seq, len(t.session.tokens), -1)
        self.step_stats["ahead_dropped"] += 1
        if not flight.fed:
            self._in_flight = None

    def _keep_interrupted(self, fed: Fed) -> None:
        """An interrupted step: llama.cpp kept the ubatches it finished and removed the one it
        was in; each reply keeps the tokens that are in the cache and feeds the rest later. A
        chunk's last token, and a decoding reply's one token, is fed again when its logits were
        asked for: an aborted decode hands out none."""
        self.step_stats["interrupted"] += 1
        self._interrupted = True
        for t, take, idx in fed:
            s = t.session
            pos0 = len(s.tokens)
            kept = llama_cpp.llama_memory_seq_pos_max(self._mem, s.seq) + 1 - pos0
            done = max(0, min(take - (1 if idx >= 0 else 0), kept))
            llama_cpp.llama_memory_seq_rm(self._mem, s.seq, pos0 + done, -1)
            s.decoded(t.feed[:done])
            del t.feed[:done]

    def _reclaim_idle(self, need: int, but: Session | None) -> bool:
        """Idle sessions give their cells back until ``but`` may claim ``need``
        (kv_cells.reclaim_idle): only replies in progress make a line wait or cut a reply."""
        if self._mem is None:
            return False
        gone = kv_cells.reclaim_idle(self.share, list(self._sessions.values()), _claim,
                                     self._mem, need, but)
        self.step_stats["reclaimed"] += gone
        return gone > 0

    def _hand_out(self, next_look_s: float | None = None) -> None:
        """Hand out the reply events held since the last llama_decode (``Generation.held``):
        text, calls and ends made after a step's logits were read go with the next decode, in
        order: right after its call where the call only queues the GPU's work, else right
        before it. Woken while the engine prepared that step, the threads that deliver them
        contended with it for the GIL (on the 2-core CPU the engine's own time a token fell
        by 0.02-0.05 ms of 0.19-0.25), and on a GPU the device waits out the whole of that
        preparation; now they run while it computes. ``next_look_s``: how long until the
        engine hands out again (None: about a decode step), so that text waiting for a later
        piece (``EngineConfig.stream_every_s``) goes now if it would be due before then."""
        if self.config.stream_every_s > 0:  # text that would wait past its time goes first
            by = time.monotonic() + (self._decode_step_s if next_look_s is None
                                     else next_look_s)
            for t in self._active_turns():
                t.handle.release_text(by)
        unsent = self._unsent  # the list every Generation of this engine holds: kept
        for send in unsent:
            send()
        unsent.clear()

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
            keep = scheduler.draft_room(len(proposal.tokens), _claim(s), rooms[s.id])
            if keep == 0:
                del drafts[s.seq]
            else:
                del proposal.tokens[keep:], proposal.dists[keep:]
        return drafts

    def _image_step(self, t: Turn) -> None:
        try:
            image_turn.eval_next(self._open_vision(), self._ctx, t, self._need_placed().batch_cap)
        except IgiError as e:  # a full context, an encoder failure: this reply ends, typed
            self._rollback(t)
            self._end_turn(t, error=e)
        self._vision_idle()  # the embeddings are in the KV cache: the encoder can go

    def _time_step(self, fed: Fed, drafts: dict[int, Proposal], seconds: float) -> None:
        decoding = sum(1 for _t, take, _ in fed if take == 1)
        decode = decoding == len(fed)  # no prompt chunk rode along: a decode step's time
        n_tokens = self._batch.n_tokens
        self.threads.after_step(n_tokens, seconds, decode=decode)
        if not drafts:
            self._token_s = scheduler.learn_speed(self._token_s, n_tokens, seconds,
                                                  decoding=decoding, decode_s=self._decode_s)
        if not decode:
            return
        self._watch_crowd(len(fed))
        if not drafts:
            self._decode_s = scheduler.learn_decode(self._decode_s, seconds)

    def _watch_crowd(self, decoding: int) -> None:
        crowd = self.crowd.observe(decoding)
        if crowd is not None:
            log.warning("%d replies have decoded together for %d steps, but the plan '%s' was "
                        "made for %d (serve --talking): `igi-sdk plan --seqs %d` shows the plan "
                        "for them, `serve --talking %d` runs it (docs/planner.md, \"NPCs "
                        "talking together\")", crowd, self.crowd.steps, self.plan.name,
                        self.crowd.planned, crowd, crowd)

    def _step_target(self, turns: list[Turn]) -> float:
        """The next step's target length (scheduler.step_target): longer while NPCs wait to
        start and the talking ones are ahead of the reading pace."""
        c, now = self.config, time.perf_counter()
        decoding = [(t.session.priority, scheduler.reading_slack(
            len(t.generated), now - t.t_first, c.reading_tps) if c.reading_tps > 0 else 0.0)
            for t in turns if len(t.feed) == 1 and t.t_first is not None]
        waiting = [t.session.priority for t in turns if len(t.feed) > 1]
        return scheduler.step_target(max_step_s=c.max_step_s, reading_tps=c.reading_tps,
                                     decoding=decoding, waiting=waiting,
                                     paced=self._pace() > 0)

    def _token_budget(self, *, step_s: float, others_decoding: bool, interruptible: bool,
                      decoding: int) -> int:
        """Tokens for the next step (``decoding`` replies' one token each included): about
        ``step_s`` of work at the measured speed (more while no reply is decoding, or where the
        decode alone fills it: scheduler.token_budget)."""
        c = self.config
        n = scheduler.token_budget(max_step_s=step_s, prefill_chunk=c.prefill_chunk,
                                   plan=self.plan, on_gpu=self.gpu is not None,
                                   cap=self._need_placed().batch_cap, token_s=self._token_s,
                                   others_decoding=others_decoding,
                                   interruptible=interruptible, decoding=decoding,
                                   decode_s=self._decode_s)
        self.step_stats["chunk"] = n
        return n

    def _fill_batch(self, turns: list[Turn], budget: int,
                    drafts: dict[int, Proposal] | None = None) -> Fed:
        """Up to ``budget`` pending tokens in the (reused) llama_batch, then the drafts
        (runtime/batching.py). Returns (turn, tokens taken, batch index of its logits or -1)
        per turn fed."""
        p = self._need_placed()
        fed = batching.fill_batch(p.batch, p.batch_cap, turns, budget)
        if drafts:
            batching.add_drafts(p.batch, p.batch_cap, p.outputs_cap, fed, drafts)
        return fed

    def _pick(self, t: Turn, idx: int) -> int | None:
        """The reply's next token from the logits at ``idx`` (None: the reply ended)."""
        assert t.chain is not None
        try:
            return t.chain.sample(self._ctx, idx, t.session.n_sampled)
        except IgiError as e:  # a grammar past its per-step limits: this reply ends, typed
            self._rollback(t)
            self._end_turn(t, error=e)
            return None

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
        self._drop_in_flight(t)
        replies.detach(t)
        self._vision_idle()
        if t.memo is not None:
            self._summary_ended(t, reason, error)
            return
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
        self._reclaim_idle(cells + 1, but=None)
        verdict = self.share.admit(cells + 1, [_claim(o) for o in self._sessions.values()])
        if verdict is Admit.NEVER:
            raise InvalidStateError(
                f"the saved session holds {cells} cells; one session may hold at most "
                f"{self.share.most} of this engine's {self.share.n_ctx}")
        if verdict is Admit.WAIT:
            raise ContextFullError(
                f"the saved session holds {cells} cells, but other sessions hold the shared "
                "context's cells now; retry when their replies end or they close")



# a handler's answer that comes later (a placement loading behind the decode): not settled yet
_LATER = object()


PlanKey = tuple[str, tuple[str, ...], int]


def _plan_key(p: Plan) -> PlanKey:
    """What tells two placements apart (rungs of one name place different tensors)."""
    return (p.name, p.gpu_tensors, p.gpu_layers)


def _same_plan(a: Plan, b: Plan) -> bool:
    return _plan_key(a) == _plan_key(b)


def _open_parts(vocab: Vocab, messages: list[dict[str, str]]) -> list[Part]:
    """The prompt of a reply that continues the last (assistant) message of ``messages``:
    rendered with that message open; an empty one is answered as a new reply."""
    content = messages[-1]["content"]
    if not content.strip():
        return vocab.prompt_parts(messages[:-1], add_assistant=True)
    parts = prefix.open_last(vocab.prompt_parts(messages, add_assistant=False), content)
    if parts is None:
        raise InvalidStateError("this model's chat template rewrites an assistant message's "
                                "text: a reply cannot continue it (send a user line)")
    return parts


def _claim(s: Session) -> int:
    """KV cells ``s`` holds plus those its reply in progress was admitted for (the rest of
    its prompt and images, the sampled token to decode)."""
    t = s.turn
    ahead = len(t.feed) + image_turn.cells(t.images) if t is not None else 0
    return len(s.tokens) + s.image_cells + ahead
