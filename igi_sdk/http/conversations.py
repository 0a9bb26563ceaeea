"""Which NPC session an OpenAI-style request continues (pure: no sockets, no model).

OpenAI clients send the whole transcript with every request. The face keeps, per conversation,
the transcript its session's KV cache holds; a request whose transcript (before its new line)
is exactly that continues the session and only the new line is prefilled. One whose transcript
differs (a trimmed reply, an inserted instruction, a continued assistant turn) continues it
too, sending its transcript with the line: the sidecar keeps the longest common token prefix
and reads the rest. A request names its conversation by ``prompt_cache_key`` (or ``user``, or
an ``x-session-id`` header); a second request on a name while one is answered gets a session
of its own. Without a name, the idle conversation with the same system prompt whose transcript
the request's continues (else the one sharing the most leading turns with it) is the one. Any
other request starts a session whose history is handed over with it (read once, then kept).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field, replace

# (role: "system" | "user" | "assistant" | "tool", text), or with tools (http/tools.py) a
# third item: a tool result's call id, or an assistant turn's calls as JSON
Turn = tuple[str, str] | tuple[str, str, str]


@dataclass
class Conversation:
    session: str  # the protocol session's name
    system: str
    turns: list[Turn] = field(default_factory=list)  # what the session's cache holds
    key: str | None = None
    busy: bool = False  # a request is being answered on it
    # the transcript the request being answered sent with its line (``chat.history``): what
    # the session holds before that line once it is answered; None: ``turns``
    sent: list[Turn] | None = None
    prefill: bool = False  # the request being answered continues the last assistant turn
    stopping: bool = False  # its reader went away: the reply is being stopped (kept after)

    def continues(self, system: str, history: list[Turn]) -> bool:
        return self.system == system and self.turns == history

    def shared(self, history: list[Turn]) -> int:
        """Leading turns ``history`` has in common with what the session holds."""
        n = 0
        for mine, theirs in zip(self.turns, history, strict=False):
            if mine != theirs:
                break
            n += 1
        return n


@dataclass(frozen=True)
class Match:
    conversation: Conversation
    fresh: bool  # a new session: open it with ``history``
    history: tuple[Turn, ...] = ()
    replaced: str | None = None  # a session to close (its transcript no longer matches)
    # the transcript to send with the line (``chat.history``): the session's is replaced by
    # it, and the sidecar reads only the tokens that differ from its cache's
    rewrite: tuple[Turn, ...] | None = None


class Conversations:
    """The face's conversations, at most ``capacity`` (the least recently used go first: their
    sessions are closed by the caller)."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._by_session: OrderedDict[str, Conversation] = OrderedDict()
        self._by_key: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_session)

    def stopping(self) -> bool:
        """A reply whose reader went away is being stopped (its conversation is busy for a
        moment: the reader's next request is likely on its way)."""
        return any(c.stopping for c in self._by_session.values())

    def busy_with(self, key: str | None, system: str, history: list[Turn]) -> bool:
        """The conversation a request would continue is answering another one: its name's,
        or (no name) one with its system prompt sharing a leading turn with it."""
        if key is not None:
            sid = self._by_key.get(key)
            return sid is not None and self._by_session[sid].busy
        return any(c.busy and c.key is None and c.system == system and c.shared(history) > 0
                   for c in self._by_session.values())

    def match(self, key: str | None, system: str, history: list[Turn],
              prefill: bool = False) -> Match:
        """The conversation a request (``history``: its turns before the new line; with
        ``prefill``, all its turns, the last an assistant's to continue) continues, or a new
        one to open. A conversation whose session holds another transcript is rewritten (the
        sidecar keeps the common token prefix), never closed and read again; a named one
        answering another request is left alone: the request gets a session of its own."""
        if key is not None and (sid := self._by_key.get(key)) is not None:
            conv = self._by_session[sid]
            self._by_session.move_to_end(sid)
            if conv.busy:  # two requests at once under one name: neither is cut off
                return self._fresh(None, system, history, prefill)
            if conv.system != system:
                # another system prompt: a new session (the old one closed)
                return replace(self._fresh(key, system, history, prefill), replaced=sid)
            return self._continue(conv, history, prefill)
        if key is None:
            best: Conversation | None = None
            exact = False
            for conv in self._by_session.values():
                if conv.busy or conv.key is not None or conv.system != system:
                    continue
                whole = not prefill and conv.turns == history
                # an exact continuation first (the longest), else the most turns in common
                if whole and (not exact or best is None or len(conv.turns) > len(best.turns)):
                    best, exact = conv, True
                elif not exact and conv.shared(history) > 0 and (
                        best is None or conv.shared(history) > best.shared(history)):
                    best = conv
            if best is not None:
                self._by_session.move_to_end(best.session)
                return self._continue(best, history, prefill)
        return self._fresh(key, system, history, prefill)

    def _continue(self, conv: Conversation, history: list[Turn], prefill: bool) -> Match:
        rewrite = prefill or conv.turns != history
        conv.sent, conv.prefill = (list(history) if rewrite else None), prefill
        return Match(conv, fresh=False, rewrite=tuple(history) if rewrite else None)

    def _fresh(self, key: str | None, system: str, history: list[Turn],
               prefill: bool) -> Match:
        # a continued assistant turn is sent with the line (the session opens without it)
        opened = [] if prefill else history
        conv = self._new(key, system, opened)
        conv.sent, conv.prefill = (list(history) if prefill else None), prefill
        return Match(conv, fresh=True, history=tuple(opened),
                     rewrite=tuple(history) if prefill else None)

    def evictions(self) -> list[str]:
        """Sessions to close so the table stays within its capacity (least recent first)."""
        out = []
        while len(self._by_session) > self.capacity:
            sid, conv = next(iter(self._by_session.items()))
            if conv.busy:
                self._by_session.move_to_end(sid)
                if all(c.busy for c in self._by_session.values()):
                    break
                continue
            self.forget(sid)
            out.append(sid)
        return out

    def least_recent_idle(self, but: str) -> str | None:
        """The session of the least recently used conversation not answering now (other than
        ``but``): the one to close when the sidecar has no session slot left."""
        return next((sid for sid, c in self._by_session.items()
                     if not c.busy and sid != but), None)

    def answered(self, conv: Conversation, line: str, reply: str) -> None:
        """The session's cache now holds ``line`` and ``reply`` too (the transcript sent with
        the line first; continuing its last assistant turn, ``reply`` joins that turn)."""
        before = conv.sent if conv.sent is not None else conv.turns
        if conv.prefill and before and before[-1][0] == "assistant":
            conv.turns = [*before[:-1], ("assistant", before[-1][1] + reply)]
        else:
            conv.turns = [*before, ("user", line), ("assistant", reply)]
        conv.sent, conv.prefill = None, False

    def answered_turns(self, conv: Conversation, turns: list[Turn]) -> None:
        """The session's cache now holds ``turns`` too (a line with tool results or calls),
        after the transcript sent with the line, if any."""
        before = conv.sent if conv.sent is not None else conv.turns
        if conv.prefill and turns and before and before[-1][0] == "assistant":
            # it continued the last assistant turn: the reply joins that turn
            conv.turns = [*before[:-1], ("assistant", before[-1][1] + turns[-1][1])]
        else:
            conv.turns = [*before, *turns]
        conv.sent, conv.prefill = None, False

    def forget(self, session: str) -> None:
        conv = self._by_session.pop(session, None)
        if conv is not None and conv.key is not None and self._by_key.get(conv.key) == session:
            del self._by_key[conv.key]

    def _new(self, key: str | None, system: str, history: list[Turn]) -> Conversation:
        conv = Conversation(f"http.{secrets.token_hex(8)}", system, list(history), key)
        self._by_session[conv.session] = conv
        if key is not None:
            old = self._by_key.get(key)
            if old is not None and old in self._by_session:
                self._by_session.pop(old)
            self._by_key[key] = conv.session
        return conv
