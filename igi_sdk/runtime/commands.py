"""The engine thread's typed commands: what other threads may ask of it.

A command is data (no callables): the engine thread takes it from its one queue, runs its
handler and posts the outcome to the outbox (igi_sdk/events.py), which completes ``done``.
``needs_model``: the command uses the loaded placement, so it waits while the model is between
:class:`Release` and :class:`LoadFirstFitting` (a reshard in progress) instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from igi_sdk.planner import Plan
from igi_sdk.runtime.background_load import LoadDone
from igi_sdk.runtime.image_turn import ImageInput
from igi_sdk.runtime.sampling import SamplingOverride, SamplingParams
from igi_sdk.runtime.tools import ToolPlan


@dataclass
class Command:
    done: Future[Any] = field(default_factory=Future, kw_only=True, repr=False)
    needs_model: ClassVar[bool] = False


@dataclass
class OpenSession(Command):
    system_prompt: str | None
    params: SamplingParams
    priority: int
    session_id: str | None
    history: tuple[tuple[str, str], ...] = ()  # (role, text): earlier turns, in order
    memory: str = "fold"  # "fold" | "off": a conversation past its share (runtime/memory.py)
    pinned: tuple[str, ...] = ()  # facts kept in every prompt
    reminder: str = ""  # restated before each line, never kept (runtime/memory.py)


@dataclass
class CloseSession(Command):
    session_id: str


@dataclass
class ListSessions(Command):
    pass


@dataclass
class StartReply(Command):
    """A player's line and the NPC's reply to it; ``reply``: the id its events carry."""

    session_id: str
    text: str
    max_tokens: int
    stop: tuple[str, ...]
    grammar: str | None
    ignore_eos: bool
    images: tuple[ImageInput, ...]
    reply: int
    streamed: bool  # someone subscribed to the reply's events in the outbox
    sampling: SamplingOverride | None = None  # the line's own sampling (validated)
    logprobs: int | None = None
    # 1.3: the line's tools made ready (runtime/tools.py), and the results of the previous
    # reply's calls as (call id, content), read before the line's text
    tools: ToolPlan | None = None
    tool_results: tuple[tuple[str, str], ...] = ()
    # the conversation after the system prompt, replaced before the line (runtime/prefix.py)
    history: tuple[tuple[str, str], ...] | None = None
    # the text is a raw prompt (``complete``), without the chat template: "data" (special-token
    # text is text) or "markup" (read as llama-server reads a prompt: such text is the token)
    raw: str | None = None
    # a raw prompt given (partly) as token ids, in order: texts and runs of ids
    # (runtime/oneshot.py's mixed_tokens); ``text`` is then its texts joined
    mixed: tuple[str | tuple[int, ...], ...] | None = None
    needs_model: ClassVar[bool] = True


@dataclass
class Tokenize(Command):
    text: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False  # answers runtime.oneshot.Tokenized; else the ids alone
    needs_model: ClassVar[bool] = True


@dataclass
class Detokenize(Command):
    tokens: tuple[int, ...]
    needs_model: ClassVar[bool] = True


@dataclass
class Embed(Command):
    """Embeddings of ``inputs[start:]``, as many as one decode takes (runtime/oneshot.py):
    answers an EmbedChunk saying where the next command starts."""

    inputs: tuple[str | tuple[int, ...], ...]
    start: int
    normalize: bool
    needs_model: ClassVar[bool] = True


@dataclass
class Snapshot(Command):
    """An idle session's (JSON header, KV bytes)."""

    session_id: str
    needs_model: ClassVar[bool] = True


@dataclass
class Restore(Command):
    """A session from a verified snapshot (``meta``: its checked JSON header)."""

    meta: dict[str, Any]
    kv: bytes | memoryview
    session_id: str | None
    needs_model: ClassVar[bool] = True


@dataclass
class SetPriority(Command):
    session_id: str
    priority: int


@dataclass
class DropDraft(Command):
    pass


@dataclass
class RestoreDraft(Command):
    needs_model: ClassVar[bool] = True


@dataclass
class Release(Command):
    """Park the context's state in host memory and free the placement. ``then_load``: a
    :class:`LoadFirstFitting` follows (a reshard): model work waits for it meanwhile, and the
    engine is not shown as unavailable."""

    then_load: bool = True


@dataclass
class LoadFirstFitting(Command):
    """Load the first of ``candidates`` that loads and put the parked state back; when none
    does, the engine is unavailable (sessions kept) and active replies end, typed. Answers a
    :class:`~igi_sdk.runtime.engine_ops.LoadOutcome`."""

    candidates: tuple[Plan, ...]


@dataclass
class PlacementReady(Command):
    """A loader thread finished opening a placement (or failed to): the engine takes it over
    at its next step boundary (runtime/background_load.py)."""

    outcome: LoadDone


@dataclass
class Shutdown(Command):
    pass


@dataclass
class Inspect(Command):
    """Read engine-thread state between two steps (tests and diagnostics only; the one
    command that carries code, never sent by the sidecar)."""

    read: Callable[[], object]
