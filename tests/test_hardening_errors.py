"""Error hygiene: refusals carry their own code (never "internal"), and no answer tells a client
where the sidecar's files live; a 1.0 client is under a lease too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from igi_sdk.client import BridgeError, Client
from igi_sdk.serving.server import Server, ServerConfig
from igi_sdk.wire import protocol as P
from tests.sidecars import start_sidecar, stop
from tests.test_server_caps import _client, _reply, _Stalled


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, tiny_llama):
    d = tmp_path_factory.mktemp("errs")
    shutil.copy(tiny_llama, d / "tiny.gguf")
    os.symlink(d / "loop-b.gguf", d / "loop-a.gguf")  # a symlink loop
    os.symlink(d / "loop-a.gguf", d / "loop-b.gguf")
    (d / "broken.gguf").write_bytes(b"GGUF" + bytes(64))  # a GGUF header and nothing else
    endpoint = f"ipc://{tmp_path_factory.mktemp('errs-ipc') / 's.sock'}"
    proc = start_sidecar(d, endpoint, "--model", "tiny.gguf", "--no-arbiter")
    Client(endpoint, timeout=60).wait_ready(60)
    yield endpoint, d
    stop(proc)


def test_a_symlink_loop_is_a_forbidden_path_not_an_internal_error(sidecar) -> None:
    endpoint, _ = sidecar
    c = Client(endpoint, timeout=30)
    try:
        with pytest.raises(BridgeError) as e:
            c.load_model("loop-a.gguf")
        assert e.value.code == "forbidden_path", e.value
    finally:
        c.close()


def test_a_load_error_names_no_server_path(sidecar) -> None:
    endpoint, model_dir = sidecar
    c = Client(endpoint, timeout=60)
    try:
        with pytest.raises(BridgeError) as e:
            c.load_model("broken.gguf")
        assert e.value.code not in ("internal", "forbidden_path"), e.value
        assert "broken.gguf" in str(e.value)
        assert str(model_dir) not in str(e.value), e.value
    finally:
        c.close()


def test_cli_refusals_carry_their_code(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "igi_sdk.cli", "plan", "nothing.gguf", "--vram",
                        "four gigs"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "[internal]" not in r.stderr, r.stderr
    env = {**os.environ, "IGI_SDK_TOKEN": "short"}
    r = subprocess.run([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
                        f"ipc://{tmp_path}/s.sock"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 2 and "[invalid_argument]" in r.stderr and "launch token" in r.stderr


def test_a_silent_1_0_client_is_forgotten_after_the_longest_lease(tmp_path, monkeypatch) -> None:
    """Was: a 1.0 client holding a session was never forgotten, so its slots leaked forever."""
    monkeypatch.setattr(P, "MAX_LEASE_S", 1.0)
    srv = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'l.sock'}", model_dir=tmp_path,
                              heartbeat_s=0.2), _Stalled())
    srv.service.model_name = "stalled.gguf"
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        legacy = _client(srv.bound, minor=0)
        legacy.send(P.encode(2, "open_session", {}))
        assert _reply(legacy, 2)[1] == "ok"
        watcher = _client(srv.bound)
        deadline = time.monotonic() + 10
        while True:
            watcher.send(P.encode(3, "stats", {}))
            if _reply(watcher, 3)[2]["orphaned_sessions"] == 1:
                break
            assert time.monotonic() < deadline, "the 1.0 client's session was never orphaned"
            time.sleep(0.2)
        legacy.send(P.encode(4, "list_sessions", {}))
        assert _reply(legacy, 4)[2]["code"] == "hello_required"
    finally:
        srv.stopping.set()
        t.join(5)
