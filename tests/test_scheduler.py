"""The engine's step scheduler as pure decisions (no model, no llama.cpp)."""

from __future__ import annotations

import pytest

from igi_sdk.planner import Plan
from igi_sdk.runtime import scheduler as S


def reply(key: int, *, priority: int = 0, order: int | None = None, prompt: int = 1,
          images: int = 0, generated: int = 0, claim: int = 0, room: int = 1000,
          cancelled: bool = False) -> S.Reply:
    return S.Reply(key, priority, key if order is None else order, prompt, images, generated,
                   claim, room, cancelled)


def test_player_facing_first_then_decoding_before_prompts_then_arrival() -> None:
    d = S.decide([reply(1, prompt=500), reply(2), reply(3, priority=5, prompt=40),
                  reply(4, priority=5), reply(5, order=0)], paced=False, step=1)
    assert d.decode == (4, 3, 5, 2, 1)
    assert d.victim == 1  # the KV cache is full: the last of the order gives way


def test_cancelled_replies_end_and_are_not_fed() -> None:
    d = S.decide([reply(1, cancelled=True), reply(2)], paced=False, step=1)
    assert d.cancel == (1,) and d.decode == (2,)


def test_paced_background_npcs_run_every_other_step() -> None:
    replies = [reply(1, priority=0), reply(2, priority=3)]
    assert S.decide(replies, paced=True, step=1).decode == (2,)
    assert S.decide(replies, paced=True, step=2).decode == (2, 1)
    assert S.decide(replies, paced=False, step=1).decode == (2, 1)
    # only background sessions: they are not starved
    assert S.decide([reply(1)], paced=True, step=1).decode == (1,)


def test_a_reply_past_its_share_of_the_context_ends_as_at_max_tokens() -> None:
    d = S.decide([reply(1, generated=5, claim=300, room=299), reply(2, claim=10, room=299),
                  reply(3, generated=0, prompt=400, claim=500, room=299)], paced=False, step=1)
    # a reply that has not produced a token yet was admitted for its prompt: it goes on
    assert d.out_of_room == (1,) and d.decode == (2, 3)


def test_an_image_is_a_step_of_its_own() -> None:
    d = S.decide([reply(1), reply(2, priority=1, images=1, prompt=0)], paced=False, step=1)
    assert d.image == 2 and d.decode == ()
    # an image after text still to feed waits for that text first
    d = S.decide([reply(1), reply(2, images=1, prompt=12)], paced=False, step=1)
    assert d.image is None and d.decode == (1, 2)


@pytest.mark.parametrize(("left", "budget", "cap", "want"), [
    ([1, 1, 1], 0, 512, [1, 1, 1]),  # decoding replies get their token past the budget
    ([1, 300, 300], 256, 512, [1, 255, 0]),  # prompt chunks share what is left
    ([200, 1], 64, 512, [64, 1]),
    ([600], 1000, 512, [512]),  # never past the batch
    ([1, 1], 5, 1, [1, 0]),
])
def test_prompt_chunks_within_the_step_budget(left, budget, cap, want) -> None:
    assert S.takes(left, budget, cap) == want


def test_drafts_are_cut_to_the_cells_the_session_may_claim() -> None:
    assert S.draft_room(4, claim=90, room=100) == 4
    assert S.draft_room(4, claim=98, room=100) == 2
    assert S.draft_room(4, claim=101, room=100) == 0


def test_token_budget_follows_the_measured_speed() -> None:
    cpu = Plan.all_cpu()
    kw = dict(max_step_s=0.05, prefill_chunk=0, plan=cpu, on_gpu=False, cap=2048)
    assert S.token_budget(token_s=None, **kw) == S.PROBE_CHUNK  # not measured yet
    assert S.token_budget(token_s=0.001, **kw) == 50
    assert S.token_budget(token_s=1e-6, **kw) == 2048  # capped by the batch
    assert S.token_budget(token_s=10.0, **kw) == 1  # at least one token
    assert S.token_budget(token_s=0.001, **{**kw, "prefill_chunk": 512}) == 512
    offload = cpu.model_copy(update={"op_offload": True, "n_ubatch": 512})
    # each chunk streams the CPU-resident weights once: never smaller than a ubatch
    assert S.token_budget(token_s=0.001, **{**kw, "plan": offload, "on_gpu": True}) == 512


def test_prompt_chunks_are_large_while_no_other_reply_decodes() -> None:
    cpu = Plan.all_cpu()
    kw = dict(max_step_s=0.05, prefill_chunk=0, plan=cpu, on_gpu=False, cap=2048)
    # another reply decodes: its token gaps are bounded by the step target
    assert S.token_budget(token_s=0.001, others_decoding=True, **kw) == 50
    # nobody waits for a token: about a second of work (near full prefill speed; a cancel,
    # a reshard or a new line waits at most that long)
    assert S.token_budget(token_s=0.001, others_decoding=False, **kw) == 1000
    assert S.token_budget(token_s=0.01, others_decoding=False, **kw) == 100
    assert S.token_budget(token_s=0.0001, others_decoding=False, **kw) == 2048  # the batch
    assert S.token_budget(token_s=None, others_decoding=False, **kw) == S.PROBE_CHUNK
    assert S.token_budget(token_s=0.001, others_decoding=False, **{**kw, "cap": 256}) == 256
    # a fixed chunk stays fixed (reproducible replies)
    assert S.token_budget(token_s=0.001, others_decoding=False,
                          **{**kw, "prefill_chunk": 64}) == 64


def test_speed_is_learned_from_prompt_chunks_only() -> None:
    assert S.learn_speed(None, 4, 1.0) is None  # single tokens: fixed costs dominate
    assert S.learn_speed(None, 100, 1.0) == pytest.approx(0.01)
    assert S.learn_speed(0.01, 100, 2.0) == pytest.approx(0.7 * 0.01 + 0.3 * 0.02)


def test_prompts_beside_a_decode_that_fills_the_step_target_still_get_their_share() -> None:
    """Recorded on 2 cores: four NPCs' decode step alone took ~50 ms, the step target, and a
    prompt token ~6 ms. Before, the budget counted the decoding replies' tokens at a prompt
    token's price and left 4 prompt tokens a step."""
    cpu = Plan.all_cpu()
    kw = dict(max_step_s=0.05, prefill_chunk=0, plan=cpu, on_gpu=False, cap=2048,
              token_s=0.006)
    assert S.token_budget(**kw) == 8  # the old rule: 8 tokens, 4 of them the decodes'
    # the decode alone fills the target: the prompt gets PREFILL_SHARE of its time
    got = S.token_budget(decoding=4, decode_s=0.05, **kw)
    assert got - 4 == int(S.PREFILL_SHARE * 0.05 / 0.006)
    # a fast decode (the GPU) leaves the rest of the target to the prompt: the gap bound holds
    assert S.token_budget(decoding=4, decode_s=0.014, **{**kw, "token_s": 0.0004}) == 4 + 90
    # nobody else decodes: unchanged (about IDLE_STEP_S of work)
    assert S.token_budget(others_decoding=False, decoding=0, decode_s=0.05, **kw) == 166


def test_a_decode_steps_cost_is_not_charged_to_the_prompt_tokens_beside_it() -> None:
    # 4 decodes (50 ms alone) + 8 prompt tokens took 98 ms: 6 ms a prompt token, not 8
    assert S.learn_speed(None, 12, 0.098, decoding=4, decode_s=0.05) == pytest.approx(0.006)
    assert S.learn_speed(None, 12, 0.098) == pytest.approx(0.098 / 12)  # decode time unknown
    assert S.learn_speed(0.006, 12, 0.04, decoding=4, decode_s=0.05) == 0.006  # noise: kept
    assert S.learn_speed(0.006, 10, 0.5, decoding=4, decode_s=0.05) == 0.006  # 6 prompt tokens
    assert S.learn_decode(None, 0.05) == 0.05
    assert S.learn_decode(0.05, 0.06) == pytest.approx(0.053)


def test_steps_keep_talking_npcs_ahead_of_the_reading_pace_while_others_wait() -> None:
    kw = dict(max_step_s=0.05, reading_tps=8.0, paced=False)
    # two talkers, the nearer one to its reader 0.3 s ahead: a step may last 0.3 + 1/8 s
    assert S.step_target(decoding=[(0, 0.3), (0, 2.0)], waiting=[0], **kw) == pytest.approx(0.425)
    assert S.step_target(decoding=[(0, 0.3)], waiting=[10], **kw) == pytest.approx(0.425)
    # just started (its one token is 1/8 s of reading): a quarter of a second
    assert S.step_target(decoding=[(0, S.reading_slack(1, 0.0, 8.0))], waiting=[0],
                         **kw) == pytest.approx(0.25)
    # far ahead: at most IDLE_STEP_S; behind the reader: the step target
    assert S.step_target(decoding=[(0, 30.0)], waiting=[0], **kw) == S.IDLE_STEP_S
    assert S.step_target(decoding=[(0, -1.0)], waiting=[0], **kw) == 0.05
    # the player's conversation streams and background NPCs wait: its gaps stay short
    assert S.step_target(decoding=[(10, 5.0), (0, 5.0)], waiting=[0], **kw) == 0.05
    # nobody waits, nobody streams, the game's frames are slow (paced), or the rule is off
    assert S.step_target(decoding=[(0, 5.0)], waiting=[], **kw) == 0.05
    assert S.step_target(decoding=[], waiting=[0], **kw) == 0.05
    assert S.step_target(decoding=[(0, 5.0)], waiting=[0], **{**kw, "paced": True}) == 0.05
    assert S.step_target(decoding=[(0, 5.0)], waiting=[0], **{**kw, "reading_tps": 0.0}) == 0.05


def test_the_reading_slack_counts_from_the_first_token() -> None:
    assert S.reading_slack(40, 2.0, 8.0) == pytest.approx(3.0)  # 5 s of text after 2 s
    assert S.reading_slack(8, 2.0, 8.0) == pytest.approx(-1.0)  # slower than the reader


def test_waiting_npcs_get_most_of_a_step_beside_a_fast_decode() -> None:
    """Recorded on 2 cores, 16 NPCs sent together: after the first batch two replies decoded
    (25 ms a step alone) and a prompt token cost ~4.7 ms. Chunks of the step target left the
    fourteen others 5 prompt tokens a step, about a third of the machine, and the last NPC's
    first token came after 35 s."""
    cpu = Plan.all_cpu()
    kw = dict(prefill_chunk=0, plan=cpu, on_gpu=False, cap=512, token_s=0.0047, decoding=2,
              decode_s=0.025)
    before = S.token_budget(max_step_s=0.05, **kw)
    # the two talkers have streamed 2 s at 25 tok/s: each is 4.25 s ahead of a reader at 8/s
    slack = S.reading_slack(50, 2.0, 8.0)
    step_s = S.step_target(max_step_s=0.05, reading_tps=8.0, decoding=[(0, slack)] * 2,
                           waiting=[0] * 14, paced=False)
    after = S.token_budget(max_step_s=step_s, **kw)
    assert before - 2 == 5
    assert step_s == S.IDLE_STEP_S
    assert after - 2 == int((S.IDLE_STEP_S - 0.025) / 0.0047)  # 97% of each step reads prompts


def test_one_slow_step_cannot_leave_the_prompt_chunks_tiny_for_good() -> None:
    """Two decoders (20 ms a step alone) beside prompts of ~3 ms a token, 125 ms steps. Before,
    a stall of one step (1 s) raised the estimate to ~40 ms a token; the budget then left the
    prompts 2 tokens a step, fewer than any step was learnt from, and the estimate never came
    down: 16 NPCs on 2 cores were read 1-2 tokens a step for the rest of the run."""
    cpu = Plan.all_cpu()
    kw = dict(max_step_s=0.125, prefill_chunk=0, plan=cpu, on_gpu=False, cap=512, decoding=2,
              decode_s=0.02)
    token_s = 0.003
    token_s = S.learn_speed(token_s, 2 + 30, 1.0, decoding=2, decode_s=0.02)  # the stall
    assert token_s <= 1.3 * 0.003 + 1e-12  # one step moves it at most 1.3x up
    token_s = 0.04  # however it got there: steps as the budget sizes them bring it back
    for _ in range(40):
        n = S.token_budget(token_s=token_s, **kw)
        token_s = S.learn_speed(token_s, n, 0.02 + (n - 2) * 0.003, decoding=2, decode_s=0.02)
    assert token_s == pytest.approx(0.003, rel=0.05)
    assert S.token_budget(token_s=token_s, **kw) - 2 >= 30
    # a few prompt tokens never raise it (their step's fixed costs), nor teach a first estimate
    assert S.learn_speed(0.003, 2 + 4, 0.2, decoding=2, decode_s=0.02) == 0.003
    assert S.learn_speed(None, 2 + 4, 0.05, decoding=2, decode_s=0.02) is None
