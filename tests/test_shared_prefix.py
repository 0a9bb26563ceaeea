"""Sessions share the cells of a common prompt prefix (runtime/kv_cells.py ``share_prefix``): a
session whose cache is empty reads only what its prompt adds to the longest prefix another
session's cache holds. On the default model (SmolLM2-135M), greedy: what was shared changes no
reply."""

from __future__ import annotations

import pytest

from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.kv_cells import SHARED_PREFIX_MIN

CFG = EngineConfig(n_ctx=2048, max_sessions=4, n_threads=2)
GREEDY = SamplingParams(temperature=0.0, seed=1)
# an NPC crowd's one system prompt: the part every session of them begins with
SYSTEM = ("You are a guard of Whiterun. You watch the gate, you know the city's streets and "
          "its people, and you answer travellers briefly and in character. Never mention "
          "that you are an AI.")


@pytest.fixture(scope="module")
def engine(default_model):
    with Engine(default_model, Plan.all_cpu(), CFG) as eng:
        yield eng


@pytest.fixture(autouse=True)
def no_sessions_left(engine):
    yield
    for sid in engine.sessions():
        engine.close_session(sid)


def _say(engine: Engine, sid: str, line: str):
    return engine.chat(sid, line, max_tokens=12).result(timeout=120)


def test_a_second_npc_with_the_same_system_prompt_reads_only_its_line(engine) -> None:
    first = engine.open_session(SYSTEM, sampling=GREEDY)
    a = _say(engine, first, "Who goes there?")
    assert a.cached_tokens == 0
    shared_before = engine.status()["step"]["shared_prefix_tokens"]
    second = engine.open_session(SYSTEM, sampling=GREEDY)
    b = _say(engine, second, "Who goes there?")
    # all of the prompt but its last token (whose logits give the first reply token)
    assert b.cached_tokens == a.prompt_tokens - 1 and b.prompt_tokens == 1
    assert engine.status()["step"]["shared_prefix_tokens"] - shared_before == b.cached_tokens
    assert b.text == a.text  # the same cells: the same greedy reply
    # a third NPC with another line shares the system prompt, and reads its own line
    third = engine.open_session(SYSTEM, sampling=GREEDY)
    c = _say(engine, third, "Is the Jarl in his keep today?")
    assert SHARED_PREFIX_MIN <= c.cached_tokens and c.prompt_tokens > 3


def test_the_shared_cells_outlive_the_session_they_came_from(engine) -> None:
    donor = engine.open_session(SYSTEM, sampling=GREEDY)
    _say(engine, donor, "Who goes there?")
    taker = engine.open_session(SYSTEM, sampling=GREEDY)
    first = _say(engine, taker, "Who goes there?")
    assert first.cached_tokens > 0
    engine.close_session(donor)  # only the taker holds those cells now
    later = _say(engine, taker, "And where is the market?")
    assert (later.cached_tokens
            >= first.cached_tokens + first.prompt_tokens + first.completion_tokens - 1)
    engine.close_session(taker)
    # the same conversation read by a session alone (nothing to share): the same replies
    alone = engine.open_session(SYSTEM, sampling=GREEDY)
    ref_first = _say(engine, alone, "Who goes there?")
    assert ref_first.cached_tokens == 0 and ref_first.text == first.text
    assert _say(engine, alone, "And where is the market?").text == later.text


def test_another_system_prompt_shares_nothing(engine) -> None:
    a = engine.open_session(SYSTEM, sampling=GREEDY)
    _say(engine, a, "Who goes there?")
    other = engine.open_session("You are Mira, an innkeeper of Riverwood.", sampling=GREEDY)
    r = _say(engine, other, "Who goes there?")
    assert r.cached_tokens < SHARED_PREFIX_MIN  # the template's opening markup at most
