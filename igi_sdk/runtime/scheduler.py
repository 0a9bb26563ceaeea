"""The engine's step scheduler: which replies one decode step serves, and how much of each.

Pure (no llama.cpp): decisions from what the engine thread knows of each active reply, the
frame pacing and the measured speed, so every rule is unit-tested without a model. The engine
applies a :class:`StepDecision` (runtime/engine.py) and fills its batch with :func:`takes`.

Rules, in order: a cancelled reply ends; a reply that has used its session's share of the
context ends as at ``max_tokens`` (others keep the cells they are guaranteed); player-facing
sessions (higher priority) go first, decoding replies before prompt chunks, then arrival order;
while the game paces frames, background sessions (priority <= 0) run every other step; a reply
whose next input is an image gets a step of its own (the encoder, then its embeddings); when
the KV cache has no room, the last reply of the order gives way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from igi_sdk.planner import Plan

# the first prompt chunk on a fresh placement, before its per-token cost is known
PROBE_CHUNK = 32
# a step's length while no other reply is decoding and the decode cannot be interrupted (a
# graph wholly on the GPU, images, the step after an interrupted one): nobody's token gap is at
# stake, so the prompt goes in chunks large enough to run near full prefill speed; cancels,
# reshards and new lines still wait at most about this long (a ubatch floor would not: 4 s for
# one on a slow CPU). Where the CPU computes, the whole batch goes and they interrupt it.
IDLE_STEP_S = 1.0
# while replies decode, prompt chunks get at least this share of a decode step's own time on
# top of it: decoding replies' token gaps grow at most (1 + share)x, and prompts still go at
# about half their full speed. Without it, where a decode step alone fills the step target (a
# slow CPU, many NPCs), the budget charged the decoding replies' tokens at a prompt token's
# price and left the prompts a token or two a step.
PREFILL_SHARE = 1.0
# prompt tokens a step needs for its time to say what a prompt token costs (fewer: fixed costs)
LEARN_MIN_TOKENS = 8


def reading_slack(generated: int, since_first_s: float, reading_tps: float) -> float:
    """How far a streaming reply is ahead of a reader who started at its first token and reads
    ``reading_tps`` tokens a second: the seconds until that reader would run out of text."""
    return generated / reading_tps - since_first_s


def step_target(*, max_step_s: float, reading_tps: float,
                decoding: list[tuple[int, float]], waiting: list[int], paced: bool) -> float:
    """How long the next step may last, given the replies ``decoding`` (priority, reading
    slack: :func:`reading_slack`) and the priorities of those ``waiting`` for their first token
    (prompts still to read).

    While a prompt of at least the decoders' priority waits, a step may last as long as keeps
    every talking NPC ahead of a reader at ``reading_tps`` (its slack plus the one token the
    step brings), up to :data:`IDLE_STEP_S`: what the engine does beyond the reading pace goes
    to starting the NPCs that have said nothing yet, in chunks large enough to read prompts near
    full speed, and a talking NPC's text never runs out before a reader at that pace would
    finish it. Before, every step beside a decode was cut to ``max_step_s``: on 2 cores the
    prompts got a third of the machine in chunks of 4-5 tokens, and the last of 16 NPCs sent
    together said its first word after 35 s. The game's conversation outranking the waiting
    prompts, the game asking to be paced (its frames are slow), or ``reading_tps`` 0 keeps
    steps at ``max_step_s``."""
    if paced or reading_tps <= 0.0 or not decoding or not waiting:
        return max_step_s
    if max(p for p, _ in decoding) > max(waiting):
        return max_step_s
    slack = min(s for _, s in decoding)
    return min(IDLE_STEP_S, max(max_step_s, slack + 1.0 / reading_tps))


class Reply(NamedTuple):
    """One active reply as the scheduler sees it (``key``: its session's sequence). A named
    tuple: one is made per reply and step, and a frozen dataclass costs several times more to
    make."""

    key: int
    priority: int
    order: int  # arrival
    prompt_left: int  # tokens still to feed (1 while decoding: the last sampled token)
    images_left: int  # images still to encode before the rest of the prompt
    generated: int
    claim: int  # KV cells held plus admitted
    room: int  # KV cells its session may claim now
    cancelled: bool = False


@dataclass(frozen=True)
class StepDecision:
    cancel: tuple[int, ...] = ()
    out_of_room: tuple[int, ...] = ()  # end as at max_tokens ("length")
    image: int | None = None  # a step for this reply's next image, nothing else
    decode: tuple[int, ...] = ()  # the batch's replies, in order

    @property
    def victim(self) -> int | None:
        """The reply that gives way when the KV cache has no room for the batch."""
        return self.decode[-1] if self.decode else None


def decide(replies: list[Reply], *, paced: bool, step: int) -> StepDecision:
    """What step number ``step`` does for ``replies``."""
    order = sorted(replies, key=lambda r: (-r.priority, r.prompt_left > 1, r.order))
    cancel = tuple(r.key for r in order if r.cancelled)
    live = [r for r in order if not r.cancelled]
    if paced and step % 2:  # paced: background NPCs every other step
        live = [r for r in live if r.priority > 0] or live
    full = tuple(r.key for r in live if r.generated and r.prompt_left and r.claim > r.room)
    live = [r for r in live if r.key not in full]
    waiting = [r for r in live if r.images_left and not r.prompt_left]
    if waiting:
        return StepDecision(cancel, full, image=waiting[0].key)
    return StepDecision(cancel, full, decode=tuple(r.key for r in live))


def takes(prompt_left: list[int], budget: int, cap: int) -> list[int]:
    """Tokens each reply (in batch order) feeds this step: up to ``budget`` in all; every
    decoding reply (one token left) gets its token even past the budget (bounded by the
    session count); never more than the batch's ``cap``."""
    out, n = [], 0
    for left in prompt_left:
        room = max(budget - n, 1 if left == 1 else 0)
        take = max(0, min(left, room, cap - n))
        out.append(take)
        n += take
    return out


def draft_room(proposed: int, claim: int, room: int) -> int:
    """Draft tokens a reply may verify: each takes a KV cell, which must not come out of
    another session's guaranteed share."""
    return max(0, min(proposed, room - claim))


def token_budget(*, max_step_s: float, prefill_chunk: int, plan: Plan, on_gpu: bool, cap: int,
                 token_s: float | None, others_decoding: bool = True,
                 interruptible: bool = False, decoding: int = 0,
                 decode_s: float | None = None) -> int:
    """Tokens for the next step (the ``decoding`` replies' one token each included): about
    ``max_step_s`` of work at the measured speed (``token_s`` seconds per prompt token, None
    before it is measured), at most ``cap`` (``prefill_chunk`` > 0: that many, for reproducible
    replies). With ``decode_s``, the measured time of a step of decoding replies alone, the
    prompt chunk gets what the decode leaves of the target, and never less than
    :data:`PREFILL_SHARE` of the decode's own time. While no other reply is decoding
    (``others_decoding`` False) small chunks buy nothing: the whole batch when a command or a
    cancel can interrupt the decode (``interruptible``), else about :data:`IDLE_STEP_S` of
    work."""
    if plan.op_offload and on_gpu and plan.n_ubatch > 1:
        # each chunk streams the CPU-resident weights once: smaller chunks multiply that
        floor = min(cap, plan.n_ubatch)
    else:
        floor = 1
    if prefill_chunk > 0:
        return max(floor, min(cap, prefill_chunk))
    if interruptible and not others_decoding:
        return cap
    step_s = max_step_s if others_decoding else max(max_step_s, IDLE_STEP_S)
    if token_s is None:
        budget = PROBE_CHUNK
    elif others_decoding and decode_s is not None:
        prompt_s = max(step_s - decode_s, PREFILL_SHARE * decode_s)
        budget = decoding + int(prompt_s / max(token_s, 1e-7))
    else:
        budget = int(step_s / max(token_s, 1e-7))
    return max(floor, min(cap, budget))


def learn_speed(token_s: float | None, n_tokens: int, seconds: float, *, decoding: int = 0,
                decode_s: float | None = None) -> float | None:
    """The seconds per prompt token after a step of ``n_tokens`` took ``seconds``; of them,
    ``decoding`` were decoding replies' tokens, whose step alone takes ``decode_s`` (measured):
    that part is the step's fixed cost, not the prompt's (counted in, a few prompt tokens beside
    a decode look several times dearer than they are, and the chunks stay small).

    A step of fewer than :data:`LEARN_MIN_TOKENS` prompt tokens is dominated by fixed costs,
    which only ever make a token look dearer: it may lower the estimate, never raise it. Without
    that, one slow step (the machine stalled) could raise the estimate until the budget left
    fewer tokens than are learnt from, and the chunks stayed tiny for the rest of the run: on
    2 cores 16 NPCs then got 1-2 prompt tokens a step. And one step moves it at most 1.3x up."""
    prompt = n_tokens - decoding
    if prompt < 1 or (prompt < LEARN_MIN_TOKENS and token_s is None):
        return token_s
    if decoding and decode_s is not None:
        seconds -= decode_s
        if seconds <= 0.0:
            return token_s  # no cost left to learn from (noise)
    per = seconds / prompt
    if token_s is None:
        return per
    if prompt < LEARN_MIN_TOKENS:
        per = min(per, token_s)
    return 0.7 * token_s + 0.3 * min(per, 2.0 * token_s)


def learn_decode(decode_s: float | None, seconds: float) -> float:
    """The time of a step of decoding replies alone, after one took ``seconds``."""
    return seconds if decode_s is None else 0.7 * decode_s + 0.3 * seconds
