"""Launch ahead (EngineConfig.launch_ahead): the next step's decode is queued before this
step's tokens are taken. On a GPU that hides the host's bookkeeping behind the device's work;
here, on the CPU, "on" forces it so that its contract is checked where every test runs: the
replies, the cache and the events are those of an engine that decodes in turn, whatever ends
a reply (a stop string found after the launch, a cancel, a command in between)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.generation import GenerationResult
from igi_sdk.runtime.launch_ahead import Next, device_queues, foreseen

GREEDY = SamplingParams(temperature=0.0)
NPC = "You are Brom, the blacksmith of Oakvale. Answer in a few sentences."
LINES = ("Tell me about your forge.", "What do you sell?", "Who lives in Oakvale?")


def test_the_device_rule_launches_where_the_call_only_queued_the_step() -> None:
    assert device_queues("auto", on_gpu=True, call_s=0.0003, step_s=0.003)
    assert not device_queues("auto", on_gpu=True, call_s=0.025, step_s=0.027)  # CPU layers
    # a CPU placement: the call computes, whatever its time against the host's sampling
    assert not device_queues("auto", on_gpu=False, call_s=0.0003, step_s=0.003)
    assert device_queues("on", on_gpu=False, call_s=0.02, step_s=0.02)
    assert not device_queues("off", on_gpu=True, call_s=0.0003, step_s=0.003)


def test_the_step_rule_foresees_only_the_step_the_scheduler_would_decide() -> None:
    go = Next(generated=5, max_tokens=64, ends_turn=False, cancelled=False, images=False,
              cached=300, room=1000)
    assert foreseen([1, 1], quiet=True, active=2, nexts=[go, go])
    assert not foreseen([], quiet=True, active=0, nexts=[])
    assert not foreseen([1004], quiet=True, active=1, nexts=[go])  # after a prompt step
    assert not foreseen([1, 7], quiet=True, active=2, nexts=[go, go])  # a chunk rode along
    assert not foreseen([1], quiet=False, active=1, nexts=[go])  # a command, pacing, drafts
    assert not foreseen([1], quiet=True, active=2, nexts=[go])  # another reply waits
    for ends in (go._replace(ends_turn=True), go._replace(generated=63),
                 go._replace(cancelled=True), go._replace(images=True),
                 go._replace(cached=998)):
        assert not foreseen([1, 1], quiet=True, active=2, nexts=[go, ends])
    assert foreseen([1], quiet=True, active=1, nexts=[go._replace(generated=62, cached=997)])


def _engine(model: Path, mode: str) -> Engine:
    return Engine(model, Plan.all_cpu(), EngineConfig(n_ctx=2048, max_sessions=2, n_threads=1,
                                                      exact_threads=True, launch_ahead=mode))


@pytest.fixture(scope="module")
def pair(default_model: Path) -> Iterator[tuple[Engine, Engine]]:
    with _engine(default_model, "on") as ahead, _engine(default_model, "off") as in_turn:
        yield ahead, in_turn


def _cache_matches(eng: Engine, sid: str) -> None:
    """The KV cache holds exactly the session's tokens: no cell of a launched step is left."""
    s = eng._sessions[sid]
    pos_max = eng._call(lambda: llama_cpp.llama_memory_seq_pos_max(
        llama_cpp.llama_get_memory(eng._ctx), s.seq))
    assert pos_max == len(s.tokens) - 1, (pos_max, len(s.tokens))


def _said(r: GenerationResult) -> tuple[str, tuple[int, ...], str, int, int]:
    return r.text, r.tokens, r.finish_reason, r.prompt_tokens, r.cached_tokens


def test_replies_launched_ahead_read_as_replies_decoded_in_turn(pair) -> None:
    """A conversation of three lines, then two NPCs speaking at once: the same tokens, the
    same cached prompt counts; the forced engine launched ahead, the other never did."""
    runs: list[list[tuple[str, tuple[int, ...], str, int, int]]] = []
    for eng in pair:
        before = eng.step_stats["launched_ahead"]
        said = []
        sid = eng.open_session(NPC, sampling=GREEDY)
        for line in LINES:
            said.append(_said(eng.chat(sid, line, max_tokens=24).result(120)))
            _cache_matches(eng, sid)
        other = eng.open_session("You are Mira, a herbalist.", sampling=GREEDY)
        both = [eng.chat_async(s, "Good morning! What is new?", max_tokens=20, ignore_eos=True)
                for s in (sid, other)]
        said += [_said(f.result(60).result(120)) for f in both]
        for s in (sid, other):
            _cache_matches(eng, s)
            eng.close_session(s)
        said.append((str(eng.step_stats["launched_ahead"] - before), (), "", 0, 0))
        runs.append(said)
    ahead, in_turn = runs
    assert ahead[:-1] == in_turn[:-1]
    assert int(ahead[-1][0]) >= 40 and in_turn[-1][0] == "0"


def test_a_stop_string_after_the_launch_drops_the_launched_cell(pair) -> None:
    """The stop string is found when the token is taken, after the next step was launched
    with it: that step's cell goes, the reply ends where the in-turn engine ends it, and the
    next line reads the same cached prompt."""
    ahead, in_turn = pair
    sid = in_turn.open_session(NPC, sampling=GREEDY)
    full = in_turn.chat(sid, LINES[0], max_tokens=32, ignore_eos=True).result(120).text
    in_turn.close_session(sid)
    words = full.split()
    assert len(words) >= 6, full
    stop = words[len(words) // 2]
    runs = []
    for eng in (ahead, in_turn):
        dropped = eng.step_stats["ahead_dropped"]
        sid = eng.open_session(NPC, sampling=GREEDY)
        first = eng.chat(sid, LINES[0], max_tokens=32, ignore_eos=True, stop=[stop]).result(120)
        _cache_matches(eng, sid)
        second = eng.chat(sid, LINES[1], max_tokens=16).result(120)
        _cache_matches(eng, sid)
        eng.close_session(sid)
        runs.append((_said(first), _said(second), eng.step_stats["ahead_dropped"] - dropped))
    assert runs[0][:2] == runs[1][:2]
    assert runs[0][0][2] == "stop_string" and stop not in runs[0][0][0]
    assert runs[0][2] >= 1 and runs[1][2] == 0


def test_commands_and_a_cancel_meet_no_decode_in_flight(pair) -> None:
    """Commands sent while a reply streams are answered between steps (the decode in flight
    is read first), and the reply is the in-turn engine's; a cancel leaves the cache holding
    the session's tokens, and the session goes on."""
    ahead, in_turn = pair
    texts = []
    for eng in (ahead, in_turn):
        sid = eng.open_session(NPC, sampling=GREEDY)
        gen = eng.chat(sid, LINES[2], max_tokens=40, ignore_eos=True)
        asked = 0
        while not gen.done:
            assert eng.tokenize("Oakvale") and sid in eng.session_info()
            asked += 1
        texts.append((_said(gen.result(120)), asked > 0))
        _cache_matches(eng, sid)
        eng.close_session(sid)
    assert texts[0] == texts[1]

    sid = ahead.open_session(NPC, sampling=GREEDY)
    gen = ahead.chat(sid, LINES[0], max_tokens=200, ignore_eos=True)
    streamed = threading.Event()

    def read() -> None:
        for _piece in gen:
            streamed.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert streamed.wait(60)
    time.sleep(0.05)
    gen.cancel()
    result = gen.result(60)
    reader.join(10)
    assert result.finish_reason == "cancelled" and 0 < result.completion_tokens < 200
    _cache_matches(ahead, sid)
    after = ahead.chat(sid, LINES[1], max_tokens=8).result(120)
    assert after.completion_tokens > 0 and after.cached_tokens > 0
    _cache_matches(ahead, sid)
    ahead.close_session(sid)


def test_the_first_token_and_the_last_launch_nothing(pair) -> None:
    """A reply of n tokens launches n - 2 steps ahead: not after its prompt step (the first
    decode builds a new graph, and the first token would wait for that call) and not after
    the token that reaches max_tokens (nothing follows it)."""
    ahead, _ = pair
    sid = ahead.open_session(NPC, sampling=GREEDY)
    before = ahead.step_stats["launched_ahead"]
    done = ahead.chat(sid, LINES[1], max_tokens=16, ignore_eos=True).result(120)
    assert done.completion_tokens == 16
    assert ahead.step_stats["launched_ahead"] - before == 14
    ahead.close_session(sid)
