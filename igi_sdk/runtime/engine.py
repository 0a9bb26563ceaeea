"""The inference engine: one llama.cpp model + context, many NPC sessions, one decode loop.

Threading (docs/architecture.md): llama.cpp contexts are not thread-safe, so one engine thread
(runtime/core.py's :class:`EngineCore`) owns every native call and every piece of engine state.
Other threads talk to it only through **typed commands** (runtime/commands.py) put in one queue;
it answers through **typed events** posted to one outbox (igi_sdk/events.py), whose own thread
completes futures and calls reply listeners, so no other layer's code ever runs on the engine
thread. :class:`Engine` is the thin facade: each method builds a command; the ``*_async`` ones
return a :class:`~concurrent.futures.Future` at once (what the sidecar's socket thread uses, so
that it never waits on the engine), the plain ones wait for it. Work that is not the engine's
(grammar compilation, save files, checksums) runs on its I/O thread.

A reshard is two commands, ``Release`` then ``LoadFirstFitting(candidates)``; the arbiter sends
them (its rules choose the candidates, on its own thread). When no candidate loads the engine is
*unavailable*: it keeps every session and answers model work with
:class:`EngineUnavailableError` until a load succeeds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from igi_sdk import threads
from igi_sdk.errors import (
    EngineClosedError,
    EngineUnavailableError,
    InvalidSamplingError,
    InvalidStateError,
    PromptTooLongError,
    UnknownSessionError,
)
from igi_sdk.events import Outbox, ReplyListener, SessionFigures, next_reply_id
from igi_sdk.model import ModelInventory, default_model_path, read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import (
    _native,
    engine_state,
    futures,
    image_turn,
    oneshot,
    oneshot_calls,
    snapshot,
)
from igi_sdk.runtime import commands as C
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.context_share import ContextShare
from igi_sdk.runtime.core import EngineCore
from igi_sdk.runtime.devices import Device
from igi_sdk.runtime.drafting import Drafting
from igi_sdk.runtime.encoder import Encoder, EncoderRoom
from igi_sdk.runtime.engine_ops import LoadOutcome
from igi_sdk.runtime.generation import Generation
from igi_sdk.runtime.image_turn import ImageInput
from igi_sdk.runtime.memory import MAX_PINNED, MAX_REMINDER_CHARS
from igi_sdk.runtime.memory import MODES as MEMORY_MODES
from igi_sdk.runtime.oneshot import Tokenized
from igi_sdk.runtime.oneshot_calls import Embeddings
from igi_sdk.runtime.overrides import LoadReport
from igi_sdk.runtime.sampling import (
    SamplingOverride,
    SamplingParams,
    line_sampling,
    prepare_grammar,
)
from igi_sdk.runtime.session import Session
from igi_sdk.runtime.text import Vocab
from igi_sdk.runtime.tools import ToolPlan, ToolSpec
from igi_sdk.runtime.tools import prepare as prepare_tools
from igi_sdk.runtime.vision import VisionContext

__all__ = ["EncoderRoom", "Engine", "EngineConfig", "LoadOutcome"]

T = TypeVar("T")


class Engine:
    """A loaded model with sessions. Every public method is thread-safe."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        plan: Plan | None = None,
        config: EngineConfig | None = None,
        *,
        progress: Callable[[float], None] | None = None,
        encoder_room: EncoderRoom | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        """``encoder_room`` (with ``config.vision_gpu``): where the LM stays while the encoder
        is open on the GPU, per LM placement (runtime/encoder.py); a smaller placement than the
        current one means the encoder borrows its VRAM from the LM: the engine reshards to it,
        encodes, frees the encoder and moves back, so the LM has the whole budget between
        images (``planner.vision`` prices when that pays). With it the encoder is never
        resident between image turns. ``outbox``: where events go (the sidecar keeps one
        across models); by default the engine has its own."""
        self.model_path = Path(model_path) if model_path else default_model_path()
        self.inventory: ModelInventory = read_inventory(self.model_path)
        self.config = config or EngineConfig()
        plan = plan or Plan.all_cpu()
        self._outbox = outbox or Outbox()
        self._own_outbox = outbox is None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="igi-engine-io")
        # grammars are prepared on a thread of their own: behind a save's file work (a slow
        # disk, a large save) every chat with a grammar or JSON schema waited
        self._grammars = ThreadPoolExecutor(1, thread_name_prefix="igi-engine-grammar")
        # priorities asked for and not yet applied by the engine thread, by session (the
        # session object too: a name closed and opened again is another session)
        self._asked_priority: dict[str, tuple[object, int]] = {}
        _native.init_backend(plan.copy_compute_min_batch)
        self._core = EngineCore(self.model_path, self.inventory, plan, self.config,
                                progress=progress, encoder_room=encoder_room,
                                outbox=self._outbox)
        try:
            self._core.start()  # re-raises a load failure here, in the caller's thread
        except BaseException:
            self._io.shutdown(wait=False)
            self._grammars.shutdown(wait=False)
            if self._own_outbox:
                self._outbox.close()
            raise

    # ======================================================================== public API

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx

    @property
    def available(self) -> bool:
        return self.state == "ready"

    @property
    def loaded(self) -> bool:
        """Whether a placement is loaded (read from any thread)."""
        return self._core._placed is not None

    @property
    def standby_ready(self) -> bool:
        """Whether the CPU placement is open beside a GPU one (``EngineConfig.standby``): a
        reshard then moves the sessions onto it and loads the next placement behind them."""
        return self._core._host is not None

    def cancel_load(self) -> bool:
        """Give up the placement loading behind the decode, if any (any thread)."""
        return self._core.cancel_load()

    @property
    def vision_borrows(self) -> int:
        """Image turns that moved the LM for the encoder."""
        return self._core._encoder.borrows

    @property
    def vision_opens(self) -> int:
        """mtmd contexts opened by this engine (a reopen per image turn when not resident)."""
        return self._core._encoder.opens

    # the engine thread's figures, read without waiting for it (for stats and listings)
    @property
    def plan(self) -> Plan:
        return self._core.plan

    @property
    def state(self) -> str:
        """"loading" | "ready" | "moving" (a reshard) | "unavailable" | "closed"."""
        return self._core.state

    @property
    def report(self) -> LoadReport:
        return self._core.report

    @property
    def gpu(self) -> Device | None:
        return self._core.gpu

    @property
    def reshard_count(self) -> int:
        return self._core.reshard_count

    @property
    def last_reshard_s(self) -> float:
        return self._core.last_reshard_s

    @property
    def last_load_s(self) -> float | None:
        """Seconds the last placement took to load (the first one's, until a reshard)."""
        return self._core.last_load_s

    @property
    def step_stats(self) -> dict[str, float]:
        return self._core.step_stats

    @property
    def share(self) -> ContextShare:
        return self._core.share

    def placement(self) -> dict[str, str]:
        """Tensor name -> 'gpu' | 'cpu', as llama.cpp reported it while loading."""
        return self._core.placement()

    def memory(self) -> dict[str, dict[str, int]]:
        """Bytes by device ('gpu', 'cpu') and category ('weights', 'kv', 'compute')."""
        return self._core.memory()

    def status(self) -> dict[str, Any]:
        """A consistent-enough summary that never waits for the engine thread (for ``stats``)."""
        return self._core.status()

    def context_status(self) -> dict[str, int]:
        """The shared context's cells (EngineCore.context_status)."""
        return self._core.context_status()

    def session_info(self) -> dict[str, SessionFigures]:
        """Tokens in context, whether replying, and priority of every session, read without
        waiting for the engine thread (figures of the last step, for listings; a priority just
        set reads as set, though the engine applies it at its next step)."""
        info = self._core.session_info()
        for sid, (session, priority) in list(self._asked_priority.items()):
            if sid in info and self._core._sessions.get(sid) is session:
                info[sid]["priority"] = priority
        return info

    def report_game_cpu(self, busy_threads: int | None, cpu_share: float | None) -> None:
        """What the game says of its CPU use (``frame``): the CPU threads' count follows it
        (runtime/threadpool.py). Any thread; never waits."""
        from igi_sdk.runtime.thread_control import GameCpu

        game = None if busy_threads is None and cpu_share is None else GameCpu(busy_threads,
                                                                               cpu_share)
        self._core.threads.report_game(game)

    def set_pacing(self, step_delay_s: float, hold_s: float | None = None) -> None:
        """Pause between decode steps (frame pacing); 0 = as fast as possible. While paused,
        sessions of priority <= 0 are decoded every other step; player-facing ones every step.
        ``hold_s``: the pause lapses unless set again within this long (a game that stops
        sending frames — it quit, or paused — must not keep slowing inference)."""
        self._core.set_pacing(step_delay_s, hold_s)

    # engine-thread state, for tests that read it through _call (an Inspect command)
    @property
    def _sessions(self) -> dict[str, Session]:
        return self._core._sessions

    @property
    def _vocab(self) -> Vocab | None:
        return self._core._vocab

    @property
    def _ctx(self) -> Any:
        return self._core._ctx

    @property
    def _encoder(self) -> Encoder:
        return self._core._encoder

    @property
    def _drafting(self) -> Drafting:
        return self._core._drafting

    def _open_vision(self) -> VisionContext:
        return self._core._open_vision()

    def drop_draft_async(self) -> Future[bool]:
        return self._submit(C.DropDraft())

    def drop_draft(self) -> bool:
        """Free the draft model (VRAM pressure: it is the first thing to go); replies in
        progress go on without drafting. True if there was one."""
        return _wait(self.drop_draft_async())

    def restore_draft_async(self) -> Future[bool]:
        """Load the configured draft model again after :meth:`drop_draft` (the VRAM came
        back). True if it was loaded now; False if it is loaded already, there is none, or no
        placement is loaded. A draft that fails to load raises its typed error; decoding goes
        on without it."""
        return self._submit(C.RestoreDraft())

    def open_session_async(
        self,
        system_prompt: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        priority: int = 0,
        session_id: str | None = None,
        history: Sequence[tuple[str, str]] = (),
        memory: str = "fold",
        pinned: Sequence[str] = (),
        reminder: str = "",
    ) -> Future[str]:
        """``history``: earlier turns of the conversation, (role, text) with role "system",
        "user", "assistant" or "tool" in order (a client that keeps its own transcript, as
        OpenAI-style clients do); they are read into the cache with the session's first
        line. ``memory``: "fold"
        (turns that no longer fit the session's share are summarised out of the context) or
        "off" (such a line is refused); ``pinned``: facts kept in every prompt; ``reminder``: a
        short note (a system message) restated right before each player line and never kept
        in the conversation, such as the character to stay in (runtime/memory.py)."""
        params = sampling or SamplingParams()
        prompt = system_prompt.replace(image_turn.IMAGE_SLOT, "") if system_prompt else None
        turns = _turns(history)
        if turns is None:
            out: Future[str] = Future()
            out.set_exception(InvalidStateError(_ROLES))
            return out
        if (memory not in MEMORY_MODES or len(pinned) > MAX_PINNED
                or len(reminder) > MAX_REMINDER_CHARS):
            out = Future()
            out.set_exception(InvalidStateError(
                f"memory is one of {MEMORY_MODES}, with at most {MAX_PINNED} pinned facts and "
                f"a reminder of at most {MAX_REMINDER_CHARS} characters"))
            return out
        facts = tuple(image_turn.clean(p) for p in pinned if p.strip())
        return self._submit(C.OpenSession(prompt, params, priority, session_id, turns,
                                          memory, facts, image_turn.clean(reminder.strip())))

    def open_session(self, system_prompt: str | None = None, *,
                     sampling: SamplingParams | None = None, priority: int = 0,
                     session_id: str | None = None,
                     history: Sequence[tuple[str, str]] = (), memory: str = "fold",
                     pinned: Sequence[str] = (), reminder: str = "") -> str:
        return _wait(self.open_session_async(system_prompt, sampling=sampling,
                                             priority=priority, session_id=session_id,
                                             history=history, memory=memory, pinned=pinned,
                                             reminder=reminder))

    def close_session_async(self, session_id: str) -> Future[None]:
        return self._submit(C.CloseSession(session_id))

    def close_session(self, session_id: str) -> None:
        _wait(self.close_session_async(session_id))

    def sessions(self) -> list[str]:
        return self._call(C.ListSessions())

    def set_priority(self, session_id: str, priority: int) -> None:
        """Takes effect at the next decode step; does not wait for the engine thread (a
        session closed meanwhile is left as it is)."""
        session = self._core._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"no session '{session_id}'")
        if len(self._asked_priority) > 4 * self.config.max_sessions:  # closed ones: forgotten
            live = self._core._sessions
            self._asked_priority = {k: v for k, v in self._asked_priority.items()
                                    if live.get(k) is v[0]}
        self._asked_priority[session_id] = (session, priority)
        self._submit(C.SetPriority(session_id, priority))

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
        listener: ReplyListener | None = None,
        images: Sequence[ImageInput] = (),
        tools: ToolSpec | None = None,
        tool_results: Sequence[tuple[str, str]] = (),
        history: Sequence[tuple[str, str]] | None = None,
        raw: str | None = None,
        sampling: SamplingOverride | Mapping[str, object] | None = None,
        logprobs: int | None = None,
        mixed: tuple[str | tuple[int, ...], ...] | None = None,
    ) -> Future[Generation]:
        """Like :meth:`chat`, but returns a future of the handle at once. ``raw``: the text is
        a prompt read as it is, without the chat template (:meth:`complete_async`)."""
        out: Future[Generation] = Future()
        if max_tokens < 1:
            out.set_exception(PromptTooLongError("max_tokens must be at least 1"))
            return out
        try:
            line = line_sampling(sampling, logprobs)
        except InvalidSamplingError as e:
            out.set_exception(e)
            return out
        stops = tuple(s for s in stop if s)
        turns = None if history is None else _turns(history)
        if history is not None and turns is None:
            refused: Future[Generation] = Future()
            refused.set_exception(InvalidStateError(_ROLES))
            return refused
        reply = next_reply_id()
        if listener is not None:
            self._core._outbox.subscribe(reply, listener)

        results = tuple((i, image_turn.clean(c)) for i, c in tool_results)

        def start(g: str | None, plan: ToolPlan | None = None) -> Future[Generation]:
            fut = self._submit(C.StartReply(session_id, user_text, max_tokens, stops, g,
                                            ignore_eos, tuple(images), reply,
                                            streamed=listener is not None, tools=plan,
                                            tool_results=results, history=turns, raw=raw,
                                            sampling=line, logprobs=logprobs, mixed=mixed))
            if listener is not None:  # a line refused: nothing will be said for it
                fut.add_done_callback(
                    lambda f: self._core._outbox.unsubscribe(reply) if f.exception() else None)
            return fut

        if tools is not None:  # schemas checked and the grammar compiled on the grammar worker
            return futures.prepared(self._grammars, partial(prepare_tools, tools, max_tokens),
                                    lambda plan: start(None, plan), lambda g: g.cancel())
        if grammar is None and json_schema is None:
            return start(None)
        # Checking (and converting) a grammar takes up to tens of ms within sampling.py's
        # limits: done on its own worker, it holds up neither the caller (the sidecar's socket
        # thread) nor the decode loop that every NPC shares, nor waits behind file work. A chat
        # with a grammar may thus start after commands sent after it. A chat the caller gave
        # up on (cancelled) has the reply it started stopped.
        return futures.prepared(self._grammars, partial(prepare_grammar, grammar, json_schema),
                                start, lambda g: g.cancel())

    def chat(self, session_id: str, user_text: str, **options: Any) -> Generation:
        """Add the player's line and start the NPC's reply; returns at once with a handle.

        Options: ``max_tokens``, ``stop``, ``grammar``, ``json_schema``, ``sampling`` (this
        line's own settings: a map of SamplingParams fields, or a SamplingOverride),
        ``logprobs`` (0..20: each text event carries its tokens' logprobs with that many
        alternatives), ``images`` (a list of
        :class:`ImageInput`; needs ``EngineConfig.mmproj``; where they go in the line:
        runtime/image_turn.py), ``ignore_eos`` (keep
        generating past end-of-turn tokens: benchmarks want exact lengths), ``listener(event)``
        — called on the outbox thread with each typed event of the reply (``ReplyText``, then
        ``ReplyDone`` or ``ReplyFailed``: igi_sdk/events.py); it should be quick."""
        return _wait(self.chat_async(session_id, user_text, **options))

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` for this model (special tokens parsed, no BOS added)."""
        return self._call(C.Tokenize(text))

    # --- requests without a session (runtime/oneshot.py) ------------------------------------

    def tokenize_async(self, text: str, *, add_special: bool = False,
                       parse_special: bool = True) -> Future[Tokenized]:
        """The token ids of ``text`` and each token's text."""
        return self._submit(C.Tokenize(text, add_special, parse_special, with_pieces=True))

    def detokenize_async(self, tokens: Sequence[int]) -> Future[str]:
        return self._submit(C.Detokenize(tuple(tokens)))

    def embed_async(self, inputs: Sequence[str | Sequence[int]], *,
                    normalize: bool = True) -> Future[Embeddings]:
        """One vector per input (a text, or token ids), in order: read a decode of
        ``oneshot.EMBED_CTX`` tokens per engine command, so other replies decode between."""
        return oneshot_calls.embed(self._submit, inputs, normalize)

    def complete_async(self, prompt: str | Sequence[str | int], *,
                       sampling: SamplingParams | None = None, priority: int = 0,
                       listener: ReplyListener | None = None, parse_special: bool = False,
                       **options: Any) -> Future[Generation]:
        """Continue a raw ``prompt`` (no chat template) in a session of its own, closed when
        the reply ends. Its text is data unless ``parse_special`` (special-token text is then
        the token, as llama-server reads a prompt: for a client that writes its own template
        markup). A prompt may also be texts and token ids in order, as llama-server takes one
        (:func:`oneshot.mixed_tokens`): the ids are read as given, special ones too (an id
        outside the vocabulary is InvalidInputError). ``options`` as :meth:`chat_async`'s."""
        raw = "markup" if parse_special else "data"
        mixed = None if isinstance(prompt, str) else oneshot.mixed_pieces(prompt)
        text = (image_turn.clean(prompt) if isinstance(prompt, str)
                else "".join(p for p in mixed or () if isinstance(p, str)))

        def start(sid: str, relay: ReplyListener) -> Future[Generation]:
            return self.chat_async(sid, text, raw=raw, listener=relay, mixed=mixed, **options)

        return oneshot_calls.complete(
            lambda: self.open_session_async(None, sampling=sampling, priority=priority),
            start, self.close_session_async, listener)

    def snapshot_async(self, session_id: str) -> Future[bytes]:
        # captured on the engine thread; packed (one copy + the checksum) on the I/O thread
        return futures.then(self._submit(C.Snapshot(session_id)),
                            lambda parts: snapshot.pack(*parts), self._io)

    def snapshot(self, session_id: str) -> bytes:
        """The session's whole state (KV cache + conversation) as bytes; it must be idle."""
        return _wait(self.snapshot_async(session_id))

    def restore_async(self, data: bytes, *, session_id: str | None = None) -> Future[str]:
        # the bytes are verified (length, checksum) on the I/O thread before the engine sees them
        return futures.chain(self._on_io(lambda: snapshot.unpack(data)), lambda unpacked:
                             self._submit(C.Restore(unpacked[0], unpacked[1], session_id)))

    def restore(self, data: bytes, *, session_id: str | None = None) -> str:
        """Recreate a session from :meth:`snapshot` bytes; returns its id. Damaged, truncated
        or foreign bytes raise :class:`InvalidStateError` and change nothing."""
        return _wait(self.restore_async(data, session_id=session_id))

    def save_session_async(self, session_id: str, path: str | Path) -> Future[int]:
        """Snapshot on the engine thread, write the file on an I/O thread; bytes written. The
        file is replaced atomically (a crash leaves the old save or the new one); OS failures
        raise :class:`SaveFailedError` (:class:`DiskFullError` when out of space), and leave an
        earlier save of that path unchanged."""
        target = Path(path)
        return futures.then(self._submit(C.Snapshot(session_id)),
                            lambda parts: snapshot.save(target, snapshot.parts(*parts)), self._io)

    def save_session(self, session_id: str, path: str | Path) -> None:
        _wait(self.save_session_async(session_id, path))

    def load_session_async(self, path: str | Path, *,
                           session_id: str | None = None) -> Future[str]:
        p = Path(path)
        limit = engine_state.max_save_bytes(self.inventory, self.config.n_ctx)
        return futures.chain(self._on_io(lambda: engine_state.read_save(p, limit)), lambda unpacked:
                             self._submit(C.Restore(unpacked[0], unpacked[1], session_id)))

    def load_session(self, path: str | Path, *, session_id: str | None = None) -> str:
        return _wait(self.load_session_async(path, session_id=session_id))

    def _on_io(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the I/O thread (file work and checksums stay off the engine thread)."""
        return futures.on_pool(self._io, fn)

    def release_async(self) -> Future[None]:
        """The first step of a reshard: park the context's state in host memory and free the
        placement. Model work waits until :meth:`load_first_fitting_async` (the second step,
        which must follow) has loaded one."""
        return self._submit(C.Release(then_load=True))

    def load_first_fitting_async(self, candidates: Sequence[Plan]) -> Future[LoadOutcome]:
        """The second step: load the first of ``candidates`` that loads and put the parked
        state back, sessions and replies as they were. When none loads the engine is
        unavailable (sessions kept, active replies end with ``engine_unavailable``)."""
        return self._submit(C.LoadFirstFitting(tuple(candidates)))

    def reshard(self, plan: Plan) -> float:
        """Reload the model with another placement, keeping every session (and active replies)
        where they were. Returns the seconds it took.

        If ``plan`` fails to load, the engine is left *unavailable* (sessions kept) and the
        error is raised; reshard again to a plan that fits (the arbiter does this for the
        sidecar, with its own candidates)."""
        t0 = time.perf_counter()
        _wait(self.release_async())
        out = _wait(self.load_first_fitting_async([plan]))
        if out.landed is None:
            raise EngineUnavailableError(
                f"plan '{plan.name}' did not load: {out.failures[0][1] if out.failures else ''}")
        return time.perf_counter() - t0

    def close(self) -> None:
        if not self._core.closed:
            try:
                self._call(C.Shutdown())
            except EngineClosedError:
                pass
            self._core.join(timeout=30)
        self._io.shutdown(wait=False)
        self._grammars.shutdown(wait=False)
        if self._own_outbox:
            self._outbox.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, command: C.Command) -> Future:
        return self._core.submit(command)

    def _call(self, command: C.Command | Callable[[], T]) -> Any:
        """Run ``command`` and wait; a callable is an :class:`~commands.Inspect` (tests)."""
        if not isinstance(command, C.Command):
            command = C.Inspect(command)
        return _wait(self._submit(command))


def _wait(fut: Future[T]) -> T:
    """The outcome of an engine command, waited for. Outcomes are delivered by the outbox
    thread, so waiting there (in a reply listener or a future's callback) could never end:
    refused at once instead."""
    if threading.current_thread().name == threads.OUTBOX:
        raise InvalidStateError(
            "a reply listener or a future's callback waited for the engine; they run on the "
            "thread that delivers the engine's outcomes: use the *_async methods there")
    return fut.result()


_ROLES = "history roles are 'system', 'user', 'assistant' and 'tool'"


def _turns(history: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
    """A client's transcript as the engine reads it (image slots and NULs out: contents are
    C text holding no image), None if a role is not one it reads."""
    turns = tuple((role, image_turn.clean(text)) for role, text in history)
    if any(role not in ("system", "user", "assistant", "tool") for role, _ in turns):
        return None
    return turns
