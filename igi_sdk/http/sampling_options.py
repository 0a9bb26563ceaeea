"""What a Chat Completions request asks of the sampler, as the sidecar's ``chat`` options: every
sampler a client sends is honoured, or refused with a 400 naming it; none is dropped.

Honoured: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repeat_penalty``,
``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``seed``, ``logprobs`` /
``top_logprobs``, ``max_tokens`` / ``max_completion_tokens`` (clamped to what one reply may
take), ``n``. Every line carries its own sampling (``chat.sampling``), so a conversation's
later requests are sampled as they ask, not as its first did. Without a seed (or with -1),
each request draws a random one: asking again gives another reply, as OpenAI's does.
Refused (400 ``unsupported_parameter``): the samplers of llama-server this sidecar does not
run (mirostat, typical_p, DRY, XTC, ...) when set to anything but their neutral value.
"""

from __future__ import annotations

import secrets
from typing import Any

from igi_sdk.http.errors import HttpError
from igi_sdk.http.schema import MAX_BODY_BYTES, MAX_CHOICES
from igi_sdk.wire import protocol as P

# llama-server's samplers this sidecar does not run, with the value that leaves each off: a
# request that sets one otherwise is refused rather than sampled as if it had not
NEUTRAL: dict[str, float] = {
    "typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
    "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "xtc_probability": 0.0,
    "xtc_threshold": 0.1, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
    "dry_penalty_last_n": -1, "top_n_sigma": -1.0, "repeat_last_n": 64,
    "penalty_last_n": 64, "best_of": 1, "n_probs": 0,
}
# the most a wire map holds: logit_bias travels as one (OpenAI takes 300)
MAX_LOGIT_BIAS = 256


def check(opts: Any) -> None:
    """Refuse, before anything is sent, what the request's samplers cannot be (400)."""
    check_unsupported({name: getattr(opts, name, None) for name in NEUTRAL})
    line_logprobs(opts)
    line_sampling(opts)
    if opts.stream and opts.choices() > 1:
        raise HttpError(400, "unsupported_parameter", "n > 1 is answered whole: send it with "
                        "stream false (or one request per choice)")


def check_unsupported(unsupported: dict[str, Any]) -> None:
    """400 for a sampler the sidecar does not run, set to other than its neutral value."""
    for name, value in unsupported.items():
        if value is None or name not in NEUTRAL:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise HttpError(400, "invalid_argument", f"{name} must be a number")
        if float(value) != float(NEUTRAL[name]):
            raise HttpError(400, "unsupported_parameter", f"{name} is not supported by this "
                            f"server (leave it out, or {NEUTRAL[name]}): its sampler does not "
                            "run here, and a reply sampled without it is not what was asked")


def random_seed() -> int:
    return secrets.randbits(32)


def line_sampling(opts: Any, choice: int = 0) -> dict[str, Any]:
    """``chat.sampling`` for the request's line (``choice``: which of its ``n`` replies: each
    has its own seed). A seed is always sent: the given one (choice k: seed + k), or a random
    one when none is given or it is -1."""
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty",
                 "presence_penalty"):
        value = getattr(opts, name)
        if value is not None:
            out[name] = float(value)
    if opts.top_k is not None:
        out["top_k"] = max(0, int(opts.top_k))  # llama-server: 0 or less is off
    seed = opts.seed
    out["seed"] = random_seed() if seed is None or seed == -1 else (seed + choice) & 0xFFFFFFFF
    if opts.logit_bias:
        if len(opts.logit_bias) > MAX_LOGIT_BIAS:
            raise HttpError(400, "invalid_argument", f"logit_bias holds at most "
                            f"{MAX_LOGIT_BIAS} tokens here")
        out["logit_bias"] = {str(int(k)): float(v) for k, v in opts.logit_bias.items()}
    return out


def chat_options(opts: Any, choice: int = 0) -> dict[str, Any]:
    """The ``chat`` options for the request's samplers (``choice``: of its ``n``)."""
    out: dict[str, Any] = {"sampling": line_sampling(opts, choice)}
    logprobs = line_logprobs(opts)
    if logprobs is not None:
        out["logprobs"] = logprobs
    return out


def line_logprobs(opts: Any) -> int | None:
    """``chat.logprobs``: None unless ``logprobs`` is true (``top_logprobs`` alone is an
    error, as OpenAI answers it)."""
    if opts.top_logprobs is not None and not opts.logprobs:
        raise HttpError(400, "invalid_argument", "top_logprobs needs logprobs: true")
    if not opts.logprobs:
        return None
    return int(opts.top_logprobs or 0)


def max_tokens(opts: Any) -> int:
    """The reply's token limit: as asked, clamped to what one reply may take (a reply also
    ends where its session's share of the context is full, finish_reason "length")."""
    asked = opts.max_completion_tokens or opts.max_tokens or 256
    return max(1, min(int(asked), P.MAX_TOKENS))


def openai_logprobs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Token events' ``logprobs`` as OpenAI's ``choices[].logprobs.content``."""
    return [_entry(e, with_top=True) for e in events]


def _entry(e: dict[str, Any], *, with_top: bool) -> dict[str, Any]:
    token = str(e.get("token", ""))
    out: dict[str, Any] = {"token": token, "logprob": float(e.get("logprob", 0.0)),
                           "bytes": list(token.encode())}
    if with_top:
        out["top_logprobs"] = [_entry(a, with_top=False) for a in e.get("top", ())]
    return out


def model_limits(stats: dict[str, Any]) -> dict[str, Any]:
    """What a ``/v1/models`` entry says of the limits (from the sidecar's ``stats``):
    ``context_length`` is one conversation's share of the context (what a request's prompt
    and reply fit in), ``max_completion_tokens`` the most one reply takes; ``meta`` has the
    figures behind them (llama-server puts its own there too)."""
    limits = stats.get("limits") or {}
    n_ctx = limits.get("n_ctx")
    per = limits.get("n_ctx_per_session", n_ctx)
    out: dict[str, Any] = {"max_completion_tokens": min(P.MAX_TOKENS, per or P.MAX_TOKENS)}
    if per is not None:
        out["context_length"] = per
    out["meta"] = {"n_ctx": n_ctx, "n_ctx_per_conversation": per,
                   "max_tokens": P.MAX_TOKENS, "max_choices": MAX_CHOICES,
                   "concurrent_replies": limits.get("session_slots"),
                   "max_body_bytes": MAX_BODY_BYTES}
    return out
