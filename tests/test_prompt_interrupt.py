"""A long prompt alone goes in whole batches, and a command or a cancel still gets through at
once: the decode in flight is interrupted at its next graph node (runtime/abort.py), the
ubatches it finished stay in the cache, and the reply is the same as without interruptions."""

from __future__ import annotations

import threading
import time

import pytest

from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime import scheduler as S
from igi_sdk.runtime.abort import AbortFlag

GREEDY = SamplingParams(temperature=0.0)
# about 1.1K tokens of varied text: three 512-token batches on the CPU
PROMPT = " ".join(f"The guard at gate {i} counts {i * 7 % 13} carts of {w}."
                  for i, w in zip(range(80), ["grain", "salt", "iron", "wool", "ale"] * 16,
                                  strict=True))


def test_prompt_chunks_are_whole_batches_when_a_decode_can_be_interrupted() -> None:
    kw = {"max_step_s": 0.05, "prefill_chunk": 0, "plan": Plan.all_cpu(), "on_gpu": False,
          "cap": 512}
    assert S.token_budget(token_s=0.01, others_decoding=False, interruptible=True, **kw) == 512
    assert S.token_budget(token_s=None, others_decoding=False, interruptible=True, **kw) == 512
    # others decoding: their token gaps bound the chunk, interruptible or not
    assert S.token_budget(token_s=0.001, others_decoding=True, interruptible=True, **kw) == 50
    # no interrupt: about IDLE_STEP_S of work
    assert S.token_budget(token_s=0.01, others_decoding=False, **kw) == 100


def test_the_abort_flag_is_read_by_c_without_python() -> None:
    flag = AbortFlag()
    assert flag.available
    assert not flag.armed
    flag.arm()
    assert flag.armed
    flag.clear()
    assert not flag.armed


@pytest.fixture(scope="module")
def engine(default_model):
    cfg = EngineConfig(n_ctx=3072, max_sessions=2, n_threads=1, n_batch=512)
    with Engine(default_model, Plan.all_cpu(), cfg) as eng:
        yield eng


def _reply(engine: Engine, *, poke: bool) -> tuple[str, int, float]:
    """A greedy reply to the long prompt; with ``poke``, a cheap command every 50 ms meanwhile.
    Returns (text, interrupted steps, the longest step)."""
    sid = engine.open_session("You are the gate's clerk.", sampling=GREEDY)
    before = engine.step_stats["interrupted"]
    engine.step_stats["max_s"] = 0.0
    stop = threading.Event()

    def poker() -> None:
        while not stop.wait(0.05):
            engine.tokenize("x")

    t = threading.Thread(target=poker, daemon=True)
    if poke:
        t.start()
    try:
        text = engine.chat(sid, PROMPT + " How many carts of salt came?", max_tokens=16,
                           ignore_eos=True).result(300).text
    finally:
        stop.set()
    if poke:
        t.join(10)
    engine.close_session(sid)
    return text, engine.step_stats["interrupted"] - before, engine.step_stats["max_s"]


def test_commands_interrupt_long_prompt_chunks_and_nothing_is_lost(engine) -> None:
    plain, interrupted, _ = _reply(engine, poke=False)
    assert interrupted == 0
    poked, interrupted, _ = _reply(engine, poke=True)
    assert interrupted > 0
    assert poked == plain


def test_a_cancel_ends_a_long_prompt_chunk_at_once(engine) -> None:
    _, _, chunk_s = _reply(engine, poke=False)  # the longest step: a whole 512-token batch
    sid = engine.open_session("You are the gate's clerk.", sampling=GREEDY)
    gen = engine.chat(sid, PROMPT, max_tokens=4)
    time.sleep(chunk_s / 3)  # inside the first batch
    t0 = time.perf_counter()
    gen.cancel()
    result = gen.result(60)
    waited = time.perf_counter() - t0
    assert result.finish_reason == "cancelled"
    assert waited < chunk_s / 2, (waited, chunk_s)
    # the conversation is usable afterwards
    after = engine.chat(sid, "Hello?", max_tokens=3, ignore_eos=True).result(60)
    assert after.completion_tokens == 3
    engine.close_session(sid)
