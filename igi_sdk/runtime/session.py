"""What the engine keeps per NPC conversation (a session) and per reply being generated (a turn),
and its table of sessions; owned by the engine thread. A session's state changes only through
its methods (the transitions of a conversation: a line begins, tokens are decoded, the reply is
committed or rolled back, the cache is lost, a save is applied), so that the modules that drive
them (engine, replies, drafting, images, reshards, saves) cannot leave it half-changed."""

from __future__ import annotations

import codecs
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from igi_sdk.errors import SessionBusyError, TooManySessionsError, UnknownSessionError
from igi_sdk.events import TokenLogprob
from igi_sdk.runtime.generation import Generation
from igi_sdk.runtime.memory import Memory, head_of
from igi_sdk.runtime.sampling import SamplerChain, SamplingParams
from igi_sdk.runtime.tools import CallReader, ToolPlan

# ``committed_text`` of a cache that holds a token prefix ending at no known place of the text
# (kept from a rewritten conversation): no rendered prompt starts with it (contents are C text),
# so the next line finds its prefix by tokens
UNALIGNED = "\0"


@dataclass
class Session:
    id: str
    seq: int
    params: SamplingParams
    priority: int
    messages: list[dict[str, str]]
    committed_text: str = ""  # the chat-template text that the KV cache (+ pending) holds
    tokens: list[int] = field(default_factory=list)  # tokens decoded into the KV cache
    pending: list[int] = field(default_factory=list)  # sampled, not yet decoded
    history: list[int] = field(default_factory=list)  # sampled tokens (repeat penalty)
    n_sampled: int = 0
    turn: Turn | None = None
    reread: bool = False  # its KV cache was lost: re-read the conversation on the next turn
    # images (runtime/image_turn.py): ``tokens`` has one entry per position, an image's cells
    # beyond its positions are counted here; the inputs are kept to re-read the conversation
    # (not after a restore: saves hold the KV state, not the images)
    image_cells: int = 0
    n_images: int = 0
    images: list[Any] = field(default_factory=list)
    # what stays in context past its share, and the turns that left it (runtime/memory.py)
    memory: Memory = field(default_factory=Memory)
    last_line: int = 0  # the order of its latest line: idle cells go least recent first

    @property
    def cells(self) -> int:
        """KV cells the conversation holds (a position per token, plus images' extra cells)."""
        return len(self.tokens) + self.image_cells

    def reread_for(self, turn: Turn) -> None:
        """``turn`` reads the whole conversation again: the cache was emptied for it."""
        self.tokens, self.image_cells, self.reread = [], 0, False
        turn.start_tokens = 0

    def kept_prefix(self, turn: Turn, keep: int) -> None:
        """``turn`` reads its prompt after the first ``keep`` tokens of the cache, the rest of
        which was dropped for it (runtime/prefix.py)."""
        del self.tokens[keep:]
        self.pending, self.reread, self.committed_text = [], False, UNALIGNED
        turn.start_tokens, turn.start_pending = keep, []

    def begin(self, turn: Turn, messages: list[dict[str, str]], images: list[Any]) -> None:
        """A line starts ``turn``; the line is the last of ``messages`` (with its tool
        results, the last few; continuing the last assistant message, ``messages`` end with
        it)."""
        turn.start_messages = self.messages
        self.images.extend(images)
        self.n_images += len(images)
        self.pending = []
        self.messages = messages
        self.turn = turn
        self.last_line = turn.order

    def decoded(self, tokens: list[int]) -> None:
        """``tokens`` are in the KV cache now."""
        self.tokens.extend(tokens)

    def image_decoded(self, positions: int, cells: int, placeholder: int) -> None:
        """An image took ``positions`` positions and ``cells`` KV cells."""
        self.tokens.extend([placeholder] * positions)
        self.image_cells += cells - positions

    def sampled_not_decoded(self, token: int) -> None:
        """The reply ended on ``token``, which the next line feeds first."""
        self.pending = [token]

    def committed(self, prompt_text: str, said: str, *, prefill: bool = False) -> None:
        """The reply joined the conversation (the cache holds all of it: a re-read in the
        reply, :meth:`reread_in_reply`, is complete); ``prefill``: it continued the last
        assistant message, which now holds both."""
        if prefill:
            last = self.messages[-1]
            self.messages[-1] = {**last, "content": last["content"] + said}
        else:
            self.messages.append({"role": "assistant", "content": said})
        self.committed_text = prompt_text + said
        self.reread = False

    def rolled_back(self, turn: Turn) -> None:
        """The line of ``turn`` is undone: the conversation is as before it."""
        del self.tokens[turn.start_tokens:]
        if turn.media is not None:
            turn.media.restore(self)
        self.pending = list(turn.start_pending)
        # the conversation before the line (a history the line replaced comes back too)
        self.messages = (turn.start_messages if turn.start_messages is not None
                         else self.messages[:-1])

    def reread_in_reply(self) -> list[int]:
        """Its KV cells are gone while it replies: the tokens it held, to be read again ahead
        of the reply's input. Until the reply is committed the conversation counts as lost
        (a rollback or an error mid-way leaves a partial cache: the next line re-reads it)."""
        tokens, self.tokens, self.reread = self.tokens, [], True
        return tokens

    @property
    def rereadable(self) -> bool:
        """Whether its conversation can be read again from its messages (a restored session
        with images cannot: saves hold the KV state, not the images)."""
        return self.n_images <= len(self.images)

    def cache_lost(self) -> None:
        """Its KV cells are gone: the next line reads the conversation again."""
        self.tokens, self.pending, self.reread, self.image_cells = [], [], True, 0


@dataclass
class Turn:
    """One reply being generated."""

    session: Session
    handle: Generation
    feed: list[int]  # tokens still to decode before the next sample
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    stop: tuple[str, ...]
    grammar: str | None
    chain: SamplerChain | None = None
    generated: list[int] = field(default_factory=list)
    raw: str = ""
    emitted: int = 0
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    start_tokens: int = 0
    cached_cells: int = 0  # KV cells the session held that this line reuses (not read again)
    start_pending: list[int] = field(default_factory=list)
    order: int = 0
    ignore_eos: bool = False
    t0: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    images: list[Any] = field(default_factory=list)  # image_turn.PendingImage, in order
    media: Any = None  # image_turn.MediaMark at the start (rollback)
    # this reply's sampling (the session's, or merged with its line's own: chat.sampling)
    params: SamplingParams | None = None
    logprobs: int | None = None  # alternatives per token's logprobs (None: not asked)
    lp: list[TokenLogprob] = field(default_factory=list)  # sampled, text not yet emitted
    start_messages: list[dict[str, str]] | None = None  # the conversation before the line
    prefill: bool = False  # the reply continues the last assistant message
    # a line with tools (runtime/tools.py): its plan, and the reader of the reply's calls
    # (None with tool_choice "none": the reply is text)
    tools: ToolPlan | None = None
    calls: CallReader | None = None
    # a summary of turns leaving the context, written before the line (memory_turn.Summary);
    # its text is not the line's reply
    memo: Any = None
    folded: tuple[int, int] = (0, 0)  # turns dropped / summarised before this line


class SessionTable:
    """The sessions by id and the llama.cpp sequences free for new ones. Changed on the engine
    thread only; ``by_id`` is also read (copied) from other threads without waiting."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.by_id: dict[str, Session] = {}
        self.free_seqs = list(range(max_sessions))

    def get(self, session_id: str) -> Session:
        s = self.by_id.get(session_id)
        if s is None:
            raise UnknownSessionError(f"no session '{session_id}' (closed, or never opened)")
        return s

    def open(
        self, system_prompt: str | None, params: SamplingParams, priority: int, sid: str | None,
        history: tuple[tuple[str, str], ...] = (), memory: Memory | None = None,
    ) -> str:
        if not self.free_seqs:
            raise TooManySessionsError(
                f"all {self.max_sessions} session slots are in use; close one first"
            )
        sid = sid or uuid.uuid4().hex[:12]
        if sid in self.by_id:
            raise SessionBusyError(f"session '{sid}' already exists")
        # image slots are already out of the prompt (Engine.open_session_async)
        memory = memory or Memory()
        memory.system = system_prompt or None
        messages = head_of(memory)  # the system prompt, and the pinned facts after it
        # earlier turns: read into the cache with the first line (nothing is committed yet)
        messages += [{"role": role, "content": text} for role, text in history]
        seq = self.free_seqs.pop(0)
        self.by_id[sid] = Session(sid, seq, params, priority, messages, memory=memory)
        return sid

    def remove(self, s: Session) -> None:
        """Forget ``s`` and free its sequence (its KV cells are the caller's to drop)."""
        del self.by_id[s.id]
        self.free_seqs.append(s.seq)
        self.free_seqs.sort()
