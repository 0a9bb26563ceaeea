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


def test_the_sidecar_sends_a_frames_text_as_one_token_event(tmp_path_factory, tiny_llama) -> None:
    """The real sidecar (``serve --stream-every-ms``): a long window sends the first token's
    text alone and the rest with the reply's end; every token's text goes as it comes with 0.
    The events stay numbered 1, 2, ... and join to the reply's text."""
    import shutil

    from igi_sdk.client import Client, SidecarUnavailable
    from tests.sidecars import start_sidecar, stop

    models = tmp_path_factory.mktemp("models")
    shutil.copy(tiny_llama, models / "tiny.gguf")
    got = {}
    for every in ("0", "1000"):
        endpoint = f"ipc://{tmp_path_factory.mktemp('ipc') / 's.sock'}"  # a short path
        proc = start_sidecar(models, endpoint, "--model", "tiny.gguf",
                             "--stream-every-ms", every)
        c = Client(endpoint, timeout=60)
        try:
            try:
                c.wait_ready(60)
            except SidecarUnavailable:  # say why: the sidecar's own words
                stop(proc)
                raise AssertionError(proc.stderr.read()) from None
            sid = c.open_session("x", sampling={"temperature": 0.0, "seed": 1})
            stream = c.chat(sid, "go on forever", max_tokens=32, stop=[])
            pieces = list(stream)
            assert stream.done is not None and "".join(pieces) == stream.done["text"]
            got[every] = pieces
        finally:
            c.close()
            stop(proc)
    assert "".join(got["0"]) == "".join(got["1000"])  # the same greedy reply
    assert len(got["0"]) > 2 and len(got["1000"]) == 2 and got["1000"][0] == got["0"][0]
