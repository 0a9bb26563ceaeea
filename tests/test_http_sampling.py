"""The OpenAI face's samplers, limits and concurrency against the real sidecar (the default
model, eight session slots), with the official ``openai`` package as the client: concurrent
requests up to the session slots, a random seed per request, each request's temperature on
later turns, logit_bias, logprobs (streamed and not), ``n`` choices, nulls, limits."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.sidecars import http_sidecar, openai_api

STORY = [{"role": "user", "content": "Tell me a story about a dragon."}]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, default_model) -> Iterator[tuple[str, str]]:
    # fixed prompt chunks: a seeded request repeats exactly (runtime/config.py prefill_chunk)
    with http_sidecar(tmp_path_factory, default_model, "--max-sessions", "8", "--ctx", "4096",
                      "--prefill-chunk", "64", ready_s=120) as both:
        yield both


@pytest.fixture(scope="module")
def face(sidecar) -> str:
    return sidecar[0]


@pytest.fixture
def api(face) -> openai.OpenAI:
    return openai_api(face, timeout=300)


def _text(api: openai.OpenAI, **kw) -> str:
    r = api.chat.completions.create(model="smol", messages=kw.pop("messages", STORY),
                                    max_tokens=kw.pop("max_tokens", 12), **kw)
    return r.choices[0].message.content or ""


def test_eight_concurrent_requests_are_all_answered(face) -> None:
    def one(i: int) -> int:
        return httpx.post(f"{face}/v1/chat/completions", timeout=300, json={
            "max_tokens": 16, "messages": [{"role": "user", "content": f"Count to {i + 3}."}]}
        ).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(8))) == [200] * 8


def test_without_a_seed_asking_again_samples_again(api) -> None:
    replies = {_text(api, temperature=1.0) for _ in range(3)}
    assert len(replies) >= 2
    assert len({_text(api, temperature=1.0, seed=-1) for _ in range(3)}) >= 2


def test_a_seed_gives_the_same_reply(api) -> None:
    assert _text(api, temperature=1.0, seed=42) == _text(api, temperature=1.0, seed=42)


def test_a_later_turn_is_sampled_at_its_own_temperature(api) -> None:
    first = _text(api, temperature=0, messages=STORY)  # greedy: the same in both
    later = [*STORY, {"role": "assistant", "content": first},
             {"role": "user", "content": "And then what happened?"}]
    replies = set()
    for k in range(3):  # each conversation's first turn was greedy; its second is not
        key = f"later-{k}"
        assert _text(api, temperature=0, messages=STORY,
                     extra_body={"prompt_cache_key": key}) == first
        replies.add(_text(api, temperature=2.0, seed=k, messages=later, max_tokens=16,
                          extra_body={"prompt_cache_key": key}))
    assert len(replies) >= 2


def test_logit_bias_forces_and_bans_tokens(api) -> None:
    # 21285 is " banana" in the default model's vocabulary
    forced = api.chat.completions.create(model="smol", messages=STORY, max_tokens=5,
                                         temperature=0.8, logit_bias={"21285": 100})
    assert forced.choices[0].message.content == " banana" * 5
    greedy = api.chat.completions.create(model="smol", messages=STORY, max_tokens=3,
                                         temperature=0, logprobs=True)
    first = greedy.choices[0].logprobs.content[0].token
    ids = {"In": "788", "Once": "6403", "The": "504"}  # the default model's likely openers
    if first in ids:  # banned: another token comes first
        banned = api.chat.completions.create(model="smol", messages=STORY, max_tokens=3,
                                             temperature=0, logprobs=True,
                                             logit_bias={ids[first]: -100})
        assert banned.choices[0].logprobs.content[0].token != first
    with pytest.raises(openai.BadRequestError) as e:  # past the vocabulary
        _text(api, logit_bias={"4000000": 1})
    assert e.value.body["code"] == "invalid_sampling"


def test_logprobs_in_openais_shape(api) -> None:
    r = api.chat.completions.create(model="smol", messages=STORY, max_tokens=6, temperature=0,
                                    logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    chunks = list(api.chat.completions.create(
        model="smol", messages=STORY, max_tokens=6, temperature=0, stream=True,
        logprobs=True, top_logprobs=2))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    plain = api.chat.completions.create(model="smol", messages=STORY, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_n_gives_n_choices(api) -> None:
    r = api.chat.completions.create(model="smol", messages=STORY, max_tokens=8, n=2,
                                    temperature=1.0, seed=3)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)
    if all(c.finish_reason == "length" for c in r.choices):
        assert r.usage.completion_tokens == 16  # every choice's tokens count
    with pytest.raises(openai.BadRequestError):
        list(api.chat.completions.create(model="smol", messages=STORY, max_tokens=4, n=2,
                                         stream=True))


def test_nulls_seed_minus_one_and_a_large_max_tokens_are_accepted(face) -> None:
    r = httpx.post(f"{face}/v1/chat/completions", timeout=300, json={
        "messages": STORY, "stream": None, "n": None, "model": None, "user": None,
        "temperature": None, "seed": -1, "max_tokens": 100_000, "stop": ["."]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


def test_models_say_the_limits(api) -> None:
    entry = api.models.list().data[0].model_dump()
    assert 0 < entry["context_length"] <= 4096
    assert entry["max_completion_tokens"] <= entry["context_length"]
    assert entry["meta"]["n_ctx"] == 4096 and entry["meta"]["concurrent_replies"] == 8
