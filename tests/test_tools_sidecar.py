"""Tool calls against the real sidecar and the default model (SmolLM2-135M), over ZeroMQ and
over the OpenAI HTTP face with the official ``openai`` package: a Mantella-style request
(its "Advanced Actions" as OpenAI tools, the results sent back as ``tool`` messages)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from igi_sdk.client import BridgeError, Client, ToolCall
from tests.sidecars import http_sidecar

jsonschema = pytest.importorskip("jsonschema")

SYSTEM = ("You are Lydia, a Nord housecarl in Whiterun. You are talking with the Dragonborn. "
          "Speak briefly, in character.")
# Mantella's Advanced Actions, in the shape its function manager sends them: a name, a
# description, and parameters of type object whose properties may carry its own keys
# ("scope": which NPCs a name may be); some actions take no parameters at all
ACTIONS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "Follow", "description": "Start following the player.",
        "parameters": {"type": "object", "properties": {
            "source": {"type": "string", "description": "Who follows: one of Lydia",
                       "scope": "conversation"}}, "required": ["source"]}}},
    {"type": "function", "function": {
        "name": "Attack", "description": "Attack someone nearby.",
        "parameters": {"type": "object", "properties": {
            "source": {"type": "string", "scope": "conversation"},
            "target": {"type": "string", "description": "Who is attacked: a nearby NPC",
                       "scope": "nearby_w_player"}}, "required": ["source", "target"]}}},
    {"type": "function", "function": {
        "name": "Inventory", "description": "Open your inventory to trade with the player."}},
    {"type": "function", "function": {
        "name": "Wait", "description": "Wait here.",
        "parameters": {"type": "object", "properties": {
            "minutes": {"type": "integer", "minimum": 1, "maximum": 120}},
            "required": ["minutes"]}}},
]
WIRE_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
               **({"parameters": t["function"]["parameters"]}
                  if "parameters" in t["function"] else {})} for t in ACTIONS]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object",
                                                                    "properties": {}})
           for t in ACTIONS}
LINES = ["Follow me, Lydia.", "Attack that bandit!", "Let's trade.", "Wait here for me.",
         "How are you today?"]


def valid_call(name: str, arguments: str) -> bool:
    """A declared tool, its arguments an object valid against its schema (every object with
    properties closed: what the sidecar holds a call to)."""
    if name not in SCHEMAS:
        return False
    schema = json.loads(json.dumps(SCHEMAS[name]))
    schema.setdefault("additionalProperties", False)
    try:
        jsonschema.validate(json.loads(arguments), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def verdict(text: str, calls: list[tuple[str, str]], why: object = None) -> str:
    """A reply is calls (each valid; a reply cut by max_tokens keeps the calls it closed) or
    plain text; anything else is invalid (a reply cut inside its first call among them)."""
    if calls:
        kind = "call" if all(valid_call(n, a) for n, a in calls) and not text else "invalid"
    else:
        kind = "text" if text.strip() and "<tool_call>" not in text else "invalid"
    if kind == "invalid":
        print(f"invalid reply: {text!r} {calls} {why}")
    return kind


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, default_model) -> Iterator[tuple[str, str]]:
    # a loaded 2-core host starts it slowly
    with http_sidecar(tmp_path_factory, default_model, ready_s=240) as (base, ep):
        yield ep, base


@pytest.fixture(scope="module")
def client(sidecar) -> Iterator[Client]:
    c = Client(sidecar[0], timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def api(sidecar) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sidecar[1]}/v1", api_key="none", timeout=120)


# 20 replies of a 135M model with a 400-token prompt each: minutes on a loaded 2-core host
@pytest.mark.timeout(1500)
def test_mantella_actions_over_zeromq_are_calls_or_text_20_of_20(client) -> None:
    counts = {"call": 0, "text": 0, "invalid": 0}
    for k in range(20):
        sid = client.open_session(SYSTEM, sampling={"temperature": 0.9, "seed": 100 + k})
        # a spoken line ends at its newline (a call's text is never cut by a stop string)
        stream = client.chat(sid, LINES[k % len(LINES)], max_tokens=64, tools=WIRE_TOOLS,
                             stop=["\n"])
        events = list(stream.events())
        done = stream.done
        assert done is not None
        calls = [(c.name, c.arguments) for c in stream.done_tool_calls]
        counts[verdict(done["text"], calls, done["finish_reason"])] += 1
        # every call came as a typed event before the end, in order, the same as done's
        streamed = [e for e in events if isinstance(e, ToolCall)]
        assert [(c.id, c.name, c.arguments) for c in streamed] == [
            (c.id, c.name, c.arguments) for c in stream.done_tool_calls]
        assert [c.index for c in streamed] == list(range(len(streamed)))
        if calls:
            assert done["finish_reason"] in ("tool_calls", "length")
            assert not [e for e in events if isinstance(e, str)]  # call text is not streamed
        client.close_session(sid)
    print(f"zeromq auto: {counts}")
    assert counts["invalid"] == 0 and counts["call"] + counts["text"] == 20


def test_required_and_named_always_call_and_the_tool_turn_is_answered(client) -> None:
    for choice in ["required", "Attack", "Wait"]:
        sid = client.open_session(SYSTEM, sampling={"temperature": 0.9, "seed": 7})
        # the stop string is in every call's text ("<tool_call>\n{"): calls are not cut by it
        stream = client.chat(sid, "Attack that bandit!", max_tokens=48, tools=WIRE_TOOLS,
                             tool_choice=choice, stop=["\n"])
        done = stream.result()
        calls = stream.done_tool_calls
        assert done["finish_reason"] == "tool_calls" and done["text"] == "" and calls
        assert all(valid_call(c.name, c.arguments) for c in calls)
        if choice != "required":
            assert [c.name for c in calls] == [choice]  # exactly that tool, once
        assert all(c.id.startswith("call_") for c in calls)
        # the results go back; the reply continues from them, on the same cache
        follow = client.chat(sid, "", max_tokens=24, tools=WIRE_TOOLS, tool_choice="none",
                             tool_results=[{"id": c.id, "content": '{"done": true}'}
                                           for c in calls]).result()
        assert follow["text"] and follow["tool_calls"] == []
        assert follow["finish_reason"] in ("stop", "length")
        assert follow["usage"]["cached_tokens"] > done["usage"]["prompt_tokens"] // 2
        client.close_session(sid)


def test_a_bad_tool_schema_is_an_invalid_body(client) -> None:
    sid = client.open_session(SYSTEM)
    bad = [{"name": "Shout", "parameters": {"type": "object", "properties": {
        "words": {"type": "string", "maxLength": 100_000}}}}]
    with pytest.raises(BridgeError) as e:
        client.chat(sid, "Shout!", tools=bad).result()
    assert e.value.code == "invalid_body" and "Shout" in e.value.message
    with pytest.raises(BridgeError) as e:  # refused by the protocol before any work
        client.chat(sid, "Go.", tools=WIRE_TOOLS, tool_choice="Fly").result()
    assert e.value.code == "invalid_body"
    client.close_session(sid)


def _http_verdict(choice: Any) -> tuple[str, list[tuple[str, str]]]:
    msg = choice.message
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    if calls:  # (length: a further call was cut short; the ones closed are kept)
        assert choice.finish_reason in ("tool_calls", "length") and msg.content is None
    return verdict(msg.content or "", calls, choice.finish_reason), calls


@pytest.mark.timeout(1500)
def test_mantella_over_http_with_openai_20_of_20_and_the_tool_message_is_answered(api) -> None:
    counts = {"call": 0, "text": 0, "invalid": 0}
    followed = 0
    for k in range(20):
        messages: list[Any] = [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": LINES[k % len(LINES)]}]
        r = api.chat.completions.create(model="smol", messages=messages, tools=ACTIONS,
                                        max_tokens=64, temperature=0.9, seed=200 + k,
                                        stop=["\n"], user=f"npc-{k}")
        kind, calls = _http_verdict(r.choices[0])
        counts[kind] += 1
        if calls and followed < 2:  # Mantella sends the results back as tool messages
            followed += 1
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "done"}
                         for c in msg.tool_calls or []]
            again = api.chat.completions.create(model="smol", messages=messages,
                                                tools=ACTIONS, tool_choice="none",
                                                max_tokens=24, user=f"npc-{k}")
            assert again.choices[0].message.content
            # the conversation went on in its session: only the results were read
            details = again.usage.prompt_tokens_details
            assert details is not None and details.cached_tokens > r.usage.prompt_tokens // 2
    print(f"http auto: {counts}")
    assert counts["invalid"] == 0 and counts["call"] + counts["text"] == 20


def test_streamed_tool_calls_reassemble_to_the_same_calls(api) -> None:
    messages: list[Any] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": "Attack the bandit, then wait."}]
    # room for the longest call: two strings of at most 96 characters (tools.ARG_CHARS) and
    # the call's markup, at a token a character at worst
    body: dict[str, Any] = dict(model="smol", tools=ACTIONS, tool_choice="required",
                                parallel_tool_calls=False, max_tokens=320, temperature=0.0)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in api.chat.completions.create(**body, messages=messages, user="streamed",
                                             stream=True):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        assert not ch.delta.content  # no text streams for a reply that is calls
        for d in ch.delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += d.id or ""
            c["name"] += (d.function.name or "") if d.function else ""
            c["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls" and len(calls) == 1  # parallel_tool_calls false: one
    call = calls[0]
    assert call["id"].startswith("call_") and valid_call(call["name"], call["arguments"])
    # the calls as reassembled are the ones the conversation holds: sent back with their
    # result, the transcript continues the same session (only the result is read)
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function",
         "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "the bandit flees"}]
    again = api.chat.completions.create(**{**body, "tool_choice": "none", "max_tokens": 16},
                                        messages=messages, user="streamed")
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens > 300
    assert again.usage.prompt_tokens - details.cached_tokens < 40


def test_a_bad_tool_schema_over_http_is_a_400(sidecar) -> None:
    base = sidecar[1]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "Shout", "parameters": {
            "type": "object", "properties": {"w": {"type": "string", "maxLength": 10**6}}}}}]}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_body"
    body["tool_choice"] = {"type": "function", "function": {"name": "Fly"}}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"


def test_langchain_function_calling_structured_output(sidecar) -> None:
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class Trade(BaseModel):
        """A trade the NPC offers."""

        item: str = Field(description="what is sold")
        price: int = Field(description="in septims")

    llm = lc.ChatOpenAI(base_url=f"{sidecar[1]}/v1", api_key="none", model="smol",
                        max_tokens=48, temperature=0)
    out = llm.with_structured_output(Trade, method="function_calling").invoke(
        "Offer me a sword.")
    assert isinstance(out, Trade) and isinstance(out.price, int)
