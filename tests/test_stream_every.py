"""A reply's text made faster than ``EngineConfig.stream_every_s`` goes in fewer pieces, none
lost and none held past a step or a wait that would outlast the window."""

from __future__ import annotations

import threading
import time

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


def _sizes(joined: list[str], each: list[str]) -> list[int]:
    """How many of ``each``'s pieces (one a token) every piece of ``joined`` holds."""
    sizes, k = [], 0
    for piece in joined:
        start, acc = k, ""
        while acc != piece:
            acc += each[k]
            k += 1
        sizes.append(k - start)
    assert k == len(each)
    return sizes


def test_a_wait_that_would_outlast_the_window_sends_the_text_before_it(tiny_llama) -> None:
    """A paced engine waits 0.1 s between steps; with a 0.15 s window the second token's text
    would be due in the wait after the third: the two go before that wait, not with the
    fourth (which would hold the second's 0.2 s). No piece holds more than two tokens (a
    stalled step only sends text sooner: the test_a_piece_goes_... rule coalesces)."""
    got = {}
    for every in (0.0, 0.15):
        with Engine(tiny_llama, Plan.all_cpu(), EngineConfig(
                n_ctx=512, max_sessions=1, n_threads=1, stream_every_s=every)) as eng:
            eng.set_pacing(0.1)
            got[every] = _pieces(eng, 6)
    each, joined = got[0.0][0], got[0.15][0]
    assert got[0.0][1:] == got[0.15][1:] and "".join(each) == "".join(joined)
    sizes = _sizes(joined, each)
    assert sizes[0] == 1 and max(sizes) <= 2, sizes


def test_text_waiting_for_its_piece_goes_while_the_model_moves(tiny_llama) -> None:
    """A reshard's release leaves a live reply with no placement to decode on: the text it
    made within the window goes then (the engine hands out before it runs a command, and
    whenever it has nothing to step), not when a placement is loaded again or the window
    ends."""
    got: list[tuple[float, str]] = []
    first, done = threading.Event(), threading.Event()

    def listener(event: ReplyEvent) -> None:
        if isinstance(event, ReplyText):
            got.append((time.monotonic(), event.text))
            first.set()
        elif isinstance(event, ReplyDone):
            done.set()

    with Engine(tiny_llama, Plan.all_cpu(), EngineConfig(
            n_ctx=512, max_sessions=1, n_threads=1, stream_every_s=30.0)) as eng:
        eng.set_pacing(0.05)  # a token every 50 ms: text piles up inside the 30 s window
        sid = eng.open_session("You are a guard.", sampling=GREEDY)
        gen = eng.chat_async(sid, "Halt! Who goes there?", max_tokens=64, ignore_eos=True,
                             listener=listener).result(30)
        assert first.wait(30)
        time.sleep(0.3)  # a few more tokens, held for the window
        assert len(got) == 1
        eng.release_async().result(30)
        assert eng.state == "moving" and not eng.loaded
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(got) == 2 and not eng.loaded  # sent while no placement was loaded
        eng.set_pacing(0.0)
        eng.load_first_fitting_async([Plan.all_cpu()]).result(30)
        result = gen.result(60)
        assert done.wait(10)
    assert "".join(t for _, t in got) == result.text and result.completion_tokens == 64


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def _stream(every: float, step: float, tokens: int, monkeypatch) -> list[tuple[float, int]]:
    """When each piece went and how many tokens it held, for ``tokens`` tokens made ``step``
    apart and handed out as the engine does (each step's text before the next step)."""
    from igi_sdk.runtime import generation

    clock = _Clock()
    monkeypatch.setattr(generation, "time", clock)
    gen = generation.Generation("s", stream_every_s=every)
    sent: list[tuple[float, int]] = []
    for k in range(tokens):
        gen._emit(f"{k} ")
        gen.release_text(clock.now + step)  # the engine's look before its next step
        while not gen._events.empty():
            sent.append((clock.now, len(gen._events.get().split())))
        clock.now += step
    return sent


def test_a_piece_goes_when_its_oldest_text_would_overstay_the_window(monkeypatch) -> None:
    """6.3 ms a token, a 16 ms window: the first token at once, then three a piece (each
    piece 18.9 ms after the last), and no token's text waits as long as the window."""
    sent = _stream(0.016, 0.0063, 31, monkeypatch)
    assert [n for _, n in sent] == [1] + [3] * 10
    made = [100.0 + 0.0063 * k for k in range(31)]
    waits, k = [], 0
    for at, n in sent:
        waits += [at - made[j] for j in range(k, k + n)]
        k += n
    assert max(waits) < 0.016


def test_text_slower_than_the_window_goes_token_by_token(monkeypatch) -> None:
    sent = _stream(0.016, 0.020, 5, monkeypatch)
    assert [n for _, n in sent] == [1] * 5
    assert [n for _, n in _stream(0.0, 0.0063, 5, monkeypatch)] == [1] * 5


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
