"""A conversation rewritten before a line keeps its common token prefix; one ending with an
assistant message is continued (runtime/prefix.py through the engine, on the default model)."""

from __future__ import annotations

import pytest

from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
NPC = "You are Mira, a cheerful innkeeper. Answer in one short sentence."


@pytest.fixture(scope="module")
def engine(default_model):
    with Engine(default_model, Plan.all_cpu(),
                EngineConfig(n_ctx=4096, max_sessions=4, n_threads=2, prefill_chunk=32)) as eng:
        yield eng


def _reply(engine, sid, line, **kw):
    return engine.chat(sid, line, **kw).result(timeout=120)


def _tokens(engine, sid) -> list[int]:
    return list(engine._core._sessions[sid].tokens)


def test_a_trimmed_reply_rereads_only_what_changed_and_replies_as_a_full_read(engine) -> None:
    sid = engine.open_session(NPC, sampling=GREEDY)
    first = _reply(engine, sid, "Do you have a room for the night?", max_tokens=24)
    held = _tokens(engine, sid)
    words = first.text.split()
    trimmed = " ".join(words[:max(1, len(words) // 2)])
    history = [("user", "Do you have a room for the night?"), ("assistant", trimmed)]
    line = "How much is it?"
    second = _reply(engine, sid, line, max_tokens=8, history=history)
    # the cache kept the system prompt, the first line and the reply's common start
    assert second.cached_tokens >= first.prompt_tokens
    assert second.cached_tokens + second.prompt_tokens < len(held) + 40
    assert second.prompt_tokens < first.prompt_tokens  # read: the cut and the new line only
    # the same transcript opened by a new session gives the same reply (it shares the cells
    # of the prefix the first session holds: test_shared_prefix.py)
    fresh = engine.open_session(NPC, sampling=GREEDY, history=history)
    whole = _reply(engine, fresh, line, max_tokens=8)
    assert (whole.cached_tokens + whole.prompt_tokens
            == second.cached_tokens + second.prompt_tokens)
    assert whole.text == second.text
    # and the next line continues the rewritten session from its text, as the new one does
    a = _reply(engine, sid, "Thanks.", max_tokens=6)
    b = _reply(engine, fresh, "Thanks.", max_tokens=6)
    assert a.cached_tokens == b.cached_tokens and a.text == b.text
    assert _tokens(engine, sid)[:a.cached_tokens] == _tokens(engine, fresh)[:b.cached_tokens]
    engine.close_session(sid)
    engine.close_session(fresh)


def test_a_system_turn_inserted_mid_conversation_is_read_where_it_stands(engine) -> None:
    sid = engine.open_session(NPC, sampling=GREEDY)
    first = _reply(engine, sid, "Hello!", max_tokens=12)
    history = [("user", "Hello!"), ("assistant", first.text),
               ("system", "Lydia, a warrior, joins the conversation.")]
    r = _reply(engine, sid, "Who is this?", max_tokens=8, history=history)
    assert r.text and r.cached_tokens >= first.prompt_tokens
    msgs = engine._core._sessions[sid].messages
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "system", "user",
                                         "assistant"]
    engine.close_session(sid)


def test_an_assistant_last_history_is_continued(engine) -> None:
    sid = engine.open_session(NPC, sampling=GREEDY)
    history = [("user", "What is your name?"), ("assistant", "My name is")]
    r = _reply(engine, sid, "", max_tokens=8, history=history)
    assert r.completion_tokens >= 1
    assert not r.text.lstrip().startswith("My name is")  # the continuation only
    msgs = engine._core._sessions[sid].messages
    # the committed assistant message is the prefill and its continuation, one message
    assert msgs[-1] == {"role": "assistant", "content": "My name is" + r.text}
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    # the next line reads only itself: the cache holds the continued message as rendered
    nxt = _reply(engine, sid, "Nice to meet you.", max_tokens=4)
    assert nxt.cached_tokens >= r.cached_tokens + r.prompt_tokens
    engine.close_session(sid)


def test_a_cancelled_rewrite_puts_the_conversation_back(engine) -> None:
    sid = engine.open_session(NPC, sampling=GREEDY)
    first = _reply(engine, sid, "Hi.", max_tokens=10)
    before = list(engine._core._sessions[sid].messages)
    gen = engine.chat(sid, "Bye.", max_tokens=8,
                      history=[("user", "Something else entirely.")])
    gen.cancel()
    gen.result(timeout=60)
    s = engine._core._sessions[sid]
    if not gen.result().completion_tokens:  # cancelled before its first token: undone
        assert s.messages == before
    # either way the next line is read against what the cache holds
    again = _reply(engine, sid, "Hi again.", max_tokens=4)
    assert again.completion_tokens >= 1 and again.cached_tokens >= first.prompt_tokens // 2
    engine.close_session(sid)
