"""The pure parts of scale-out: where a line goes, what a routed conversation keeps, the bounded
event-stream reader, and which replica a session keeps to."""

from __future__ import annotations

import json

import httpx
import pytest

from igi_sdk.errors import UpstreamUnavailableError
from igi_sdk.upstream.client import UpstreamCall, UpstreamClient
from igi_sdk.upstream.config import STICKY_HEADERS, UpstreamConfig, affinity_headers, api_base
from igi_sdk.upstream.policy import LocalHealth, route
from igi_sdk.upstream.sse import data_lines
from igi_sdk.upstream.transcript import MAX_TRANSCRIPT_CHARS, Transcript
from igi_sdk.wire.protocol import MAX_HISTORY_TURNS, Sampling

UP = LocalHealth(available=True, on_gpu=True)
CPU = LocalHealth(available=True, on_gpu=False)
DOWN = LocalHealth(available=False, on_gpu=False)


def test_route_by_policy_health_and_speed() -> None:
    kw = {"cpu_tps": None, "min_local_tps": 0.0, "restored": False}
    assert route("local", DOWN, **kw) == "local"
    assert route("remote", UP, **kw) == "remote"
    assert route("overflow", UP, **kw) == "local"
    assert route("overflow", DOWN, **kw) == "remote"
    slow = {"cpu_tps": 3.0, "min_local_tps": 8.0, "restored": False}
    assert route("overflow", CPU, **slow) == "remote"  # the CPU rung, measured too slow
    assert route("overflow", UP, **slow) == "local"  # the figure is of the CPU placement only
    assert route("overflow", CPU, **{**slow, "cpu_tps": None}) == "local"  # not measured yet
    assert route("overflow", DOWN, **{**kw, "restored": True}) == "local"  # its text is local


def test_a_transcript_keeps_the_newest_whole_exchanges_within_its_bounds() -> None:
    t = Transcript("sys", Sampling(), 0, local_turns=0)
    for i in range(MAX_HISTORY_TURNS):  # twice the turns it may keep
        t.commit(f"line {i}", f"reply {i}", local=True)
    assert len(t.turns) == MAX_HISTORY_TURNS and t.turns[0] == ("user", f"line {i - 127}")
    assert t.local_fresh and t.dropped == MAX_HISTORY_TURNS
    t.commit("upstream line", "upstream reply", local=False)
    assert not t.local_fresh  # its local copy lacks the last exchange
    big = Transcript("", Sampling(), 0)
    for i in range(6):
        big.commit("x" * (MAX_TRANSCRIPT_CHARS // 4), f"r{i}", local=False)
    assert sum(len(x) for _, x in big.turns) <= MAX_TRANSCRIPT_CHARS
    assert big.turns[-1] == ("assistant", "r5") and big.turns[0][0] == "user"
    msgs = big.messages("now")
    assert msgs[-1] == {"role": "user", "content": "now"} and msgs[0]["role"] == "user"


def test_event_lines_are_bounded_before_they_are_held() -> None:
    stream = [b"data: {\"a\"", b": 1}\n\n: keep-alive\nevent: x\ndata: [DONE]\n"]
    assert list(data_lines(stream, 64)) == [b'{"a": 1}', b"[DONE]"]
    with pytest.raises(UpstreamUnavailableError):  # one endless line, never ended by \n
        list(data_lines((b"data: " + b"x" * 1000 for _ in range(100)), 4096))
    with pytest.raises(UpstreamUnavailableError):  # one long line inside a chunk
        list(data_lines([b"data: " + b"y" * 10_000 + b"\n"], 4096))


def test_each_session_keeps_to_one_replica_and_only_a_lost_replicas_sessions_move() -> None:
    urls = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))
    four = UpstreamClient(UpstreamConfig(urls=urls))
    three = UpstreamClient(UpstreamConfig(urls=urls[:3]))
    keys = [f"session-{i}" for i in range(400)]
    first = {k: four.replicas_for(k)[0] for k in keys}
    assert first == {k: four.replicas_for(k)[0] for k in keys}  # stable
    assert min(list(first.values()).count(api_base(u)) for u in urls) > 60  # spread
    moved = [k for k in keys if three.replicas_for(k)[0] != first[k]]
    assert moved and all(first[k] == api_base(urls[3]) for k in moved)
    four.close()
    three.close()


def test_upstream_settings_are_checked() -> None:
    assert api_base("http://h:8000") == "http://h:8000/v1"
    assert api_base("https://h/api/v1/") == "https://h/api/v1"
    for bad in ("ftp://h/v1", "http://user:pw@h/v1", "http://h/v1?x=1", "h:8000"):
        with pytest.raises(ValueError):
            api_base(bad)
    with pytest.raises(ValueError):
        UpstreamConfig(urls=())
    with pytest.raises(ValueError):
        UpstreamConfig(urls=("http://h",), affinity_header="x-bad: header")


def test_the_session_key_goes_in_every_routers_sticky_header() -> None:
    # vLLM's router, SGLang's gateway and NVIDIA Dynamo each read one of these by default
    assert affinity_headers("k1") == {"x-session-id": "k1", "x-smg-routing-key": "k1",
                                      "x-dynamo-session-id": "k1"}
    assert affinity_headers("k1", "X-Tenant-Key") == {**affinity_headers("k1"),
                                                      "x-tenant-key": "k1"}
    assert affinity_headers("k1", "X-SMG-Routing-Key") == affinity_headers("k1")  # one per name
    client = UpstreamClient(UpstreamConfig(urls=("http://h",), affinity_header="x-my-key"))
    sent = client._headers("k2")
    assert all(sent[h] == "k2" for h in (*STICKY_HEADERS, "x-my-key"))
    client.close()


def test_a_reply_cut_at_max_tokens_still_reads_the_usage_that_follows() -> None:
    # a replica streams exactly max_tokens pieces, then the finish and the usage chunks: the
    # cached tokens are in the last one
    def sse(*chunks: dict) -> bytes:
        return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)

    text = [{"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]} for i in range(8)]
    body = sse(*text, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
               {"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 8,
                                         "prompt_tokens_details": {"cached_tokens": 100}}})
    answer = httpx.MockTransport(lambda _r: httpx.Response(
        200, headers={"content-type": "text/event-stream"},
        stream=httpx.ByteStream(body + b"data: [DONE]\n\n")))
    client = UpstreamClient(UpstreamConfig(urls=("http://h",), model="m"), transport=answer)
    reply = client.stream("k", {"messages": [], "max_tokens": 8}, lambda _t: None,
                          UpstreamCall(), max_chars=1 << 20)
    client.close()
    assert reply.text == "".join(f"w{i} " for i in range(8)) and reply.finish_reason == "length"
    assert (reply.cached_tokens, reply.prompt_tokens, reply.completion_tokens) == (100, 20, 8)


def test_a_routers_500_for_a_worker_it_could_not_reach_is_tried_again() -> None:
    def answer(status: int, body: dict) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": "application/json"},
                              stream=httpx.ByteStream(json.dumps(body).encode()))

    answers = [answer(500, {"error": {"message": "error sending request for url"}}),
               answer(200, {"choices": [{"message": {"content": "Aye."},
                                         "finish_reason": "stop"}]})]
    client = UpstreamClient(UpstreamConfig(urls=("http://h",), model="m", backoff_s=0.01),
                            transport=httpx.MockTransport(lambda _r: answers.pop(0)))
    reply = client.stream("k", {"messages": []}, lambda _t: None, UpstreamCall(), 1 << 20)
    client.close()
    assert (reply.text, reply.attempts) == ("Aye.", 2)
