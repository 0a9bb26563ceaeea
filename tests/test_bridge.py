"""The real sidecar on loopback (a child process) and the Python client talking to it."""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import msgpack
import pytest
import zmq

from igi_sdk.client import BridgeError, Client, SidecarUnavailable
from igi_sdk.serving.server import PID_POLL_S, is_loopback
from igi_sdk.wire import protocol as P
from tests.sidecars import free_port, start_sidecar, stop

GREEDY = {"temperature": 0.0, "seed": 1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, default_model, tiny_llama) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copy(default_model, d / "smol.gguf")  # a symlink out of the directory is refused
    os.symlink(default_model, d / "escape.gguf")
    shutil.copy(tiny_llama, d / "tiny.gguf")
    (d / "notes.txt").write_text("not a model")
    return d


@pytest.fixture(scope="module")
def sidecar(model_dir, tmp_path_factory):
    endpoint = f"ipc://{tmp_path_factory.mktemp('ipc') / 's.sock'}"
    proc = start_sidecar(model_dir, endpoint, "--model", "smol.gguf")
    client = Client(endpoint, timeout=60)
    client.wait_ready(60)
    yield endpoint, proc
    client.close()
    stop(proc)


@pytest.fixture
def client(sidecar):
    c = Client(sidecar[0], timeout=60)
    yield c
    c.close()


def test_every_request_type_round_trips(client, sidecar) -> None:
    hello = client.hello()
    assert hello["protocol"] == P.PROTOCOL_VERSION and hello["model"] == "smol.gguf"
    assert client.request("ping")["t"] > 0
    sid = client.open_session("You are a guard.", sampling=GREEDY, priority=2)
    done = client.chat(sid, "Halt! Who goes there?", max_tokens=12).result()
    assert done["usage"]["completion_tokens"] > 0 and done["text"]
    # recorded for the arbiter; without a target it paces nothing
    assert client.frame(1, 16.6, vram_used=10**9, vram_budget=4 * 10**9) == {"paced": False}
    assert client.frame(2, 16.6, target_frame_time_ms=16.6) == {"paced": True}
    assert client.reserve_vram(10**9, 30)["recorded"] is True
    assert client.save_session(sid, "guard")["bytes"] > 1000
    restored = client.restore_session("guard")
    assert restored != sid
    stats = client.stats()
    assert stats["sessions"] >= 2 and stats["last_frame"]["frame"] == 2 and stats["model"]
    assert client.request("cancel", {"request": 999})["cancelled"] is False
    client.close_session(sid)
    client.close_session(restored)
    named = client.open_session(persona="Brom", sampling=GREEDY)  # a name alone is enough
    assert client.chat(named, "Hello!", max_tokens=4).result()["usage"]["completion_tokens"] > 0
    client.close_session(named)


def test_stream_order_and_text(client) -> None:
    sid = client.open_session("You are a bard.", sampling=GREEDY)
    msg_id = client.send("chat", {"session": sid, "text": "Sing me a short song.",
                                  "max_tokens": 24})
    seen, text = [], []
    while True:
        rtype, body = client.next_event(msg_id)
        if rtype == "token":
            seen.append(body["i"])
            text.append(body["text"])
        else:
            assert rtype == "done"
            break
    assert seen == list(range(1, len(seen) + 1))  # in order, none lost or repeated
    assert "".join(text) == body["text"]
    client.close_session(sid)


def test_cancel_mid_stream(client) -> None:
    sid = client.open_session("You are a storyteller.", sampling={"seed": 3})
    stream = client.chat(sid, "Tell me a very long tale.", max_tokens=400)
    for n, _ in enumerate(stream):
        if n == 3:
            assert stream.cancel() is True
    assert stream.done["finish_reason"] == "cancelled"
    assert stream.done["usage"]["completion_tokens"] < 400
    client.close_session(sid)


def test_two_clients_sessions_are_isolated(sidecar) -> None:
    a, b = Client(sidecar[0], timeout=60), Client(sidecar[0], timeout=60)
    try:
        sid = a.open_session("x", sampling=GREEDY)
        with pytest.raises(BridgeError) as e:
            b.chat(sid, "hello").result()
        assert e.value.code == "unknown_session"
        with pytest.raises(BridgeError):
            b.close_session(sid)
        assert a.chat(sid, "hello", max_tokens=4).result()["usage"]["completion_tokens"] > 0
        a.close_session(sid)
    finally:
        a.close()
        b.close()


def test_typed_errors_and_unsafe_paths(client) -> None:
    for path in ("../../etc/passwd", "/etc/passwd", "sub/../../x.gguf", "escape.gguf"):
        with pytest.raises(BridgeError) as e:
            client.load_model(path)
        assert e.value.code == "forbidden_path"
    with pytest.raises(BridgeError) as e:
        client.load_model("missing.gguf")
    assert e.value.code == "model_not_found"
    with pytest.raises(BridgeError) as e:
        client.request("chat", {"session": "nope", "text": "hi"})
    assert e.value.code == "unknown_session"
    with pytest.raises(BridgeError) as e:
        client.request("open_session", {"sampling": {"temperature": -1}})
    assert e.value.code == "invalid_body" and "temperature" in e.value.message
    with pytest.raises(BridgeError) as e:
        client.request("frame", {"frame": -1, "frame_time_ms": 16})
    assert e.value.code == "invalid_body"
    with pytest.raises(BridgeError) as e:
        client.request("reserve_vram", {"bytes": "lots", "deadline_frames": 2})
    assert e.value.code == "invalid_body"
    # protocol 1.1: unknown fields are ignored and reported, not refused
    assert client.request("stats", {"unknown_field": 1})["ignored"] == ["unknown_field"]
    assert "ignored" not in client.request("stats")
    with pytest.raises(BridgeError) as e:
        client.request("chat", {"session": "s1", "text": "hi", "grammar": "root ::= \"a\"",
                                "json_schema": {"type": "object"}})
    assert e.value.code == "invalid_body" and "not both" in e.value.message
    sid = client.open_session("x")
    with pytest.raises(BridgeError) as e:
        client.chat(sid, "word " * 5000).result()
    assert e.value.code == "prompt_too_long"
    client.close_session(sid)


def test_out_of_order_before_hello(sidecar) -> None:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.connect(sidecar[0])
    s.send(P.encode(5, "stats"))
    assert s.poll(10_000)
    rid, rtype, body = P.decode_reply(s.recv())
    assert (rid, rtype, body["code"], body["retryable"]) == (5, "error", "hello_required", True)
    s.close(0)


# a well-formed shutdown would (rightly) stop the sidecar mid-test
FUZZ_TYPES = [t for t in P.REQUESTS if t != "shutdown"]


def _fuzz_frames(n: int, rng: random.Random) -> list[bytes]:
    types = [*FUZZ_TYPES, "bogus", "", None, 7]
    values = [None, True, -1, 0, 2**63, 3.5, float("nan"), "x" * 40, "", [], {}, [1, 2],
              {"a": 1}, b"\x00\xff"]
    frames = []
    for i in range(n):
        kind = i % 6
        if kind == 0:  # random bytes
            frames.append(rng.randbytes(rng.randint(0, 64)))
        elif kind == 1:  # truncated valid message
            good = P.encode(i, rng.choice(FUZZ_TYPES), {"session": "s", "text": "hi"})
            frames.append(good[: rng.randint(0, len(good) - 1)])
        elif kind == 2:  # wrong-typed envelope
            frames.append(msgpack.packb({"v": rng.choice([1, 2, "1", None]),
                                         "id": rng.choice(values), "type": rng.choice(types),
                                         "body": rng.choice(values)}))
        elif kind == 3:  # right envelope, random body fields and values
            body = {rng.choice(["session", "text", "bytes", "frame", "path", "x", "max_tokens",
                                "sampling", "request", "name"]): rng.choice(values)
                    for _ in range(rng.randint(0, 4))}
            frames.append(P.encode(i, rng.choice(FUZZ_TYPES), body))
        elif kind == 4:  # not a map at all
            frames.append(msgpack.packb(rng.choice(values)))
        else:  # deep nesting / odd containers
            frames.append(msgpack.packb({"v": 1, "id": i, "type": "chat",
                                         "body": {"session": [[[[["x"]]]]], "text": {"a": []}}}))
    return frames


class _Pace:
    """Stays below the sidecar's flood limit (2 000 messages a second per connection; past it
    the connection is cut): at most 1 000 sends in any second, with no credit saved up over a
    stall. The limit counts messages as the sidecar reads them; with a bounded number in
    flight, what it reads in a second is at most what was sent in it plus that number. (A
    cumulative 1 500 a second caught up after each stall of a loaded host and was cut.)"""

    def __init__(self, per_second: int = 1000) -> None:
        self.per_second = per_second
        self._sent: collections.deque[float] = collections.deque()

    def allows(self, n: int = 1) -> bool:
        now = time.monotonic()
        while self._sent and now - self._sent[0] >= 1.0:
            self._sent.popleft()
        return len(self._sent) + n <= self.per_second

    def sent(self, n: int = 1) -> None:
        self._sent.extend([time.monotonic()] * n)


def _frame_bodies(n: int, rng: random.Random) -> list[dict]:
    odd = [None, -1, 2**60, 1e308, float("nan"), "7", True, [], {}]
    out = []
    for _ in range(n):
        body = {"frame": rng.randint(0, 10**6), "frame_time_ms": rng.uniform(0, 50),
                "target_frame_time_ms": rng.choice([None, 16.7, 33.3]),
                "vram_used": rng.choice([None, rng.randint(0, 2**34)]),
                "vram_budget": rng.choice([None, rng.randint(0, 2**34)])}
        if rng.random() < 0.3:  # a broken field
            body[rng.choice(list(body))] = rng.choice(odd)
        out.append(body)
    return out


@pytest.mark.slow
def test_fuzz_ten_thousand_messages(model_dir, tmp_path) -> None:
    """Every malformed message gets a typed error; the sidecar keeps serving. Its own sidecar:
    the fuzzer's valid open_session requests hold slots (up to the per-client cap)."""
    endpoint = f"ipc://{tmp_path / 'f.sock'}"
    proc = start_sidecar(model_dir, endpoint, "--model", "tiny.gguf", "--max-sessions", "16",
                         "--max-sessions-per-client", "8")
    Client(endpoint, timeout=60).wait_ready(60)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send(P.encode(1, "hello", {"protocol": 1}))
    assert s.poll(10_000)
    s.recv()
    frames = _fuzz_frames(10_000, random.Random(1234))
    answered = errors = 0
    window = 200  # bounded in flight: back-pressure, not a flood
    sent = 0
    deadline = time.monotonic() + 240
    last_answer = time.monotonic()
    pace = _Pace()
    while answered < len(frames) and time.monotonic() < deadline:
        while sent < len(frames) and sent - answered < window and pace.allows():
            s.send(frames[sent])
            pace.sent()
            sent += 1
        if s.poll(100):
            _rid, rtype, body = P.decode_reply(s.recv())
            if rtype == "heartbeat":
                continue
            answered, last_answer = answered + 1, time.monotonic()
            if rtype == "error":
                errors += 1
                assert set(body) == {"code", "message", "retryable"}
                assert isinstance(body["code"], str) and body["message"]
                assert body["code"] != "internal", body  # every failure is a typed one
        elif sent > answered and time.monotonic() - last_answer > 5:
            break  # an answer is missing
    # 10 000 frame ticks, valid and not: every one answered, none an internal error
    frames = [P.encode(20_000 + i, "frame", rng_frame) for i, rng_frame in
              enumerate(_frame_bodies(10_000, random.Random(99)))]
    got, pace = 0, _Pace()
    for chunk in range(0, len(frames), 250):  # within a batch of the sidecar's loop
        while not pace.allows(250):
            time.sleep(0.01)
        for f in frames[chunk:chunk + 250]:
            s.send(f)
        pace.sent(250)
        n = 0
        while n < len(frames[chunk:chunk + 250]) and s.poll(10_000):
            _rid, rtype, body = P.decode_reply(s.recv())
            if rtype == "heartbeat":
                continue
            n += 1
            assert rtype == "ok" or body["code"] != "internal", body
        got += n
    assert got == len(frames)
    s.close(0)
    assert proc.poll() is None  # 0 crashes
    # every frame was answered; a handful of random bodies are valid requests (ok replies) and
    # oversized ones never reach the sidecar (ZMQ_MAXMSGSIZE is not hit by these sizes)
    assert answered == len(frames), (answered, errors)
    assert errors >= 0.95 * len(frames)
    c = Client(endpoint, timeout=60)  # a normal chat still works
    sid = c.open_session("x", sampling=GREEDY)
    assert c.chat(sid, "Hello!", max_tokens=4).result()["usage"]["completion_tokens"] > 0
    c.close_session(sid)
    c.close()
    stop(proc)


def test_oversized_message_is_dropped_not_fatal(sidecar) -> None:
    endpoint, proc = sidecar
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send(P.encode(1, "chat", {"session": "s", "text": "x" * (2 * P.MAX_MESSAGE_BYTES)}))
    time.sleep(0.5)
    s.close(0)
    assert proc.poll() is None
    c = Client(endpoint, timeout=30)
    assert c.stats()["model"]
    c.close()


@pytest.mark.slow
def test_sidecar_killed_mid_stream_then_reconnect(model_dir, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 'k.sock'}"
    proc = start_sidecar(model_dir, endpoint, "--model", "tiny.gguf")
    c = Client(endpoint, timeout=30)
    try:
        c.wait_ready(60)
        sid = c.open_session("x", sampling={"seed": 2})
        stream = c.chat(sid, "go on forever", max_tokens=4000, stop=[])
        with pytest.raises(SidecarUnavailable):
            for n, _ in enumerate(stream):
                if n == 2:
                    proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc = start_sidecar(model_dir, endpoint, "--model", "tiny.gguf")
        c.wait_ready(60)  # same client object: reconnects and greets the new sidecar
        sid = c.open_session("x")
        assert c.chat(sid, "hi", max_tokens=3).result()["usage"]["completion_tokens"] > 0
    finally:
        c.close()
        stop(proc)


@pytest.mark.slow
def test_sidecar_exits_when_the_game_dies(model_dir, tmp_path) -> None:
    game = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    endpoint = f"ipc://{tmp_path / 'g.sock'}"
    proc = start_sidecar(model_dir, endpoint, "--game-pid", str(game.pid))
    try:
        c = Client(endpoint, timeout=30)
        deadline = time.monotonic() + 60
        while True:  # still starting on a loaded machine: 5 s of silence is not an answer
            try:
                c.hello()
                break
            except SidecarUnavailable:
                if time.monotonic() > deadline:
                    raise
        c.close()
        game.kill()
        game.wait()
        t0, killed_at = time.monotonic(), time.time()
        proc.wait(10)
        took = time.monotonic() - t0
        # PROTOCOL.md §10: it stops serving within a poll of the game's end (read from its
        # log line's time), then exits after closing the model: about 2 s on a busy machine
        line = next(x for x in proc.stderr.read().splitlines() if "is gone" in x)
        seen_at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        assert seen_at - killed_at < PID_POLL_S + 0.25, line
        assert took < 5.0, took
    finally:
        game.kill()
        stop(proc)


@pytest.mark.slow
def test_curve_keys_required_and_enforced(model_dir, tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
                        "tcp://0.0.0.0:0", "--model-dir", str(model_dir)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "CurveZMQ" in r.stderr  # no non-loopback bind without keys
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "igi_sdk.cli", "keys", str(keys)], check=True,
                   capture_output=True, timeout=60)
    port = free_port()
    proc = start_sidecar(model_dir, f"tcp://127.0.0.1:{port}", "--curve-secret",
                         str(keys / "server.key_secret"), "--curve-clients", str(keys / "clients"))
    try:
        from igi_sdk.client import curve_keys

        good = Client(f"tcp://127.0.0.1:{port}", timeout=20,
                      curve=curve_keys(keys / "game.key_secret", keys / "server.key"))
        assert good.hello()["protocol"] == 1
        good.close()
        import zmq.auth

        _stranger_pub, stranger_sec = zmq.auth.create_certificates(str(tmp_path), "stranger")
        bad = Client(f"tcp://127.0.0.1:{port}", timeout=3,
                     curve=curve_keys(stranger_sec, keys / "server.key"))
        with pytest.raises(SidecarUnavailable):
            bad.hello()
        bad.close()
        plain = Client(f"tcp://127.0.0.1:{port}", timeout=3)
        with pytest.raises(SidecarUnavailable):
            plain.hello()
        plain.close()
    finally:
        stop(proc)


def test_loopback_detection() -> None:
    assert is_loopback("tcp://127.0.0.1:5599") and is_loopback("tcp://[::1]:1")
    assert is_loopback("ipc:///tmp/x") and is_loopback("tcp://localhost:1")
    assert not is_loopback("tcp://0.0.0.0:1") and not is_loopback("tcp://192.168.1.4:1")


def test_async_client(sidecar) -> None:
    import asyncio

    from igi_sdk.client import AsyncClient

    async def main() -> str:
        c = AsyncClient(sidecar[0], timeout=60)
        sid = (await c.request("open_session", {"sampling": GREEDY}))["session"]
        text = "".join([p async for p in c.chat(sid, "Hello!", max_tokens=6)])
        await c.request("close_session", {"session": sid})
        c.close()
        return text

    assert asyncio.run(main())


def test_thread_cancel_while_iterating(client) -> None:
    sid = client.open_session("x", sampling={"seed": 9})
    stream = client.chat(sid, "Tell me a long story.", max_tokens=400)
    it = iter(stream)
    next(it)
    t = threading.Thread(target=stream.cancel)
    t.start()
    for _ in it:
        pass
    t.join()
    assert stream.done["finish_reason"] == "cancelled"
    client.close_session(sid)


def test_a_thread_waiting_for_a_reply_does_not_hold_up_another_threads_request(sidecar) -> None:
    # the HTTP face shares one client between requests: a request waiting for a long reply
    # must not make another thread's request wait for the socket (a reader that polls while
    # holding the client's lock made each request of another thread wait up to its poll slice,
    # and an unfair lock let it wait several)
    endpoint, _ = sidecar
    c = Client(endpoint, timeout=30)
    try:
        c.hello()

        def ping_median(n: int = 40) -> float:
            took = []
            for _ in range(n):
                t0 = time.perf_counter()
                c.request("ping")
                took.append(time.perf_counter() - t0)
            return sorted(took)[n // 2]

        ping_median(10)  # warm
        alone = ping_median()
        waiting = threading.Event()
        done = threading.Event()

        def wait_for_a_reply_that_is_slow() -> None:  # an id nobody sent: no reply comes
            waiting.set()
            while not done.is_set():
                with pytest.raises(BridgeError):
                    c.next_event(10**9, timeout=0.3)

        t = threading.Thread(target=wait_for_a_reply_that_is_slow)
        t.start()
        waiting.wait(5)
        time.sleep(0.05)
        beside = ping_median()
        done.set()
        t.join(10)
        print(f"measured: ping median {alone * 1e3:.2f} ms alone, {beside * 1e3:.2f} ms while "
              "another thread waits for a reply")
        assert beside < 4 * alone + 0.002, (alone, beside)
    finally:
        c.close()
