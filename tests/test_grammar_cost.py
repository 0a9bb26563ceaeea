"""Grammars whose cost explodes in llama.cpp's grammar sampler (one parse stack per way of
skipping nested optional elements) run with bounded work per token: the reply completes, a
bystander keeps streaming, cancel is honoured at once, and a grammar past the per-step limits
ends its reply with a typed error.

Measured before (llama.cpp's sampler, SmolLM2, 2 cores, greedy, 8 tokens): NESTED_4 37 s (19.5 s
for the first token), NESTED_5 no end within 120 s."""

from __future__ import annotations

import itertools
import statistics
import threading
import time

import pytest

from igi_sdk.errors import InvalidGrammarError
from igi_sdk.events import ReplyDone
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime import grammar as G

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
NESTED_4 = 'root ::= a+\na ::= b? b? b? "x"\nb ::= c? c? c?\nc ::= d? d? d?\nd ::= [a-z]?\n'
NESTED_5 = ('root ::= a+\na ::= b? b? b? "x"\nb ::= c? c? c?\nc ::= d? d? d?\nd ::= e? e? e?\n'
            "e ::= [a-z]?\n")


def _groups(depth: int, width: int) -> str:
    inner = '"a"'
    for _ in range(depth):
        inner = "(" + " ".join([inner + "?"] * width) + ")"
    return f"root ::= {inner}*\n"


NESTED_GROUPS = _groups(3, 3)


@pytest.fixture(scope="module")
def engine(default_model):
    with Engine(default_model, Plan.all_cpu(),
                EngineConfig(n_ctx=2048, max_sessions=3, n_threads=2)) as eng:
        yield eng


def _timed(engine, sid: str, **kw) -> tuple[object, float]:
    t0 = time.perf_counter()
    res = engine.chat(sid, "Say something.", **kw).result(60)
    return res, time.perf_counter() - t0


@pytest.mark.parametrize("grammar", [NESTED_4, NESTED_5, NESTED_GROUPS])
def test_nested_optional_grammars_cost_about_a_plain_reply(engine, grammar) -> None:
    sid = engine.open_session("You are a guard.", sampling=GREEDY)
    try:
        engine.chat(sid, "Hi.", max_tokens=2, grammar=grammar).result(60)  # tokenizer built
        _, t_plain = _timed(engine, sid, max_tokens=8, ignore_eos=True)
        res, t_grammar = _timed(engine, sid, max_tokens=8, grammar=grammar)
    finally:
        engine.close_session(sid)
    assert res.completion_tokens >= 1
    assert t_grammar < 4 * t_plain + 1.0, (t_grammar, t_plain)  # before: 37 s and more


class _EventTimes:
    """A reply's listener that notes when each event came; ``gaps`` once the reply ended (the
    handle's result can come before the outbox thread has run the listener to the end)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.ended = threading.Event()

    def __call__(self, event: object) -> None:
        self.times.append(time.perf_counter())
        if isinstance(event, ReplyDone):
            self.ended.set()

    def gaps(self, skip: int = 0) -> list[float]:
        """The times between events, from event ``skip`` on."""
        assert self.ended.wait(30)
        return [t1 - t0 for t0, t1 in itertools.pairwise(self.times[skip:])]


def _token_gaps(engine, sid: str, **kw) -> list[float]:
    """The times between the reply's events (tokens, then its end)."""
    events = _EventTimes()
    engine.chat(sid, "Prices?", listener=events, **kw).result(60)
    return events.gaps()


def _alone(engine) -> list[float]:
    """The bystander's token gaps alone on the engine."""
    b = engine.open_session("You are a merchant.", sampling=GREEDY)
    try:
        return _token_gaps(engine, b, max_tokens=16, ignore_eos=True)
    finally:
        engine.close_session(b)


def test_a_bystander_streams_while_a_nested_grammar_replies(engine) -> None:
    before = _alone(engine)  # the baseline, taken again after: the machine's load drifts
    g = engine.open_session("You are a guard.", sampling=GREEDY)
    b = engine.open_session("You are a merchant.", sampling=GREEDY)
    try:
        slow_events = _EventTimes()
        slow = engine.chat(g, "Say something.", max_tokens=48, grammar=NESTED_5,
                           listener=slow_events)
        gaps = _token_gaps(engine, b, max_tokens=16, ignore_eos=True)
        slow.result(60)
        slow_gaps = slow_events.gaps(skip=1)
    finally:
        engine.close_session(g)
        engine.close_session(b)
    after = _alone(engine)
    alone = max(before, after, key=statistics.median)
    # before: the bystander waited minutes. Now it keeps about its own pace: the grammar
    # reply shares each step and its sampling work per token is bounded. Each of its steps
    # also decodes the grammar reply's token and computes that reply's mask: 2.1-2.4x its
    # pace alone on an idle 2-core machine, up to 3.7x beside two busy CPUs
    base = statistics.median(alone)
    assert statistics.median(gaps) < 5 * base, (gaps, alone)
    assert max(gaps) < 20 * base, (gaps, alone)
    # and every step of the grammar reply itself (its first token: its prompt) stays short; the
    # engine's own running maximum would also count steps of the module's earlier tests
    assert slow_gaps and max(slow_gaps) < 20 * base, (slow_gaps, alone)


def test_cancel_ends_a_nested_grammar_reply_within_a_step(engine) -> None:
    sid = engine.open_session("You are a guard.", sampling=GREEDY)
    try:
        times: list[float] = []
        some = threading.Event()

        def listener(_event: object) -> None:
            times.append(time.perf_counter())
            if len(times) >= 4:
                some.set()

        gen = engine.chat(sid, "Say something.", max_tokens=400, grammar=NESTED_5,
                          listener=listener)
        assert some.wait(60)
        step = max(b - a for a, b in itertools.pairwise(times[:4]))  # this reply's token pace
        t0 = time.perf_counter()
        gen.cancel()
        assert gen.result(30).finish_reason == "cancelled"
        waited = time.perf_counter() - t0
        assert waited < 10 * step, (waited, step)  # a step or so, not the rest of the reply
    finally:
        engine.close_session(sid)


def test_a_grammar_past_the_step_limits_ends_its_reply_typed(engine, monkeypatch) -> None:
    """Limits cut tight stand in for a grammar too costly for the real ones: the reply ends
    invalid_grammar, the conversation is as before it, the session goes on."""
    sid = engine.open_session("You are a guard.", sampling=GREEDY)
    try:
        monkeypatch.setitem(G.LIMITS, "step_lexer_fuel", 50)
        with pytest.raises(InvalidGrammarError, match="more work than a step allows"):
            engine.chat(sid, "Say something.", max_tokens=8, grammar=NESTED_5).result(60)
        monkeypatch.undo()
        assert engine.chat(sid, "Hi.", max_tokens=4).result(60).completion_tokens >= 1
    finally:
        engine.close_session(sid)


def test_refusals_show_a_short_prefix_of_the_grammar(engine, caplog) -> None:
    secret = "player-secret-" * 2_000
    bad = f'root ::= "{secret}" (\n'
    with pytest.raises(InvalidGrammarError) as e:
        G.compile_gbnf(bad)
    assert len(str(e.value)) < 2 * G.ERROR_CHARS
    assert secret not in caplog.text


def test_json_schema_replies_stay_valid_json(engine) -> None:
    import json

    schema = {"type": "object", "required": ["mood", "line"], "properties": {
        "mood": {"enum": ["friendly", "wary"]}, "line": {"type": "string", "maxLength": 40},
        "é": {"type": "boolean"}}}
    sid = engine.open_session("You are a guard. Reply as JSON.", sampling=GREEDY)
    try:
        res = engine.chat(sid, "Who goes there?", max_tokens=60, json_schema=schema).result(60)
        again = engine.chat(sid, "And now?", max_tokens=60, json_schema=schema).result(60)
    finally:
        engine.close_session(sid)
    assert json.loads(res.text)["mood"] in ("friendly", "wary")
    assert json.loads(again.text)["mood"] in ("friendly", "wary")


def test_objects_that_list_their_properties_are_closed() -> None:
    """{"price": integer} means no other keys (llama.cpp's converter reads it so too): with the
    JSON Schema default a small model adds a "description" until its tokens run out mid-string."""
    import json

    from igi_sdk.runtime.grammar import _closed_objects

    schema = {"type": "object", "properties": {
        "price": {"type": "integer"},
        "properties": {"type": "object", "properties": {"a": {"type": "string"}}},
        "open": {"type": "object", "properties": {"b": {}}, "additionalProperties": True}},
        "$defs": {"item": {"type": "object", "properties": {"c": {}}}}}
    closed = json.loads(_closed_objects(json.dumps(schema)))
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert set(props) == {"price", "properties", "open"}  # no key added to the names
    assert props["properties"]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True  # said so: kept
    assert closed["$defs"]["item"]["additionalProperties"] is False
