"""A reply's text made faster than ``EngineConfig.stream_every_s`` goes in fewer pieces, none
lost and none held past a step or a wait that would outlast the window."""

from __future__ import annotations

import threading

from igi_sdk.events import ReplyDone, ReplyEvent, ReplyText
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def _pieces(engine: Engine, tokens: int) -> tuple[list[str], str, int]:
    """The text events of one greedy reply, its result's text and its token count."""
    sid = engine.open_session("You are a guard.", sampling=GREEDY)
    pieces: list[str] = []
    done = threading.Event()

    def listener(event: ReplyEvent) -> None:
        if isinstance(event, ReplyText):
            pieces.append(event.text)
        elif isinstance(event, ReplyDone):
            done.set()

    gen = engine.chat_async(sid, "Halt! Who goes there?", max_tokens=tokens, ignore_eos=True,
                            listener=listener).result(30)
    result = gen.result(60)
    assert done.wait(10)
    engine.close_session(sid)
    return pieces, result.text, result.completion_tokens


def test_text_faster_than_the_window_goes_in_fewer_pieces_and_none_is_lost(tiny_llama) -> None:
    cfg = EngineConfig(n_ctx=512, max_sessions=1, n_threads=1)
    with Engine(tiny_llama, Plan.all_cpu(), cfg) as eng:
        each, each_text, n = _pieces(eng, 48)
    with Engine(tiny_llama, Plan.all_cpu(), EngineConfig(
            n_ctx=512, max_sessions=1, n_threads=1, stream_every_s=5.0)) as eng:
        joined, text, m = _pieces(eng, 48)
    assert n == m == 48 and len(each) > 2
    assert "".join(each) == each_text == "".join(joined) == text  # the same text, in order
    # the first piece goes at once (the reader's first token is not delayed), the rest within
    # a 5 s window go with the reply's end
    assert joined[0] == each[0] and len(joined) == 2


def test_a_wait_longer_than_the_window_sends_the_text_before_it(tiny_llama) -> None:
    """A paced engine waits 0.1 s between steps: text that would be due within the wait (a
    0.15 s window) goes before it, not with the next token, so every token's text goes as it
    comes."""
    got = {}
    for every in (0.0, 0.15):
        with Engine(tiny_llama, Plan.all_cpu(), EngineConfig(
                n_ctx=512, max_sessions=1, n_threads=1, stream_every_s=every)) as eng:
            eng.set_pacing(0.1)
            got[every] = _pieces(eng, 6)
    assert got[0.0] == got[0.15] and len(got[0.0][0]) > 2
