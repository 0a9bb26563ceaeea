"""When the engine launches the next decode before a step's tokens are taken
(``EngineConfig.launch_ahead``): the device then computes step t+1 while the host takes step
t's tokens (their text, stop strings, calls and events), so that bookkeeping is off the device's
path. Pure: the engine thread passes what it knows of the step just read and of each reply's
next token; the launch itself, and dropping the cell of a reply that ends after it, are the
engine's (runtime/core.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from igi_sdk.runtime.batching import Fed
from igi_sdk.runtime.config import LaunchAhead


class Next(NamedTuple):
    """One reply's just-picked token, as the rule sees it (a named tuple: one per reply and
    step, on the device's path)."""

    generated: int  # the reply's tokens before this one
    max_tokens: int
    ends_turn: bool  # an end-of-turn token the reply stops at
    cancelled: bool
    images: bool  # images still to read
    cached: int  # the session's cells in the cache
    room: int  # the cells its session may claim now


def device_queues(mode: LaunchAhead, *, on_gpu: bool, call_s: float, step_s: float) -> bool:
    """Whether launching ahead can overlap anything: "on" always; "auto" where the last
    ``llama_decode`` call (``call_s``) returned in under half its step (``step_s``, the call
    to its logits read), so the call only queued the device's work. Never on a CPU placement:
    there the call computes the step, the text would wait for it, and a tiny model's call can
    be shorter than the host's sampling, so the time alone does not tell."""
    if mode == "off":
        return False
    return mode == "on" or (on_gpu and call_s < 0.5 * step_s)


def foreseen(fed_takes: Sequence[int], *, quiet: bool, active: int,
             nexts: Sequence[Next]) -> bool:
    """Whether the next step is the one the scheduler would decide: the replies of the step
    just read (``fed_takes``: the tokens each fed), each decoding the token it picked. Every
    active reply decoded one token and picked its next (never after a prompt step: the first
    decode builds a graph of a new shape, a call of milliseconds that a reply's first token
    would wait for; after a decode of the same replies the graph is reused), nothing else
    waits (``quiet``: no command, pacing, reshard or drafting), and no reply ends with its
    token (its end of turn, its length, its room) or is cancelled. A stop string, a call or a
    cancel found after the launch still ends a reply: the engine drops that step's cell."""
    if not nexts or len(nexts) != len(fed_takes) or any(n != 1 for n in fed_takes):
        return False
    if not quiet or active != len(nexts):
        return False
    return not any(n.cancelled or n.images or n.ends_turn or n.generated + 1 >= n.max_tokens
                   or n.cached + 2 >= n.room for n in nexts)


@dataclass
class InFlight:
    """A decode launched ahead of its step: each reply's token at its next position, logits
    at each (``fed``), called at ``t0``; the next step reads it."""

    fed: Fed
    t0: float
