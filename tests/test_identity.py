"""Sidecar identity, against the real sidecar (a child process): ``serve --endpoint
tcp://127.0.0.1:0`` takes a free port and reports it (one stdout line, ``--endpoint-file``),
and ``--instance`` is echoed by ``hello`` beside the model, so a launcher refuses any other
sidecar that answers there."""

from __future__ import annotations

import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from igi_sdk.cli import ENDPOINT_LINE
from igi_sdk.client import Client, WrongSidecar
from igi_sdk.wire import protocol as P
from tests.sidecars import stop

INSTANCE = "mygame-4242-1.a_b"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama) -> Path:
    d = tmp_path_factory.mktemp("identity")
    shutil.copy(tiny_llama, d / "tiny.gguf")
    return d


def _serve(model_dir: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", "tcp://127.0.0.1:0",
           "--model-dir", str(model_dir), "--ctx", "512", "--threads", "1", "--no-arbiter",
           *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _endpoint_line(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no endpoint line on stdout"
    line = proc.stdout.readline()
    assert line.endswith("\n"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return line


def test_port_0_is_reported_on_stdout_and_in_the_endpoint_file(model_dir, tmp_path) -> None:
    out = tmp_path / "run" / "endpoint.txt"
    out.parent.mkdir()
    proc = _serve(model_dir, "--model", "tiny.gguf", "--instance", INSTANCE,
                  "--endpoint-file", str(out))
    other = _serve(model_dir)  # a developer's own sidecar beside it: no model, no instance
    try:
        line = _endpoint_line(proc)
        m = re.fullmatch(re.escape(ENDPOINT_LINE) + r"(tcp://127\.0\.0\.1:(\d+))\n", line)
        assert m and int(m.group(2)) > 0, line
        endpoint = m.group(1)
        assert out.read_text() == endpoint + "\n"
        assert [p.name for p in out.parent.iterdir()] == ["endpoint.txt"]  # no temp file left
        # the launcher's client: its sidecar, its model
        mine = Client(endpoint, timeout=60, instance=INSTANCE, model="tiny.gguf")
        hello = mine.hello()
        assert (hello["instance"], hello["model"]) == (INSTANCE, "tiny.gguf")
        assert "instance" in hello["features"]
        # a launcher of another instance (or expecting another model) refuses it
        for expect in ({"instance": "someone-else"}, {"model": "other.gguf"}):
            stranger = Client(endpoint, timeout=60, **expect)
            with pytest.raises(WrongSidecar) as e:
                stranger.hello()
            assert e.value.code == "wrong_sidecar" and not e.value.retryable
            stranger.close()
        # a 1.1 client knows no instance: the extra field changes nothing for it
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        s.send(P.encode(1, "hello", {"protocol": 1, "minor": 1}))
        assert s.poll(30_000)
        rid, rtype, body = P.decode_reply(s.recv())
        assert (rid, rtype, body["instance"], body["lease_s"]) == (1, "ok", INSTANCE, 15.0)
        s.close(0)
        # the other sidecar took another free port and answers without an instance
        other_line = _endpoint_line(other)
        other_endpoint = other_line.removeprefix(ENDPOINT_LINE).strip()
        assert other_endpoint.startswith("tcp://127.0.0.1:") and other_endpoint != endpoint
        with pytest.raises(WrongSidecar):
            Client(other_endpoint, timeout=60, instance=INSTANCE).hello()
        plain = Client(other_endpoint, timeout=60)
        assert plain.hello()["instance"] is None
        plain.close()
        mine.shutdown()
        mine.close()
        assert proc.wait(30) == 0
        assert not out.exists()  # a file naming a sidecar that is gone would mislead
    finally:
        stop(proc)
        stop(other)


def test_a_bad_instance_id_is_refused_before_listening(model_dir) -> None:
    for bad in ("", "has space", "x" * 65, "semi;colon"):
        r = subprocess.run([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
                            "tcp://127.0.0.1:0", "--model-dir", str(model_dir), "--instance",
                            bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--instance" in r.stderr, (bad, r.stderr)
        assert r.stdout == ""  # nothing bound, nothing reported


def test_the_asyncio_client_refuses_another_instance_too(tmp_path) -> None:
    import asyncio
    import threading

    from igi_sdk.client import AsyncClient
    from igi_sdk.serving.server import Server, ServerConfig
    from tests.test_server_caps import _Stalled

    srv = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'a.sock'}", model_dir=tmp_path,
                              instance=INSTANCE), _Stalled())
    srv.service.model_name = _Stalled.model_name
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()

    async def main() -> None:
        mine = AsyncClient(srv.bound, instance=INSTANCE, model=_Stalled.model_name)
        assert (await mine.request("ping"))["t"] > 0
        mine.close()
        other = AsyncClient(srv.bound, instance="someone-else")
        with pytest.raises(WrongSidecar):
            await other.request("ping")
        other.close()

    try:
        asyncio.run(main())
    finally:
        srv.stopping.set()
        t.join(5)
