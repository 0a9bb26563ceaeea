"""The transcripts mods send, over the HTTP face against the real sidecar and default model:
trimmed replies re-read only what changed, system messages mid-transcript, assistant-last
transcripts continued, two requests at once under one ``user``."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from tests.test_http_face import api, face  # noqa: F401  (fixtures)

NPC = "You are Brom, the village blacksmith. Answer in one short sentence."


def _ask(api, msgs, key=None, max_tokens=16):  # noqa: F811
    extra = {"prompt_cache_key": key} if key else {}
    return api.chat.completions.create(model="smol", max_tokens=max_tokens, temperature=0,
                                       messages=msgs, extra_body=extra)


def _read(r) -> int:
    """Prompt tokens the sidecar read for the request (not reused from the cache)."""
    return r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("key", ["trim-1", None])
def test_a_client_that_trims_replies_rereads_only_what_changed(api, key) -> None:  # noqa: F811
    msgs = [{"role": "system", "content": NPC},
            {"role": "user", "content": f"I need a sword ({key})."}]
    first = _ask(api, msgs, key, max_tokens=24)
    reply = first.choices[0].message.content
    trimmed = " ".join(reply.split()[:3])  # a client that keeps the first words only
    msgs += [{"role": "assistant", "content": trimmed},
             {"role": "user", "content": "How much is it?"}]
    second = _ask(api, msgs, key)
    # the system prompt, the first line and the reply's start stay in the cache
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert _read(second) < first.usage.prompt_tokens  # only the cut and the new line
    # trimmed again, with an instruction inserted (CHIM): still only what changed
    msgs += [{"role": "assistant", "content": second.choices[0].message.content[:10]},
             {"role": "system", "content": "Stay in character."},
             {"role": "user", "content": "Fine, I'll take it."}]
    third = _ask(api, msgs, key)
    assert third.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens - 12
    assert _read(third) < first.usage.prompt_tokens


def test_a_system_message_mid_transcript_is_answered(api) -> None:  # noqa: F811
    r = _ask(api, [{"role": "system", "content": NPC}, {"role": "user", "content": "Hi."},
                   {"role": "assistant", "content": "Welcome to my forge."},
                   {"role": "system", "content": "Lydia, a housecarl, joins the conversation."},
                   {"role": "user", "content": "Who is she?"}])
    assert r.choices[0].message.content and r.usage.completion_tokens >= 1


def test_an_assistant_last_transcript_is_continued(api) -> None:  # noqa: F811
    msgs = [{"role": "system", "content": NPC},
            {"role": "user", "content": "What is your name?"},
            {"role": "assistant", "content": "My name is"}]
    r = _ask(api, msgs, "prefill-1", max_tokens=8)
    text = r.choices[0].message.content
    assert text and not text.lstrip().startswith("My name is")  # the continuation only
    # the conversation holds "My name is" + the continuation as one message: sent back so,
    # the next line reads only itself
    msgs[-1] = {"role": "assistant", "content": "My name is" + text}
    msgs.append({"role": "user", "content": "Nice to meet you."})
    nxt = _ask(api, msgs, "prefill-1", max_tokens=4)
    assert nxt.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens
    assert _read(nxt) < 24  # the closing markup and the line, not the transcript


def test_two_requests_at_once_under_one_user_are_both_answered(face) -> None:  # noqa: F811
    results: list[httpx.Response] = []
    started = threading.Event()

    def first() -> None:
        with httpx.stream("POST", f"{face[0]}/v1/chat/completions", timeout=60, json={
                "max_tokens": 40, "stream": True, "user": "npc-shared", "messages": [
                    {"role": "user", "content": "Tell me a long story about swords."}]}) as r:
            results.append(r)
            for _ in r.iter_lines():
                started.set()

    t = threading.Thread(target=first)
    t.start()
    assert started.wait(30)
    second = httpx.post(f"{face[0]}/v1/chat/completions", timeout=60, json={
        "max_tokens": 8, "user": "npc-shared", "messages": [
            {"role": "user", "content": "Another NPC's line."}]})
    t.join(60)
    assert second.status_code == 200 and second.json()["choices"][0]["message"]["content"]
    assert results and results[0].status_code == 200


def test_a_transcript_ending_with_a_system_message_is_refused(api) -> None:  # noqa: F811
    with pytest.raises(openai.BadRequestError):
        _ask(api, [{"role": "user", "content": "Hi."}, {"role": "system", "content": "x"}])


def test_a_stream_stopped_early_keeps_its_session_and_cache(face, api) -> None:  # noqa: F811
    msgs = [{"role": "system", "content": NPC},
            {"role": "user", "content": "Count from one to a hundred."}]
    said = []
    with httpx.stream("POST", f"{face[0]}/v1/chat/completions", timeout=60, json={
            "max_tokens": 200, "stream": True, "temperature": 0, "prompt_cache_key": "stop-1",
            "messages": msgs}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                said.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
            if len(said) > 8:
                break  # the client stops reading mid-reply
    first_prompt = _ask(api, [msgs[0], {"role": "user", "content": "x"}]).usage.prompt_tokens
    msgs += [{"role": "assistant", "content": "".join(said)},
             {"role": "user", "content": "Stop there."}]
    nxt = _ask(api, msgs, "stop-1", max_tokens=4)
    # the session was kept: its system prompt, the line and what was said stay cached
    assert nxt.usage.prompt_tokens_details.cached_tokens >= first_prompt
    assert _read(nxt) < 24
