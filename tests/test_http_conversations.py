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
    assert again.rewrite is None  # the session holds it: only the line is sent
    # the client edited the reply it keeps: the same session, its transcript rewritten (the
    # sidecar keeps the common token prefix), nothing closed
    edited = t.match("brom", SYS, [("user", "Hi."), ("assistant", "Hello!")])
    assert not edited.fresh and edited.conversation is first.conversation
    assert edited.replaced is None
    assert edited.rewrite == (("user", "Hi."), ("assistant", "Hello!"))
    t.answered(edited.conversation, "Bye.", "Farewell.")
    assert first.conversation.turns == [("user", "Hi."), ("assistant", "Hello!"),
                                        ("user", "Bye."), ("assistant", "Farewell.")]
    # another system prompt: a new session, the old one closed
    other = t.match("brom", "You are Mira.", [])
    assert other.fresh and other.replaced == first.conversation.session
    assert len(t) == 1


def test_a_named_conversation_busy_answering_gives_a_second_request_its_own_session() -> None:
    t = Conversations()
    first = t.match("npc", SYS, []).conversation
    first.busy = True
    second = t.match("npc", SYS, [("user", "Other NPC's line."), ("assistant", "Hm.")])
    assert second.fresh and second.replaced is None  # the first is never closed
    assert second.conversation is not first
    assert second.history == (("user", "Other NPC's line."), ("assistant", "Hm."))
    # the name still leads to the first conversation
    first.busy = False
    assert t.match("npc", SYS, []).conversation is first


def test_without_a_key_a_trimmed_transcript_rewrites_the_closest_conversation() -> None:
    t = Conversations()
    a = t.match(None, SYS, []).conversation
    t.answered(a, "Hi.", "Welcome, traveller. What brings you here?")
    b = t.match(None, SYS, [("user", "Other."), ("assistant", "Hm.")]).conversation
    trimmed = [("user", "Hi."), ("assistant", "Welcome, traveller.")]
    m = t.match(None, SYS, trimmed)
    assert m.conversation is a and not m.fresh and m.rewrite == tuple(trimmed)
    assert b is not a
    # nothing in common with any: a new one
    assert t.match(None, SYS, [("user", "Third."), ("assistant", "Yes.")]).fresh


def test_a_continued_assistant_turn_is_sent_with_the_line_and_joins_the_reply() -> None:
    t = Conversations()
    history = [("user", "Your name?"), ("assistant", "My name is")]
    m = t.match("k", SYS, history, prefill=True)
    assert m.fresh and m.history == () and m.rewrite == tuple(history)
    t.answered(m.conversation, "", " Brom.")
    assert m.conversation.turns == [("user", "Your name?"), ("assistant", "My name is Brom.")]
    # continued again on the same session: sent again, whole
    again = t.match("k", SYS, [*m.conversation.turns, ("user", "And?"), ("assistant", "I")],
                    prefill=True)
    assert again.conversation is m.conversation and again.rewrite is not None


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
