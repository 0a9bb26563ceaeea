"""What an image may cost the sidecar: decoded by Pillow in a worker process with its scans,
pixels, time and memory capped, off the engine thread, cancellable, and scaled to an image-token
cap. The hostile files are made here (a progressive JPEG whose cheapest scan repeats; a PNG
whose IDAT inflates far past its IHDR size), never stored."""

from __future__ import annotations

import llama_cpp  # noqa: F401 - before numpy: with the CUDA build, numpy first crashes loading

# isort: split
import io
import os
import re
import shutil
import signal
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from igi_sdk.client import BridgeError, Client
from igi_sdk.errors import GenerationCancelled, InvalidImageError, VisionUnavailableError
from igi_sdk.events import ReplyDone, ReplyText
from igi_sdk.model.synthetic_vlm import VLMFiles, write_synthetic_vlm
from igi_sdk.runtime.image_decode import (
    Decoded,
    DecodeLimits,
    ImageBudget,
    ImageDecoder,
    check_encoded,
    fit_pixels,
    image_token_cap,
    jpeg_scans,
)
from igi_sdk.wire import protocol as P
from tests.images import card, png

WIRE_GREEDY = {"temperature": 0.0, "repeat_penalty": 1.0}
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


# --- hostile files -------------------------------------------------------------------------------


def _jpeg(width: int, height: int, *, progressive: bool = True, quality: int = 75,
          flat: bool = False) -> bytes:
    """A smooth picture (so that large sizes stay small on the wire), or a flat grey one."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (height // 64 + 1, width // 64 + 1, 3), dtype=np.uint8)
    if flat:
        small[:] = 128
    im = Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, "JPEG", progressive=progressive, quality=quality)
    return buf.getvalue()


def scan_bomb(width: int, height: int, repeat: int) -> bytes:
    """A flat progressive JPEG whose smallest refinement scan (an AC band, successive
    approximation: some 50 bytes) is repeated ``repeat`` more times before its end. Legal to
    decoders, and every scan is one more pass over every block of the image."""
    data = _jpeg(width, height, flat=True)
    scans, i = [], 2
    while data[i + 1] != 0xD9:
        start, marker = i, data[i + 1]
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xDA:
            n = data[start + 4]
            ss, ah = data[start + 5 + 2 * n], data[start + 7 + 2 * n] >> 4
            found = _NEXT_MARKER.search(data, i)
            assert found is not None
            i = found.start()
            if ss > 0 and ah > 0:
                scans.append(data[start:i])
    return data[:-2] + min(scans, key=len) * repeat + data[-2:]


def png_bomb(width: int, height: int, inflated_mib: int) -> bytes:
    """An RGB PNG whose IDAT inflates to ``inflated_mib`` MiB of zeros (rows of a black image,
    then far more): about 1 KB on the wire per MiB. Built from one full-flushed deflate block
    repeated, so that making it costs nothing."""
    block = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)  # the same bytes every time now
    adler = ((inflated_mib << 20) % 65521) << 16 | 1  # Adler-32 of that many zeros
    idat = (b"\x78\xda" + first + again * (inflated_mib - 1) + c.flush()
            + struct.pack(">I", adler))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def test_the_bomb_makers_make_what_they_say() -> None:
    bomb = png_bomb(64, 32, 8)
    assert len(zlib.decompress(bomb[33 + 8 : -12 - 4])) == 8 << 20  # a valid zlib stream
    with Image.open(io.BytesIO(bomb)) as im:
        im.load()
        assert im.size == (64, 32)
    assert jpeg_scans(_jpeg(256, 128)) == 10  # libjpeg's default progression
    assert jpeg_scans(_jpeg(256, 128, progressive=False)) == 1
    assert jpeg_scans(scan_bomb(256, 128, 500)) == 510


# --- limits before decoding ----------------------------------------------------------------------


def test_too_many_scans_are_refused_before_decoding() -> None:
    bomb = scan_bomb(8192, 4096, 20_000)
    t0 = time.perf_counter()
    with pytest.raises(InvalidImageError, match="more than 64 scans"):
        check_encoded(bomb)
    walk = time.perf_counter() - t0
    plain = _jpeg(8192, 4096)
    assert check_encoded(plain) == (8192, 4096)
    t0 = time.perf_counter()
    with Image.open(io.BytesIO(plain)) as im:
        im.load()
    decode = time.perf_counter() - t0
    # walking the markers, not decoding: a small fraction of one decode of the plain image
    # (measured 0.25 ms against 0.3 s)
    assert walk < decode / 20, (walk, decode)
    with pytest.raises(InvalidImageError, match="larger than"):
        check_encoded(png(card(0, 8, 8))[:16] + struct.pack(">II", 9000, 9000) + bytes(16))


def test_the_token_cap_keeps_the_aspect_in_whole_tiles() -> None:
    for (w, h), cap in [((8192, 4096), 256), ((1792, 1792), 64), ((8192, 30), 100),
                        ((30, 8192), 100), ((1000, 999), 1280)]:
        nw, nh = ImageBudget(cap, 28).fit(w, h)
        assert nw % 28 == 0 and nh % 28 == 0 and (nw // 28) * (nh // 28) <= cap
        assert nw <= w + 28 and nh <= h + 28
        if min(w, h) > 28 * 4:  # aspect kept to within a tile
            assert abs(nw / nh - w / h) <= 28 / min(nh, nw) * (w / h) * 2
    assert ImageBudget(64, 28).fit(64, 64) == (64, 64)  # what fits is left alone
    assert ImageBudget(0, 28).fit(9000, 9000) == (9000, 9000)  # no cap
    assert image_token_cap(256, 4096) == 256  # a session's guaranteed cells
    assert image_token_cap(32, 4096) == 64 and image_token_cap(100_000, 4096) == 4096


def test_raw_pixels_are_checked_and_scaled_to_the_cap() -> None:
    rgba = np.dstack([card(0, 1000, 500), np.full((500, 1000), 7, np.uint8)])
    out = fit_pixels(Decoded(rgba.tobytes(), 1000, 500, 4), ImageBudget(64, 28))
    assert (out.channels, out.width * out.height * 3) == (3, len(out.pixels))
    assert (out.width // 28) * (out.height // 28) <= 64 and out.width > out.height
    small = Decoded(card(0, 64, 64).tobytes(), 64, 64)
    assert fit_pixels(small, ImageBudget(64, 28)) is small
    with pytest.raises(InvalidImageError, match="needs"):
        fit_pixels(Decoded(bytes(10), 64, 64), ImageBudget(64, 28))


# --- the worker ----------------------------------------------------------------------------------


@pytest.fixture
def slow_decoder() -> Iterator[ImageDecoder]:
    """A decoder that lets scan bombs through to the worker (to time and cancel real work)."""
    d = ImageDecoder(DecodeLimits(max_scans=10**6, time_s=0.6))
    yield d
    d.close()


def test_a_decode_over_the_time_cap_is_killed_and_the_worker_restarted(
        slow_decoder: ImageDecoder) -> None:
    slow_decoder.decode(png(card(0, 64, 48)))  # a warm worker: its start is not timed below
    cap = slow_decoder.limits.time_s
    bomb = scan_bomb(8192, 4096, 2_000)  # ~14 s of libjpeg: 23 times the cap
    (worker,) = slow_decoder._idle
    proc = psutil.Process(worker.proc.pid)
    cpu_start = sum(proc.cpu_times()[:2])
    last_read: list[float] = []

    def read_cpu_until_it_ends() -> None:  # what the worker had used when it was killed
        try:
            while True:
                last_read.append(sum(proc.cpu_times()[:2]) - cpu_start)
                time.sleep(0.005)
        except psutil.Error:
            pass

    reader = threading.Thread(target=read_cpu_until_it_ends)
    reader.start()
    t0 = time.perf_counter()
    with pytest.raises(InvalidImageError, match=r"more than 0\.6 s of CPU time"):
        slow_decoder.decode(bomb)
    took = time.perf_counter() - t0
    reader.join(10)
    # ended by the cap on the worker's CPU time, not before it and not long after it (the cap
    # reads it every 20 ms; measured 0.01 s over it), whatever the wall time (a busy host
    # stretches it: the worker runs below the game's priority)
    assert took >= cap and 0.9 * cap <= max(last_read) < 1.5 * cap, (took, max(last_read))
    assert slow_decoder.started == 2  # a fresh worker, already starting
    out = slow_decoder.decode(png(card(0, 64, 48)))
    assert (out.width, out.height) == (64, 48)
    assert slow_decoder.started == 2


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX job control")
def test_a_worker_that_gets_no_cpu_for_longer_than_the_cap_still_decodes(
        slow_decoder: ImageDecoder) -> None:
    # the worker runs below the game's priority: a game that keeps every core busy leaves it
    # no CPU for a while (here: stopped for twice the cap). The image costs what it costs; a
    # wall-time cap refused it
    small = png(card(0, 64, 48))
    slow_decoder.decode(small)  # a warm worker, the one the next decode takes
    (worker,) = slow_decoder._idle
    stopped_s = 2 * slow_decoder.limits.time_s
    os.kill(worker.proc.pid, signal.SIGSTOP)
    threading.Timer(stopped_s, os.kill, (worker.proc.pid, signal.SIGCONT)).start()
    t0 = time.perf_counter()
    out = slow_decoder.decode(small)
    assert time.perf_counter() - t0 >= stopped_s
    assert (out.width, out.height) == (64, 48)
    assert slow_decoder.started == 1  # the same worker: nothing was killed


def test_cancel_kills_a_decode_at_once() -> None:
    from igi_sdk.runtime.image_decode import DecodeCancel

    # the default 5 s cap: a decode the cancel does not end runs 25 times as long as the wait
    d = ImageDecoder(DecodeLimits(max_scans=10**6))
    try:
        d.decode(png(card(0, 64, 48)))  # a warm worker
        bomb, cancel = scan_bomb(8192, 4096, 2_000), DecodeCancel()
        cancelled: list[float] = []

        def cancel_now() -> None:
            cancelled.append(time.perf_counter())
            cancel.cancel()

        threading.Timer(0.2, cancel_now).start()
        with pytest.raises(GenerationCancelled):
            d.decode(bomb, cancel=cancel)
        latency = time.perf_counter() - cancelled[0]
        # the cancel's latency is a small share of the decode it cut short (measured ~0.01 s)
        assert latency < d.limits.time_s / 10, latency
    finally:
        d.close()


def test_the_worker_memory_cap_refuses_without_harm() -> None:
    if not hasattr(__import__("os"), "getuid"):
        pytest.skip("the address-space cap is POSIX only")
    d = ImageDecoder(DecodeLimits(memory_bytes=128 << 20))
    try:
        big = _jpeg(8192, 4096, progressive=False)  # 96 MiB of RGB, then its copy
        with pytest.raises(InvalidImageError, match="memory"):
            d.decode(big)  # no budget: decoded at full size
        out = d.decode(big, ImageBudget(256, 28))  # scaled while decoding: fits
        assert (out.width // 28) * (out.height // 28) <= 256
    finally:
        d.close()


def test_png_bomb_inflates_only_the_image_rows() -> None:
    d = ImageDecoder()
    try:
        plain, bomb = png(card(0, 1024, 1024)), png_bomb(1024, 1024, 1024)  # IDAT: 1 GiB of 0s
        d.decode(plain)  # a warm worker

        def best_of_3(data: bytes) -> tuple[float, Decoded]:
            timed = []
            for _ in range(3):
                t0 = time.perf_counter()
                out = d.decode(data)
                timed.append(time.perf_counter() - t0)
            return min(timed), out

        plain_s, _ = best_of_3(plain)
        bomb_s, out = best_of_3(bomb)
        assert (out.width, out.height) == (1024, 1024) and not any(out.pixels[:4096])
        # the rows of the image are inflated, not the 1 GiB: about what a plain image of that
        # size costs (measured 1.6x; inflating it all takes 25x or more)
        assert bomb_s < 8 * plain_s, (bomb_s, plain_s)
        rss = max(psutil.Process(w.proc.pid).memory_info().rss for w in d._idle)
        assert rss < 200 << 20
    finally:
        d.close()


def test_a_text_chunk_bomb_is_refused_by_pillows_limit() -> None:
    """A zTXt chunk inflating to 64 MiB (metadata nobody reads): Pillow's text limits."""
    plain = png(card(0, 64, 64))
    body = b"Comment\0\0" + zlib.compress(bytes(64 << 20), 9)
    ztxt = (struct.pack(">I", len(body)) + b"zTXt" + body
            + struct.pack(">I", zlib.crc32(b"zTXt" + body)))
    bomb = plain[:33] + ztxt + plain[33:]  # after IHDR
    d = ImageDecoder()
    try:
        with pytest.raises(InvalidImageError, match="corrupt"):
            d.decode(bomb)
        assert d.decode(plain).width == 64
    finally:
        d.close()


def test_a_decoder_that_cannot_start_says_so(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    from igi_sdk.runtime import image_decode

    monkeypatch.setattr(image_decode, "_WORKER", tmp_path / "missing.py")
    d = ImageDecoder()
    try:
        with pytest.raises(VisionUnavailableError, match="did not start"):
            d.decode(png(card(0, 64, 64)))
    finally:
        d.close()


# --- over the real sidecar -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> VLMFiles:
    return write_synthetic_vlm(tmp_path_factory.mktemp("vlm"), "tiny")


@pytest.fixture(scope="module")
def sidecar(vlm: VLMFiles, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, int]]:
    from tests.sidecars import start_sidecar, stop

    d = tmp_path_factory.mktemp("vlm-models")
    shutil.copy(vlm.model, d / "tiny-vl.gguf")
    shutil.copy(vlm.mmproj, d / "mmproj-tiny-vl.gguf")
    ep = f"ipc://{tmp_path_factory.mktemp('ipc-img') / 's.sock'}"
    # 2048 cells for 4 sessions: each is guaranteed 256, so an image takes at most 256 tokens
    proc = start_sidecar(d, ep, "--model", "tiny-vl.gguf", "--mmproj", "mmproj-tiny-vl.gguf",
                         "--ctx", "2048", "--max-sessions", "4", "--prefill-chunk", "48",
                         "--no-arbiter")
    try:  # a sidecar that never got ready is stopped too, with what it said
        probe = Client(ep, timeout=60)
        try:
            probe.wait_ready(60)
        except Exception as e:  # re-raised with the sidecar's stderr
            stop(proc)
            raise AssertionError(f"no sidecar: {e}\n{proc.stderr.read() if proc.stderr else ''}"
                                 ) from e
        finally:
            probe.close()
        yield ep, proc.pid
    finally:
        stop(proc)


def _tokens(c: Client, sid: str) -> int:
    return next(s["tokens"] for s in c.request("list_sessions")["sessions"]
                if s["session"] == sid)


def test_a_scan_bomb_is_refused_fast_and_never_holds_the_engine(
        sidecar: tuple[str, int]) -> None:
    ep, _ = sidecar
    attacker, npc = Client(ep, timeout=60), Client(ep, timeout=60)
    try:
        bad = attacker.open_session("You are a mirror.", sampling=WIRE_GREEDY)
        good = npc.open_session("You are Brom.", sampling=WIRE_GREEDY)
        bomb = scan_bomb(8192, 4096, 2_000)  # 240 KB; 53 s in stb_image, 14 s in libjpeg
        t0 = time.perf_counter()  # the yardstick: the NPC's line alone
        npc.chat(good, "Hello there.", max_tokens=8, ignore_eos=True).result()
        alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        stream = attacker.chat(bad, "What is this?", images=[bomb], max_tokens=4)
        # another NPC's line meanwhile: the engine is free
        done = npc.chat(good, "Hello there.", max_tokens=8, ignore_eos=True).result()
        assert done["usage"]["completion_tokens"] == 8
        beside = time.perf_counter() - t0
        with pytest.raises(BridgeError) as e:
            stream.result()
        # refused by the scan count, before any decoding
        assert e.value.code == "invalid_image" and "scans" in str(e.value)
        refused = time.perf_counter() - t0
        # beside the bomb, the line costs about what it does alone, and the refusal no more than
        # a few such lines: decoding it on the engine would add 14 s (hundreds of lines)
        assert max(beside, refused) < 10 * alone, (beside, refused, alone)
        assert _tokens(attacker, bad) == 0
    finally:
        attacker.close()
        npc.close()


def test_a_png_bomb_does_not_grow_the_sidecar(sidecar: tuple[str, int]) -> None:
    ep, pid = sidecar
    side = psutil.Process(pid)
    c = Client(ep, timeout=60)
    try:
        sid = c.open_session("You are Brom.", sampling=WIRE_GREEDY)
        c.chat(sid, "Warm up.", images=[png(card(0, 64, 64))], max_tokens=2).result()
        before = side.memory_info().rss
        bomb = png_bomb(1024, 1024, 1024)  # IHDR: 3 MiB of pixels; IDAT: 1 GiB of zeros
        assert len(bomb) < 2 << 20
        done = c.chat(sid, "And this?", images=[bomb], max_tokens=2).result()
        assert done["usage"]["completion_tokens"] >= 1  # a black image, read as such
        grown = side.memory_info().rss - before
        children = sum(p.memory_info().rss for p in side.children(recursive=True))
        assert grown < 64 << 20, f"the sidecar grew {grown >> 20} MiB"
        assert children < 256 << 20
    finally:
        c.close()


def test_a_huge_image_is_scaled_to_the_cap_and_the_reply_works(
        sidecar: tuple[str, int]) -> None:
    ep, _ = sidecar
    c = Client(ep, timeout=60)
    try:
        sid = c.open_session("You are Brom.", sampling=WIRE_GREEDY)
        text_only = c.open_session("You are Brom.", sampling=WIRE_GREEDY)
        c.chat(text_only, "What is this?", max_tokens=4, ignore_eos=True).result()
        base = _tokens(c, text_only)
        # an 8K screenshot took 4 072 of 4 096 cells; here at most 256 (+2 delimiters)
        done = c.chat(sid, "What is this?", images=[_jpeg(8192, 4096)], max_tokens=4,
                      ignore_eos=True).result()
        assert done["usage"]["completion_tokens"] == 4
        assert 0 < _tokens(c, sid) - base <= 256 + 2
        # raw pixels too (a 1792² frame: 4 096 tokens uncapped)
        raw = {"pixels": card(1, 1792, 1792).tobytes(), "width": 1792, "height": 1792}
        before = _tokens(c, sid)
        c.chat(sid, "And this?", images=[raw], max_tokens=4, ignore_eos=True).result()
        assert _tokens(c, sid) - before <= 256 + 2 + 40
    finally:
        c.close()


# --- cancel while decoding (the sidecar's model side, in this process) ---------------------------


def test_cancel_during_a_slow_decode_ends_the_chat_at_once(vlm: VLMFiles) -> None:
    from igi_sdk.sidecar.host import HostConfig, ModelHost

    host = ModelHost(HostConfig(n_threads=2, arbiter=False))
    host.load_model(vlm.model, P.LoadModel(path=vlm.model.name, n_ctx=1024, max_sessions=2),
                    mmproj=vlm.mmproj)
    # a decoder that lets the bomb through to the worker, to have a decode worth cancelling
    host._decoder.close()
    host._decoder = ImageDecoder(DecodeLimits(max_scans=10**6))
    host._decoder.warm()
    try:
        sid = host.open_session(P.OpenSession(system_prompt="You are Brom.")).result(30)
        events: list[tuple[object, float]] = []
        ended = threading.Event()

        def listener(event: object) -> None:
            events.append((event, time.perf_counter()))
            if not isinstance(event, ReplyText):
                ended.set()

        chat = P.Chat(session=sid, text="What is this?", max_tokens=4,
                      images=[P.ChatImage(data=scan_bomb(8192, 4096, 2_000))])
        handle = host.chat(chat, listener).result(timeout=1.0)  # at once: decoding elsewhere
        time.sleep(0.3)
        t0 = time.perf_counter()
        handle.cancel()
        cap = host._decoder.limits.time_s  # what would end this decode if the cancel did not
        assert ended.wait(cap)
        last, at = events[-1]
        assert isinstance(last, ReplyDone) and last.result.finish_reason == "cancelled"
        # the cancel's latency is a small share of the decode it cut short (measured ~0.01 s)
        assert at - t0 < cap / 10, at - t0
        assert host.engine is not None and host.engine.session_info()[sid]["tokens"] == 0
        # the worker was killed and replaced (by the decoding thread, just after): the next
        # image is decoded as usual
        deadline = time.monotonic() + 2
        while host._decoder.started < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert host._decoder.started == 2
        ended.clear()
        chat = P.Chat(session=sid, text="And this?", max_tokens=2,
                      images=[P.ChatImage(data=png(card(0, 64, 64)))])
        host.chat(chat, listener).result(timeout=1.0)
        assert ended.wait(30)
        last = events[-1][0]
        assert isinstance(last, ReplyDone) and last.result.completion_tokens == 2
    finally:
        host.close()

