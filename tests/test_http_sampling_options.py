"""What a Chat Completions request's samplers and limits become (pure: no sidecar): every sampler
honoured or refused with a 400, a seed on every line, nulls read as left out, limits clamped or
advertised rather than refused, OpenAI's shape for a prompt over the context."""

from __future__ import annotations

import json

import pytest

from igi_sdk.http import sampling_options as S
from igi_sdk.http.errors import HttpError, from_code
from igi_sdk.http.parse import read
from igi_sdk.wire import protocol as P


def _read(**fields: object):
    return read(json.dumps({"messages": [{"role": "user", "content": "Hi"}], **fields}).encode())


def test_every_sampler_given_is_on_the_line() -> None:
    req = _read(temperature=1.3, top_p=0.9, top_k=7, min_p=0.1, repeat_penalty=1.2,
                frequency_penalty=0.5, presence_penalty=-0.25, seed=11,
                logit_bias={"15": 100, "7": -100}).options
    line = S.chat_options(req)["sampling"]
    assert line == {"temperature": 1.3, "top_p": 0.9, "top_k": 7, "min_p": 0.1,
                    "repeat_penalty": 1.2, "frequency_penalty": 0.5, "presence_penalty": -0.25,
                    "seed": 11, "logit_bias": {"15": 100.0, "7": -100.0}}
    # the line's options pass the sidecar's own schema
    P.Chat.model_validate({"session": "s", "text": "Hi", "sampling": line})


def test_a_seed_on_every_line_random_without_one() -> None:
    seeds = {S.chat_options(_read().options)["sampling"]["seed"] for _ in range(8)}
    assert len(seeds) >= 7  # drawn per request: asking again samples again
    assert len({S.chat_options(_read(seed=-1).options)["sampling"]["seed"]
                for _ in range(8)}) >= 7
    given = _read(seed=5).options
    assert [S.chat_options(given, k)["sampling"]["seed"] for k in range(3)] == [5, 6, 7]
    assert 0 <= S.chat_options(_read(seed=2**63 - 1).options)["sampling"]["seed"] < 2**32


def test_top_k_off_as_llama_server_says_it() -> None:
    assert S.chat_options(_read(top_k=-1).options)["sampling"]["top_k"] == 0


def test_explicit_nulls_are_fields_left_out() -> None:
    parsed = _read(stream=None, n=None, model=None, temperature=None, seed=None, stop=None,
                   max_tokens=None, logprobs=None, user=None, logit_bias=None)
    assert parsed.options.choices() == 1 and not parsed.options.stream
    assert parsed.options.reply_tokens() == 256


def test_max_tokens_past_a_reply_is_clamped_not_refused() -> None:
    assert _read(max_tokens=100_000).options.reply_tokens() == P.MAX_TOKENS
    assert _read(max_completion_tokens=9000).options.reply_tokens() == P.MAX_TOKENS


def test_a_message_over_openais_old_bound_is_read() -> None:
    parsed = read(json.dumps({"messages": [{"role": "user", "content": "é" * 40_000}]}).encode())
    assert len(parsed.line) == 40_000  # the context decides, not a count of characters


@pytest.mark.parametrize("name, value", [("mirostat", 2), ("typical_p", 0.5),
                                         ("dry_multiplier", 0.8), ("best_of", 3),
                                         ("repeat_last_n", 128)])
def test_a_sampler_that_does_not_run_here_is_refused(name: str, value: float) -> None:
    with pytest.raises(HttpError) as e:
        _read(**{name: value})
    assert (e.value.status, e.value.code) == (400, "unsupported_parameter")
    assert name in e.value.message


@pytest.mark.parametrize("name, value", [("mirostat", 0), ("typical_p", 1.0),
                                         ("best_of", 1), ("repeat_last_n", 64)])
def test_the_neutral_value_of_such_a_sampler_is_accepted(name: str, value: float) -> None:
    _read(**{name: value})


def test_logprobs_in_openais_terms() -> None:
    assert "logprobs" not in S.chat_options(_read().options)
    assert S.chat_options(_read(logprobs=True).options)["logprobs"] == 0
    assert S.chat_options(_read(logprobs=True, top_logprobs=5).options)["logprobs"] == 5
    with pytest.raises(HttpError) as e:
        _read(top_logprobs=2)
    assert e.value.status == 400
    with pytest.raises(HttpError):
        _read(logprobs=True, top_logprobs=21)
    content = S.openai_logprobs([{"token": "é", "logprob": -0.5,
                                  "top": [{"token": "é", "logprob": -0.5},
                                          {"token": "a", "logprob": -1.5}]}])
    assert content == [{"token": "é", "logprob": -0.5, "bytes": [195, 169], "top_logprobs": [
        {"token": "é", "logprob": -0.5, "bytes": [195, 169]},
        {"token": "a", "logprob": -1.5, "bytes": [97]}]}]


def test_out_of_range_samplers_are_400s() -> None:
    for fields in ({"frequency_penalty": 2.5}, {"logit_bias": {"x": 1}},
                   {"logit_bias": {"3": 101}}, {"seed": -2}, {"n": S.MAX_CHOICES + 1}):
        with pytest.raises(HttpError) as e:
            _read(**fields)
        assert e.value.status == 400, fields


def test_a_prompt_over_the_context_is_openais_context_length_exceeded() -> None:
    e = from_code("prompt_too_long", "this line needs 9000 tokens")
    assert e.status == 400
    assert e.body() == {"error": {
        "message": "This model's maximum context length is exceeded: this line needs 9000 "
                   "tokens", "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"}}
    # LiteLLM tells a context-window error by these words (its exception mapping)
    assert "this model's maximum context length is" in e.body()["error"]["message"].lower()


def test_models_entries_say_the_limits() -> None:
    stats = {"limits": {"n_ctx": 4096, "n_ctx_per_session": 1536, "session_slots": 8,
                        "max_tokens": P.MAX_TOKENS}}
    entry = S.model_limits(stats)
    assert entry["context_length"] == 1536 and entry["max_completion_tokens"] == 1536
    assert entry["meta"]["n_ctx"] == 4096 and entry["meta"]["concurrent_replies"] == 8
    assert S.model_limits({})["max_completion_tokens"] == P.MAX_TOKENS


def test_n_past_one_is_not_streamed() -> None:
    assert _read(n=3).options.choices() == 3
    with pytest.raises(HttpError) as e:
        _read(n=2, stream=True)
    assert (e.value.status, e.value.code) == (400, "unsupported_parameter")
