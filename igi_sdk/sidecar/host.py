"""The model side of the sidecar: engine, plan ladder, VRAM sources, arbiter and frame pacer,
assembled for one loaded model and replaced together when another model loads.

This is the protocol server's :class:`~igi_sdk.serving.backend.Backend`; every call returns at
once (model work as futures from the engine), except :meth:`ModelHost.load_model`, which the
server runs on a worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from igi_sdk.arbiter import (
    Arbiter,
    EngineReportSource,
    NvmlSource,
    PlanLadder,
    PolicyConfig,
    Reservation,
    ScriptedTrace,
    VramSource,
)
from igi_sdk.arbiter.arbiter import ReservationDone as ArbiterDone
from igi_sdk.arbiter.ladder import Rung, arbiter_workload, pins_host_weights
from igi_sdk.arbiter.pacing import ClientPacing
from igi_sdk.arbiter.policy import BudgetPolicy
from igi_sdk.arbiter.sources import DxgiSource, VramReading
from igi_sdk.errors import (
    CannotFreeError,
    DeadlineMissedError,
    EngineClosedError,
    EngineUnavailableError,
    IgiError,
    ModelLoadError,
)
from igi_sdk.events import Outbox, SessionFigures
from igi_sdk.host_memory import available_ram
from igi_sdk.model import ModelInventory, read_inventory
from igi_sdk.model.mmproj import read_encoder
from igi_sdk.planner import Plan
from igi_sdk.profile import Profile
from igi_sdk.runtime import Engine, EngineConfig, Generation, ImageInput, SamplingParams, image_turn
from igi_sdk.runtime._native import streams_weights
from igi_sdk.runtime.encoder import EncoderRoom
from igi_sdk.runtime.image_decode import (
    ImageBudget,
    ImageDecoder,
    decoding_chat,
    image_token_cap,
)
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.speculative import SpeculativeConfig
from igi_sdk.serving.backend import (
    EmbedResult,
    ReservationDone,
    StreamHandle,
    StreamListener,
    TokenizeResult,
)
from igi_sdk.sidecar import tool_wire
from igi_sdk.tuning import (
    cached_before_backend,
    load_or_measure,
    plan_for_model,
    prepare_backend,
    with_threshold_in_effect,
)
from igi_sdk.tuning.autoplan import Beside, BudgetPlanner, DryRun, half_free
from igi_sdk.tuning.measure import cached_profile
from igi_sdk.upstream.policy import LocalHealth
from igi_sdk.wire import protocol as P

log = logging.getLogger("igi_sdk.sidecar")


@dataclass(frozen=True)
class HostConfig:
    n_threads: int = 0
    thread_wait: str = "auto"  # EngineConfig.thread_wait
    adapt_threads: bool | None = None  # EngineConfig.adapt_threads
    # VRAM arbiter: on by default with an NVIDIA GPU; a scripted trace (and a profile) simulate
    # one for tests and samples
    arbiter: bool = True
    vram_trace: Path | None = None
    profile: Path | None = None
    grow_hold_s: float = 2.0
    # keep the CPU placement open beside a GPU one (EngineConfig.standby): reshards behind
    # the decode
    standby: bool = True
    max_step_s: float = 0.05  # one engine step's target duration (prompt chunking)
    reading_tps: float = 8.0  # the pace talking NPCs stay ahead of while others wait to start
    stream_every_s: float = 0.0  # EngineConfig.stream_every_s
    prefill_chunk: int = 0  # fixed prompt tokens per step instead: reproducible replies
    # speculative decoding: a draft GGUF of the models' tokenizer, loaded with every model
    # (a model of another vocabulary is then refused: DraftMismatchError)
    draft_model: Path | None = None
    draft_k: int = 4
    # draft-free drafting from n-grams of each session's own tokens (alone or with a draft)
    draft_ngram: bool = False
    # load models without CPU weight repacking: greedy replies with drafting are bit-identical
    # to those without, at a higher verify cost
    exact_verify: bool = False
    # image input: the vision encoder on the GPU (all its weights in VRAM, freed between image
    # turns) instead of the CPU (docs/vlm.md), and the image tokens it takes at most (0: the
    # model's limit), which bounds its compute buffer
    vision_gpu: bool = False
    vision_max_tokens: int = 0
    # with vision_gpu: the encoder borrows its VRAM from the model for each image turn (the
    # model moves to a smaller placement while it is open, and back) instead of having it set
    # aside out of the model's budget: faster replies at small budgets, a longer TTFT for the
    # lines with images (two reshards; docs/vlm.md)
    vision_borrow: bool = False
    # KV cells every session slot keeps (-1: n_ctx / (2 max_sessions); 0: none, first come
    # first served): what one NPC may hold at most is n_ctx - (max_sessions - 1) * floor
    context_floor: int = -1
    # the most KV cells one session may hold (0: what the floors leave it; serve --session-ctx)
    session_ctx: int = 0
    # the most VRAM the model may take (bytes): a cap, not a fixed budget — under the arbiter
    # the model takes at most this, less when the game needs it
    vram_cap: int | None = None
    # NPCs expected to talk at once: plans (and llama.cpp's copy-compute threshold, fixed when
    # its backend starts) are chosen for their decode steps, which may then stream the
    # CPU-resident weights to the GPU instead of computing them on the CPU
    talking: int = 1
    # how the ladder's GPU rungs hold their CPU-resident weights: "auto" (arbiter.ladder.
    # pins_host_weights), "pinned" or "mapped"
    host_weights: str = "auto"


def _failed(error: Exception) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_exception(error)
    return fut


class ModelHost:
    def __init__(self, config: HostConfig) -> None:
        self.cfg = config
        self.engine: Engine | None = None
        self.arbiter: Arbiter | None = None
        self.pacing = ClientPacing()
        self._name: str | None = None
        self._load_lock = threading.Lock()
        # reservations that arrive while a model loads wait for the arbiter that comes with it
        self._reserve_lock = threading.Lock()
        self._loading = False
        self._arriving: list[tuple[Reservation, ArbiterDone]] = []
        # images are decoded here, in worker processes, before a line reaches the engine
        self._decoder = ImageDecoder()
        # the engine's events (replies, command outcomes) leave it here, for every model loaded
        self._outbox = Outbox()
        self._image_tile, self._image_limit = 0, 0  # of the loaded model's encoder

    @property
    def model_name(self) -> str | None:
        return self._name

    # --- loading -------------------------------------------------------------------------------

    def load_model(self, path: Path, request: P.LoadModel,
                   draft: Path | None = None, mmproj: Path | None = None) -> dict[str, Any]:
        with self._load_lock:
            with self._reserve_lock:
                self._loading = True
            waiting = self._stop_arbiter()
            old, self.engine, self._name = self.engine, None, None
            if old is not None:  # a new model: the old sessions cannot follow it
                old.close()
            try:
                self._open(path, request, draft or self.cfg.draft_model, mmproj)
            except BaseException:
                _end_all(waiting + self._loaded(), EngineUnavailableError(
                    "the model failed to load"))
                raise
            waiting += self._loaded()
            if self.arbiter is not None:
                self.arbiter.adopt(waiting)
            else:
                for res, done in waiting:
                    self._settle_without_arbiter(partial(_tell, done, res))
            assert self.engine is not None
            return {"model": path.name, "memory": self.engine.memory()}

    def _loaded(self) -> list[tuple[Reservation, ArbiterDone]]:
        """The load has ended: the reservations that arrived meanwhile (later ones go to the
        arbiter, or end at once, as usual)."""
        with self._reserve_lock:
            self._loading = False
            arrived, self._arriving = self._arriving, []
        return arrived

    def _open(self, path: Path, request: P.LoadModel, draft: Path | None,
              mmproj: Path | None = None) -> None:
        cfg = EngineConfig(n_ctx=request.n_ctx, max_sessions=request.max_sessions,
                           talking=self.cfg.talking,
                           n_threads=self.cfg.n_threads, max_step_s=self.cfg.max_step_s,
                           reading_tps=self.cfg.reading_tps,
                           stream_every_s=self.cfg.stream_every_s,
                           thread_wait=self.cfg.thread_wait,
                           adapt_threads=self.cfg.adapt_threads,
                           prefill_chunk=self.cfg.prefill_chunk,
                           draft_model=str(draft) if draft else None,
                           speculative=SpeculativeConfig(k=self.cfg.draft_k,
                                                         ngram=self.cfg.draft_ngram),
                           exact_verify=self.cfg.exact_verify,
                           mmproj=str(mmproj) if mmproj else None,
                           vision_gpu=self.cfg.vision_gpu,
                           vision_max_tokens=self.cfg.vision_max_tokens,
                           context_floor=self.cfg.context_floor,
                           session_ctx=self.cfg.session_ctx)
        inventory = read_inventory(path)
        # what the GPU holds beside the model on a GPU plan takes its VRAM out of the model's
        # budget, on the one budget path (a fixed budget, or each rung of the arbiter's ladder):
        # a draft wholly in VRAM, and an encoder on the GPU priced for the largest image it
        # takes, unless it borrows that VRAM from the model for each image turn
        priced = Beside.priced(n_ctx=request.n_ctx, max_sessions=request.max_sessions,
                               draft=draft, draft_k=self.cfg.draft_k,
                               encoder=mmproj if mmproj and self.cfg.vision_gpu else None,
                               max_image_tokens=self.cfg.vision_max_tokens)
        borrow = bool(priced.encoder) and self.cfg.vision_borrow
        beside = replace(priced, encoder=0) if borrow else priced
        settings = ContextSettings(cfg.n_ctx, cfg.max_sessions, cfg.n_batch, cfg.n_threads,
                                   n_outputs=cfg.outputs_per_step)
        room: EncoderRoom | None = None
        # under the arbiter a vram_budget is a cap (at most that, less when the game needs
        # it); without one it fixes the placement
        setup = self._arbiter_setup(path, inventory, request, settings, beside,
                                    cfg.drafts_per_step)
        if setup is not None:  # start on the rung the budget allows now
            plan = self._starting_rung(*setup).plan
            # the CPU rung stays open beside a GPU one: a reshard gives the GPU back at once
            # and the NPCs decode on it while the next placement loads
            if self.cfg.standby:
                cfg = replace(cfg, standby=setup[0].cpu.plan)
            if priced.encoder:
                room = encoder_room(setup[0], priced.encoder, borrow)
        elif request.vram_budget is not None or self.cfg.vram_cap is not None:
            # no arbiter: the least of `serve --vram` and the request's budget fixes the plan
            # (a cap holds whether or not the arbiter runs)
            fixed = min(c for c in (self.cfg.vram_cap, request.vram_budget) if c is not None)
            plan, room = self._fixed_plan(
                path, inventory, request.model_copy(update={"vram_budget": fixed}), cfg,
                beside, priced.encoder if borrow else 0)
        else:
            plan = Plan.all_cpu()
        if cfg.draft_model or cfg.speculative.ngram:
            # the planner's step costs for the loaded plan decide whether drafting pays until
            # the engine has measured its own (a cached profile only: none is measured here)
            prof = (Profile.load(self.cfg.profile) if self.cfg.profile is not None
                    else cached_profile(self.cfg.n_threads or None))
            cfg = replace(cfg, speculative=replace(cfg.speculative, profile=prof))
        try:
            self.engine = Engine(path, plan, cfg, encoder_room=room, outbox=self._outbox)
        except ModelLoadError as e:
            if setup is None or plan is setup[0].cpu.plan:
                raise
            # the game took the memory between the reading and the load: never fight it
            log.warning("the starting plan '%s' did not load (%s): starting on the CPU plan",
                        plan.name, e.message)
            plan = setup[0].cpu.plan
            self.engine = Engine(path, plan, cfg, encoder_room=room, outbox=self._outbox)
        self._name = path.name
        if mmproj:
            self._image_tile, self._image_limit = _image_grid(mmproj, self.cfg.vision_max_tokens)
            self._decoder.warm()
        if setup is not None:
            self._start_arbiter(setup[0], setup[1], setup[2])

    def _fixed_plan(self, path: Path, inventory: ModelInventory, request: P.LoadModel,
                    cfg: EngineConfig, beside: Beside, borrowed: int,
                    ) -> tuple[Plan, EncoderRoom | None]:
        """A fixed ``vram_budget`` (no arbiter): the budget path's plan for it, and with an
        encoder that borrows ``borrowed`` bytes, the smaller placement the model moves to for
        each image turn (the engine's ``encoder_room``)."""
        assert request.vram_budget is not None
        prof = Profile.load(self.cfg.profile) if self.cfg.profile is not None else None

        def planned(aside: Beside) -> Plan:  # plans (and asks for) its own threshold
            # borrowing: host weights memory-mapped, so that a move takes ~1 s
            return plan_for_model(path, inventory, budget=request.vram_budget,
                                  n_ctx=request.n_ctx, max_sessions=request.max_sessions,
                                  n_threads=self.cfg.n_threads, profile=prof,
                                  outputs=cfg.outputs_per_step, pin_host=not borrowed,
                                  beside=aside, n_batch=cfg.n_batch,
                                  talking=self.cfg.talking,
                                  draft_k=cfg.drafts_per_step).best

        plan = planned(beside)
        if not borrowed:
            return plan, None
        small = planned(replace(beside, encoder=borrowed))
        # nothing else moves it: if the smaller one does not load, the model's own again
        return plan, EncoderRoom.always(small, fallback=plan)

    def _arbiter_setup(self, path: Path, inventory: ModelInventory, request: P.LoadModel,
                       settings: ContextSettings, beside: Beside, draft_k: int = 0,
                       ) -> tuple[PlanLadder, ScriptedTrace | None, int | None] | None:
        """(plan ladder, trace or None, VRAM cap or None) when this sidecar arbitrates VRAM,
        else None. ``settings``: the context the engine runs (the ladder's dry runs use it);
        ``beside``: what a draft model or a vision encoder on the GPU adds to every GPU rung;
        ``draft_k``: drafts a session's verify step carries (``EngineConfig.drafts_per_step``).
        The cap is the least of ``serve --vram`` and the request's ``vram_budget``."""
        from igi_sdk.runtime.nvml import nvml

        cfg = self.cfg
        has_nvml = nvml() is not None
        # without NVML (a non-NVIDIA GPU) the engine's own frame reports drive the arbiter;
        # that needs the machine's profile given explicitly, since none can be measured here
        if not cfg.arbiter or not (has_nvml or cfg.vram_trace or cfg.profile):
            return None
        # pinned host weights: streamed by NPCs talking together, or by a pipelined decode,
        # at the price of a longer reload at each reshard (the VRAM is freed first either way)
        host = pins_host_weights(cfg.host_weights, talking=cfg.talking,
                                 vision_borrow=cfg.vision_borrow,
                                 pipelines=streams_weights(),
                                 standby=cfg.standby, model_bytes=inventory.file_size,
                                 available_ram=available_ram())
        log.info("the ladder's host weights: %s (%s)", "pinned" if host.pinned else "mapped",
                 host.why)
        wl = arbiter_workload(request.n_ctx, settings.n_outputs, cfg.talking,
                              pin_host=host.pinned, draft_k=draft_k)
        # llama.cpp fixes the copy-compute threshold when its backend starts (and measuring or
        # even fingerprinting a profile starts it): ask for this model's threshold first, from
        # a profile found without the backend, then plan every rung with the one in effect
        early = (Profile.load(cfg.profile) if cfg.profile is not None
                 else cached_before_backend(cfg.n_threads or None))
        caps = [c for c in (cfg.vram_cap, request.vram_budget) if c is not None]
        cap = min(caps) if caps else None
        if early is not None:
            prepare_backend(inventory, early, wl, cap or half_free(early))
        prof = early if cfg.profile is not None and early is not None else load_or_measure(
            threads=cfg.n_threads or None, fast=True)
        if prof.gpu is None:
            return None
        # every GPU rung takes the budget path a fixed budget takes (dry-run checked where
        # llama.cpp has a GPU); rungs above the cap would never be used, so none is planned
        wl = with_threshold_in_effect(wl)
        planner = BudgetPlanner(inventory, prof, wl, beside=beside,
                                check=DryRun(path, settings))
        ladder = PlanLadder.build(inventory, prof, wl, planner=planner, cap=cap)
        trace = ScriptedTrace.load(cfg.vram_trace) if cfg.vram_trace else None
        return ladder, trace, cap

    def _starting_rung(self, ladder: PlanLadder, trace: ScriptedTrace | None,
                       cap: int | None) -> Rung:
        """The rung the budget allows now: the model starts where it will run, rather than on
        the CPU rung and growing a reshard later (the first line waited 3.2 s against 0.24 s
        after on an H200 host). Nothing of this process's is loaded yet: what the GPU holds
        counts as others'."""
        reading: VramReading | None
        if trace is not None:
            reading = trace.read()
        else:
            nv = NvmlSource(own_fallback=lambda: 0)
            reading = nv.read() if nv.nv is not None else None
        if reading is None:
            return ladder.cpu
        budget = BudgetPolicy(ladder, PolicyConfig(cap=cap)).budget(reading)
        rung = ladder.best_within(budget)
        log.info("starting on plan '%s' (%d MiB) within a budget of %d MiB", rung.plan.name,
                 rung.vram >> 20, budget >> 20)
        return rung

    def _start_arbiter(self, ladder: PlanLadder, trace: ScriptedTrace | None,
                       cap: int | None) -> None:
        assert self.engine is not None
        holder: list[Arbiter] = []

        def own() -> int:  # the arbiter's own accounting of what this process holds
            return holder[0].own_vram() if holder else 0

        sources: list[VramSource] = []
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
            # Windows: the budget the OS gives this process (NVML has no per-process figure
            # under WDDM); None elsewhere
            dx = DxgiSource.for_gpu(nv if nv.nv is not None else None, own)
            if dx is not None:
                sources.append(dx)
                if not total:
                    reading = dx.read()
                    total = reading.total if reading else 0
        self.engine_reports = EngineReportSource(total, own)
        sources.append(self.engine_reports)
        # a game that grows is seen one NVML poll late, and every poll it waits is a stalled
        # allocation: poll at 40 Hz (an NVML read costs well under a millisecond); a
        # scripted trace changes in steps of seconds
        arb = Arbiter(self.engine, ladder, sources,
                      config=PolicyConfig(grow_hold_s=self.cfg.grow_hold_s, cap=cap,
                                          standby=self.engine.config.standby is not None),
                      period_s=0.1 if trace is not None else 0.025)
        holder.append(arb)
        self.arbiter = arb
        arb.start()

    def _stop_arbiter(self) -> list[tuple[Reservation, ArbiterDone]]:
        arb, self.arbiter = self.arbiter, None
        return arb.stop() if arb is not None else []

    # --- sessions (futures from the engine thread) ------------------------------------------

    def _engine(self) -> Engine:
        eng = self.engine
        if eng is None:
            raise EngineUnavailableError("no model is loaded right now; retry shortly")
        return eng

    def session_slots(self, local_slots: int) -> int:
        return local_slots

    @property
    def outbox(self) -> Outbox:
        """Where replies leave the model side, for every model loaded (and every upstream reply
        routed beside them)."""
        return self._outbox

    def health(self) -> LocalHealth:
        eng = self.engine
        if eng is None or eng.state == "unavailable":  # (a move in progress still answers)
            return LocalHealth(available=False, on_gpu=False)
        return LocalHealth(available=True, on_gpu=eng.gpu is not None and eng.plan.uses_gpu())

    def open_session(self, request: P.OpenSession) -> Future[str]:
        try:
            eng = self._engine()
            sampling = SamplingParams(**request.sampling.model_dump(), repeat_last_n=64)
        except Exception as e:  # noqa: BLE001 - typed errors travel in the future
            return _failed(e)
        # a persona name alone still gives the NPC an identity
        system = request.system_prompt or (
            f"You are {request.persona}." if request.persona else None)
        return eng.open_session_async(system, priority=request.priority, sampling=sampling,
                                      session_id=request.name,
                                      history=tool_wire.history_turns(request.history),
                                      memory=request.memory, pinned=request.pinned,
                                      reminder=request.reminder)

    def close_session(self, session: str) -> Future[None]:
        try:
            return self._engine().close_session_async(session)
        except Exception as e:  # noqa: BLE001
            return _failed(e)

    def chat(self, request: P.Chat, listener: StreamListener) -> Future[StreamHandle]:
        try:
            eng = self._engine()
            images = [ImageInput(**i.model_dump()) for i in request.images]
        except Exception as e:  # noqa: BLE001
            return _failed(e)

        def start(ready: Sequence[ImageInput]) -> Future[Generation]:
            line = (None if request.sampling is None
                    else request.sampling.model_dump(exclude_none=True))
            return eng.chat_async(request.session, request.text, max_tokens=request.max_tokens,
                                  stop=request.stop, grammar=request.grammar,
                                  json_schema=request.json_schema, listener=listener,
                                  images=ready, tools=tool_wire.spec(request),
                                  tool_results=[(r.id, r.content) for r in request.tool_results],
                                  sampling=line, logprobs=request.logprobs,
                                  history=None if request.history is None
                                  else tool_wire.history_turns(request.history))

        if not images or not eng.config.mmproj:  # (no projector: the engine says so)
            return start(images)  # type: ignore[return-value]
        # decoded and scaled off the engine thread; cancel stops a decode at once
        budget = self._image_budget(eng)
        handle = decoding_chat(
            self._decoder, request.session, listener,
            lambda cancel: image_turn.prepare(self._decoder, images, budget, cancel), start)
        out: Future[StreamHandle] = Future()
        out.set_result(handle)
        return out

    def _image_budget(self, eng: Engine) -> ImageBudget:
        """Image tokens one image may take: the KV cells every session is guaranteed (the
        engine's context share), within the encoder's limit (``--vision-max-tokens`` or the
        model's)."""
        if not self._image_tile:
            return ImageBudget()  # an encoder this SDK cannot price: mtmd's own limit holds
        cells = eng.share.floor or eng.config.n_ctx // (2 * max(1, eng.config.max_sessions))
        return ImageBudget(image_token_cap(cells, self._image_limit), self._image_tile)

    # --- 1.3: requests without a session (runtime/oneshot.py) --------------------------------

    def tokenize(self, request: P.Tokenize) -> Future[TokenizeResult]:
        try:
            return self._engine().tokenize_async(  # type: ignore[return-value]
                request.text, add_special=request.add_special,
                parse_special=request.parse_special)
        except Exception as e:  # noqa: BLE001
            return _failed(e)

    def detokenize(self, request: P.Detokenize) -> Future[str]:
        try:
            return self._engine().detokenize_async(request.tokens)
        except Exception as e:  # noqa: BLE001
            return _failed(e)

    def embed(self, request: P.Embed) -> Future[EmbedResult]:
        try:
            return self._engine().embed_async(  # type: ignore[return-value]
                request.input, normalize=request.normalize)
        except Exception as e:  # noqa: BLE001
            return _failed(e)

    def complete(self, request: P.Complete, listener: StreamListener) -> Future[StreamHandle]:
        try:
            eng = self._engine()
            sampling = SamplingParams(**request.sampling.model_dump(), repeat_last_n=64)
        except Exception as e:  # noqa: BLE001
            return _failed(e)
        return eng.complete_async(  # type: ignore[return-value]
            request.prompt, sampling=sampling, priority=request.priority, listener=listener,
            parse_special=request.parse_special,
            max_tokens=request.max_tokens, stop=request.stop, grammar=request.grammar,
            json_schema=request.json_schema)

    def save_session(self, session: str, path: Path) -> Future[int]:
        try:
            return self._engine().save_session_async(session, path)
        except Exception as e:  # noqa: BLE001
            return _failed(e)

    def restore_session(self, path: Path, session: str | None = None) -> Future[str]:
        try:
            return self._engine().load_session_async(path, session_id=session)
        except Exception as e:  # noqa: BLE001
            return _failed(e)

    def set_priority(self, session: str, priority: int) -> None:
        self._engine().set_priority(session, priority)

    def session_info(self) -> dict[str, SessionFigures]:
        eng = self.engine
        return eng.session_info() if eng is not None else {}

    # --- control plane (never waits) ----------------------------------------------------------

    def frame(self, client: str, request: P.Frame) -> None:
        eng = self.engine
        if request.target_frame_time_ms is not None:
            delay = self.pacing.update(client, request.frame_time_ms,
                                       request.target_frame_time_ms)
            if eng is not None:
                eng.set_pacing(delay, hold_s=self.pacing.hold_s)
        if eng is not None and (request.busy_threads is not None or request.cpu_share is not None):
            eng.report_game_cpu(request.busy_threads, request.cpu_share)
        arb = self.arbiter
        if arb is not None:
            arb.on_frame(request.frame, request.vram_used, request.vram_budget,
                         request.frame_time_ms, request.target_frame_time_ms)

    def reserve_vram(self, request: P.ReserveVram, done: ReservationDone) -> None:
        with self._reserve_lock:
            if self._loading:  # for the arbiter of the model being loaded, with its time limit
                timeout = PolicyConfig().reservation_timeout_s
                entry: tuple[Reservation, ArbiterDone] = (Reservation(
                    request.bytes, request.deadline_frames, 0, 0,
                    expires_at=time.monotonic() + timeout), lambda _res, err: done(err))
                self._arriving.append(entry)
                timer = threading.Timer(timeout, self._expire_arriving, (entry,))
                timer.daemon = True
                timer.start()
                return
        arb = self.arbiter
        if arb is not None:
            arb.reserve(request.bytes, request.deadline_frames, lambda _res, err: done(err))
            return
        self._settle_without_arbiter(done)

    def _expire_arriving(self, entry: tuple[Reservation, ArbiterDone]) -> None:
        """The load outlasted the reservation's time limit: it ends as any late one does."""
        with self._reserve_lock:
            if entry not in self._arriving:
                return  # handed on when the load ended
            self._arriving.remove(entry)
        _end_all([entry], DeadlineMissedError(
            f"{entry[0].nbytes >> 20} MiB were not free in time (a model was loading); ask again"))

    def _settle_without_arbiter(self, done: Callable[[Exception | None], None]) -> None:
        eng = self.engine
        done(reservation_without_arbiter(sum(eng.memory()["gpu"].values()) if eng else 0))

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pacing_delay_s": self.pacing.delay_s()}
        eng = self.engine
        if eng is not None:
            st = eng.status()
            out.update(sessions=st["sessions"], plan=st["plan"], memory=st["memory"],
                       reshards=st["reshards"], engine=st)
        arb = self.arbiter
        if arb is not None:
            out["arbiter"] = arb.stats()
        return out

    def close(self) -> None:
        _end_all(self._stop_arbiter(), EngineClosedError("the sidecar is stopping"))
        self._decoder.close()
        eng, self.engine = self.engine, None
        if eng is not None:
            try:
                eng.close()
            except Exception:
                log.exception("engine close failed")
        self._outbox.close()


def encoder_room(ladder: PlanLadder, encoder: int, borrow: bool) -> EncoderRoom:
    """The engine's ``encoder_room`` under the arbiter, decided for every rung when the model
    loads: the encoder goes to the GPU only from a GPU rung (on the CPU rung the game has the
    VRAM). Set aside (``borrow`` False), every GPU rung already counts it; borrowed, the model
    moves to the fastest rung that leaves the encoder's ``encoder`` bytes free within the
    current rung's VRAM, or the encoder runs on the CPU where none does. A smaller rung that
    does not load sends the model to the CPU rung (the game is growing)."""

    def for_encoder(rung: Rung) -> Plan | None:
        if rung is ladder.cpu:
            return None
        if not borrow:
            return rung.plan
        room = rung.vram - encoder
        smaller = ladder.best_within(room)
        return smaller.plan if smaller.vram <= room else None

    return EncoderRoom(tuple((r.plan, for_encoder(r)) for r in ladder.rungs),
                       fallback=ladder.cpu.plan)


def _end_all(waiting: list[tuple[Reservation, ArbiterDone]], error: IgiError) -> None:
    for res, done in waiting:
        try:
            done(res, error)
        except Exception:
            log.exception("reservation callback failed")


def reservation_without_arbiter(held_vram: int) -> IgiError | None:
    """How a reservation ends when nothing can move the model (no arbiter: its ``vram_budget``
    fixed the placement): granted (None) when it holds no VRAM, else it cannot be freed."""
    if held_vram <= 0:
        return None
    return CannotFreeError(
        f"the model holds {held_vram >> 20} MiB of VRAM on a fixed plan (the VRAM arbiter is "
        "off), so none of it can be given back")


def _image_grid(mmproj: Path, max_tokens: int) -> tuple[int, int]:
    """(pixels per image-token side, image tokens per image at most) of the encoder; (0, 0)
    for one that ``read_encoder`` does not know."""
    try:
        enc = read_encoder(mmproj)
    except (OSError, ValueError):
        return 0, 0
    return enc.patch_size * enc.n_merge, min(max_tokens or enc.max_tokens, enc.max_tokens)


def _tell(done: ArbiterDone, res: Reservation, err: IgiError | None) -> None:
    """A reservation a previous arbiter held, ended without one (``partial`` binds it)."""
    done(res, err)
