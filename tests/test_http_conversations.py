"""Which session an OpenAI-style request continues (igi_sdk/http/conversations.py, pure)."""

from __future__ import annotations

from igi_sdk.http.conversations import Conversations

SYS = "You are Brom."


def test_a_keyed_conversation_continues_while_its_transcript_matches() -> None:
    t = Conversations()
    first = t.match("brom", SYS, [])
    assert first.fresh and first.history == ()
    t.answered(first.conversation, "Hi.", "Welcome.")
    again = t.match("brom", SYS, [("user", "Hi."), ("assistant", "Welcome.")])
    assert not again.fresh and again.conversation is first.conversation
    # the client edited the reply it keeps: a new session with its version, the old one closed
    edited = t.match("brom", SYS, [("user", "Hi."), ("assistant", "Hello!")])
    assert edited.fresh and edited.replaced == first.conversation.session
    assert edited.history == (("user", "Hi."), ("assistant", "Hello!"))
    assert len(t) == 1


def test_without_a_key_the_longest_matching_transcript_is_continued() -> None:
    t = Conversations()
    a = t.match(None, SYS, []).conversation
    t.answered(a, "Hi.", "Welcome.")
    b = t.match(None, SYS, []).conversation  # another conversation, same opening
    assert b is not a
    t.answered(a, "A sword?", "Ten gold.")
    history = [("user", "Hi."), ("assistant", "Welcome."), ("user", "A sword?"),
               ("assistant", "Ten gold.")]
    assert t.match(None, SYS, history).conversation is a
    assert t.match(None, "You are Mira.", history).fresh  # another system prompt: not it
    a.busy = True  # answering: an unkeyed request does not take it
    assert t.match(None, SYS, history).fresh


def test_past_its_capacity_the_least_recent_idle_conversations_go() -> None:
    t = Conversations(capacity=2)
    convs = [t.match(f"k{i}", SYS, []).conversation for i in range(3)]
    convs[0].busy = True
    gone = t.evictions()
    assert gone == [convs[1].session] and len(t) == 2
    assert t.match("k1", SYS, []).fresh  # forgotten: its key opens anew
