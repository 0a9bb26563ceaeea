"""The sidecar against a hostile or careless client: strangers cannot bind its lifetime, pacing
does not outlive the client that asked for it, duplicate ids do not end a live stream, bad
endpoints and paths get clear errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import zmq

from igi_sdk.arbiter.pacing import ClientPacing
from igi_sdk.client import Client
from igi_sdk.wire import protocol as P
from tests.sidecars import start_sidecar, stop


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_llama):
    d = tmp_path_factory.mktemp("hard")
    shutil.copy(tiny_llama, d / "tiny.gguf")
    return d


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _raw(endpoint: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _raw_session(endpoint: str) -> tuple[zmq.Socket, str]:
    """A raw DEALER that said hello (ids 1, 2) to a ready sidecar, and the session it opened."""
    Client(endpoint, timeout=60).wait_ready(60)
    s = _raw(endpoint)
    s.send(P.encode(1, "hello", {"protocol": P.PROTOCOL_VERSION}))
    _next(s)
    s.send(P.encode(2, "open_session", {"system_prompt": "npc"}))
    return s, _next(s)[2]["session"]


def _next(s: zmq.Socket, timeout_ms: int = 10_000) -> tuple[int, str, dict]:
    while True:
        assert s.poll(timeout_ms), "no reply"
        rid, rtype, body = P.decode_reply(s.recv())
        if rtype != "heartbeat":
            return rid, rtype, body


def test_a_strangers_game_pid_does_not_bind_the_sidecar(tiny_dir, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 'pid.sock'}"
    proc = start_sidecar(tiny_dir, endpoint, "--model", "tiny.gguf")
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        Client(endpoint, timeout=60).wait_ready(60)
        for pid in (_dead_pid(), stranger.pid):  # dead already; alive but not the launcher
            c = Client(endpoint, timeout=10, game_pid=pid)
            c.hello()
            c.close()
        stranger.kill()
        stranger.wait()
        time.sleep(1.0)  # the PID watch polls every 0.25 s
        assert proc.poll() is None
        assert Client(endpoint, timeout=10).request("ping")
    finally:
        stranger.kill()
        stop(proc)


def test_a_dead_game_pid_on_the_command_line_is_refused(tiny_dir, tmp_path) -> None:
    proc = start_sidecar(tiny_dir, f"ipc://{tmp_path / 'd.sock'}", "--model", "tiny.gguf",
                         "--game-pid", str(_dead_pid()))
    try:
        rc = proc.wait(60)
        assert rc != 0 and "not running" in proc.stderr.read()
    finally:
        stop(proc)


def test_pacing_lapses_when_its_client_leaves(tiny_dir, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 'pace.sock'}"
    proc = start_sidecar(tiny_dir, endpoint, "--model", "tiny.gguf", "--no-arbiter")
    try:
        npc = Client(endpoint, timeout=60)
        npc.wait_ready(60)
        sid = npc.open_session("npc", sampling={"temperature": 0.0})

        def turn_s() -> float:
            t0 = time.monotonic()
            npc.chat(sid, "Talk.", max_tokens=30).result()
            return time.monotonic() - t0

        base = min(turn_s() for _ in range(2))
        game = Client(endpoint, timeout=10)
        for i in range(8):  # slow frames: the pause between decode steps backs off to 100 ms
            game.frame(i, 40.0, target_frame_time_ms=16.7)
        assert npc.stats()["pacing_delay_s"] > 0.05
        game.close()  # the game leaves without a word
        time.sleep(1.5)
        assert npc.stats()["pacing_delay_s"] == 0.0
        assert turn_s() < max(3 * base, base + 0.5)
    finally:
        stop(proc)


def test_pacing_is_the_largest_of_the_clients_still_sending() -> None:
    t = [0.0]
    pacing = ClientPacing(hold_s=1.0, clock=lambda: t[0])
    for _ in range(4):
        pacing.update("a", 40.0, 16.7)
    slow = pacing.delay_s()
    assert slow > 0
    pacing.update("b", 5.0, 16.7)  # another client with room to spare does not cancel it
    assert pacing.delay_s() == slow
    t[0] = 1.5  # "a" went quiet
    pacing.update("b", 5.0, 16.7)
    assert pacing.delay_s() == 0.0


def test_a_duplicate_chat_id_does_not_end_the_live_stream(tiny_dir, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 'dup.sock'}"
    proc = start_sidecar(tiny_dir, endpoint, "--model", "tiny.gguf", "--no-arbiter")
    try:
        s, sid = _raw_session(endpoint)
        chat = {"session": sid, "text": "Tell me everything.", "max_tokens": 40}
        s.send(P.encode(7, "chat", chat))
        s.send(P.encode(7, "chat", chat))
        dup = None
        events: list[str] = []
        while True:
            rid, rtype, body = _next(s)
            if rid == 0:
                dup = (rtype, body["code"])
                continue
            assert rid == 7
            events.append(rtype)
            if rtype in ("done", "error"):
                break
        assert dup == ("error", "duplicate_id")
        assert events[-1] == "done" and events.count("done") == 1
        s.close(0)
    finally:
        stop(proc)


def test_bad_endpoints_and_paths_get_clear_errors(tiny_dir, tmp_path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = start_sidecar(tiny_dir, f"tcp://127.0.0.1:{port}", "--model", "tiny.gguf")
        assert proc.wait(60) != 0
        err = proc.stderr.read()
        assert "cannot listen" in err and "Traceback" not in err
    with socket.socket() as probe:  # a free port, on IPv6 loopback (the documented form)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"tcp://[::1]:{port}"
    proc = start_sidecar(tiny_dir, endpoint, "--model", "tiny.gguf")
    try:
        c = Client(endpoint, timeout=60)
        c.wait_ready(60)
        with pytest.raises(Exception) as e:  # a path component longer than NAME_MAX
            c.load_model("x" * 300 + ".gguf")
        assert getattr(e.value, "code", None) == "model_not_found"
        c.close()
    finally:
        stop(proc)


def test_long_llama_cpp_log_lines_are_clipped() -> None:
    from igi_sdk.runtime._native import _clip

    line = "x" * 1_000_000
    assert len(_clip(line)) < 3000
    assert _clip("short") == "short"


def test_hostile_schemas_get_invalid_grammar_and_the_sidecar_keeps_serving(tiny_dir,
                                                                            tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 'schema.sock'}"
    proc = start_sidecar(tiny_dir, endpoint, "--model", "tiny.gguf", "--no-arbiter")
    try:
        s, sid = _raw_session(endpoint)
        deep: dict = {"type": "string"}
        for _ in range(1_000):
            deep = {"type": "array", "items": deep}
        hostile = [({"type": "string", "maxLength": 20_000}, "invalid_grammar"),
                   ({"type": "string", "pattern": "^a{0,20000}$"}, "invalid_grammar"),
                   (deep, "invalid_body")]  # past the body's nesting bound: never parsed on
        for i, (schema, code) in enumerate(hostile, start=10):
            s.send(P.encode(i, "chat", {"session": sid, "text": "hi", "max_tokens": 2,
                                        "json_schema": schema}))
            rid, rtype, body = _next(s)
            assert (rid, rtype, body["code"]) == (i, "error", code), body
        s.send(P.encode(20, "chat", {"session": sid, "text": "hi", "max_tokens": 2}))
        while (reply := _next(s))[1] not in ("done", "error"):
            pass
        assert reply[:2] == (20, "done"), reply
        assert proc.poll() is None
        s.close(0)
    finally:
        stop(proc)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP/SIGCONT are POSIX")
def test_a_sidecar_stopped_longer_than_a_lease_forgets_nobody(tiny_dir, tmp_path) -> None:
    """The sidecar stopped (SIGSTOP: a debugger, a laptop asleep) for longer than a client's
    lease counts that time as its own silence, not the client's: a client that sent nothing
    while it was stopped (it had nothing to say) carries on without a new hello."""
    import signal

    endpoint = f"ipc://{tmp_path / 'stop.sock'}"
    proc = start_sidecar(tiny_dir, endpoint, "--model", "tiny.gguf", "--no-arbiter")
    try:
        Client(endpoint, timeout=60).wait_ready(60)
        s = _raw(endpoint)  # a plugin that sends no lease pings of its own
        s.send(P.encode(1, "hello", {"protocol": P.PROTOCOL_VERSION, "minor": P.PROTOCOL_MINOR,
                                     "lease_s": 3}))
        assert _next(s)[1] == "ok"
        s.send(P.encode(2, "open_session", {"system_prompt": "npc", "name": "npc"}))
        assert _next(s)[1] == "ok"
        proc.send_signal(signal.SIGSTOP)
        time.sleep(6.0)  # two leases
        proc.send_signal(signal.SIGCONT)
        time.sleep(1.5)  # the sidecar wakes and beats before the client speaks again
        s.send(P.encode(3, "list_sessions", {}))
        rid, rtype, body = _next(s)
        assert (rid, rtype) == (3, "ok"), body  # not hello_required
        assert [x["session"] for x in body["sessions"]] == ["npc"]
        s.close(0)
    finally:
        stop(proc)
