"""Transcripts mods send, read by the face (igi_sdk/http/parse.py, pure)."""

from __future__ import annotations

import json

import pytest

from igi_sdk.http.errors import HttpError
from igi_sdk.http.parse import read, rewrite_fits
from igi_sdk.wire import protocol as P


def _body(*msgs: tuple[str, str]) -> bytes:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in msgs]}).encode()


def test_system_messages_after_the_first_turn_stay_where_they_stand() -> None:
    p = read(_body(("system", "You are Brom."), ("developer", "Be brief."), ("user", "Hi."),
                   ("assistant", "Welcome."), ("system", "Lydia joins."),
                   ("developer", "Stay in character."), ("user", "Who is she?")))
    assert p.system == "You are Brom.\n\nBe brief."  # the leading ones: the system prompt
    assert p.history == [("user", "Hi."), ("assistant", "Welcome."), ("system", "Lydia joins."),
                         ("system", "Stay in character.")]
    assert p.line == "Who is she?" and not p.prefill


def test_an_assistant_last_transcript_is_a_prefill() -> None:
    p = read(_body(("system", "You are Brom."), ("user", "Your name?"),
                   ("assistant", "My name is")))
    assert p.prefill and p.line == "" and p.images == []
    assert p.history == [("user", "Your name?"), ("assistant", "My name is")]


def test_two_assistant_messages_at_the_end_are_refused() -> None:
    # one is a prefill (continued); two leave no line to answer (llama-server refuses them)
    for msgs in ([("user", "Hi."), ("assistant", "Well"), ("assistant", "met")],
                 [("assistant", "Well"), ("assistant", "met"), ("assistant", ".")]):
        with pytest.raises(HttpError) as e:
            read(_body(*msgs))
        assert e.value.status == 400 and e.value.code == "invalid_argument"
        assert "2 or more assistant messages at the end" in e.value.message
    # two in a row before the line are history, as ever
    p = read(_body(("assistant", "Well"), ("assistant", "met"), ("user", "Hi.")))
    assert p.line == "Hi." and p.history == [("assistant", "Well"), ("assistant", "met")]


def test_an_explicit_null_model_is_no_model() -> None:
    p = read(json.dumps({"model": None, "messages": [{"role": "user", "content": "Hi."}]})
             .encode())
    assert p.options.model is None and p.line == "Hi."


def test_a_transcript_must_end_with_a_user_or_assistant_message() -> None:
    for msgs in ([("user", "Hi."), ("system", "x")], [("system", "only")]):
        with pytest.raises(HttpError) as e:
            read(_body(*msgs))
        assert e.value.status == 400


def test_a_transcript_sent_with_its_line_fits_one_protocol_message() -> None:
    rewrite_fits((("user", "a" * 1000),), "line", [b"x" * 1000])
    big = P.MAX_MESSAGE_BYTES // 2
    with pytest.raises(HttpError) as e:
        rewrite_fits((("user", "a" * big),), "line", [b"x" * big])
    assert e.value.status == 413
