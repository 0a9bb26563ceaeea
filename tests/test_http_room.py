"""Idle HTTP conversations give up the shared context's cells to a line that needs them (a mod
cannot close the conversations it has given up on), and come back with their transcript."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.sidecars import http_sidecar

LONG = " ".join(f"The ledger lists item {i} for the smithy." for i in range(50))  # ~550 tokens


@pytest.fixture(scope="module")
def small_face(tmp_path_factory, default_model) -> Iterator[str]:
    # 1024 cells, two slots: each keeps 256, one conversation may hold up to 768
    with http_sidecar(tmp_path_factory, default_model, "--max-sessions", "2",
                      "--ctx", "1024") as (base, _):
        yield base


def test_an_idle_conversation_gives_its_cells_to_a_line_that_needs_them(small_face) -> None:
    oa = openai.OpenAI(base_url=f"{small_face}/v1", api_key="-", max_retries=0)

    def say(key: str, messages: list[dict[str, str]], stream: bool = False) -> tuple[str, int]:
        if stream:
            chunks = list(oa.chat.completions.create(
                model="m", max_tokens=4, stream=True, stream_options={"include_usage": True},
                messages=messages, extra_body={"prompt_cache_key": key}))
            out = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return out, chunks[-1].usage.prompt_tokens_details.cached_tokens
        r = oa.chat.completions.create(model="m", max_tokens=4, messages=messages,
                                       extra_body={"prompt_cache_key": key})
        return r.choices[0].message.content or "", r.usage.prompt_tokens_details.cached_tokens

    first = [{"role": "user", "content": LONG}]
    reply, _ = say("npc.ledger", first)  # holds ~550 cells, then goes idle
    # another conversation needs ~550 cells too: 1100 > the 1024 of the context, so the idle
    # one gives them up instead of the line being refused with context_full (streamed: the
    # refusal comes before any token, so it is retried before the response starts)
    say("npc.scribe", [{"role": "user", "content": LONG + " Sum it up."}], stream=True)
    # the first conversation comes back: its transcript opens anew (nothing cached) and is
    # answered; the scribe, idle now, gives its cells up in turn
    grown = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]
    _, cached = say("npc.ledger", grown)
    assert cached == 0
