"""Saved sessions: atomic writes, typed disk errors, checked snapshots, and save names — on the
engine (synthetic tiny model) and over the wire (a real sidecar child process)."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from igi_sdk.errors import DiskFullError, InvalidStateError, SaveFailedError
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, snapshot
from igi_sdk.wire import protocol as P

SLOTS = 3
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
NPC = "You are Brom, the village blacksmith. Answer in one short sentence."
LINUX = sys.platform.startswith("linux")


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> Iterator[Engine]:
    with Engine(tiny_llama, Plan.all_cpu(),
                EngineConfig(n_ctx=8192, max_sessions=SLOTS, n_threads=2)) as eng:
        yield eng


@pytest.fixture
def session(engine: Engine) -> Iterator[str]:
    sid = engine.open_session(NPC, sampling=GREEDY)
    engine.chat(sid, "What do you sell?", max_tokens=8).result(timeout=60)
    yield sid
    leaked = [s for s in engine.sessions() if s != sid]
    for s in [sid, *leaked]:
        engine.close_session(s)
    assert not leaked, "the test left sessions open"


def _assert_no_leak(engine: Engine, expected: list[str]) -> None:
    """Only ``expected`` sessions are open, and every other slot can still be taken."""
    assert sorted(engine.sessions()) == sorted(expected)
    opened = [engine.open_session("probe") for _ in range(SLOTS - len(expected))]
    for sid in opened:
        engine.close_session(sid)


def _grow(engine: Engine, sid: str, line: str = "Tell me about your best sword.") -> None:
    engine.chat(sid, line, max_tokens=16).result(timeout=60)


@contextlib.contextmanager
def _fault(monkeypatch: pytest.MonkeyPatch, where: Path, err: int, *, on: str = "write",
           after: int = 4096) -> Iterator[None]:
    """Make file operations under ``where`` fail with ``err``: ``on="write"`` after ``after``
    bytes have been written (a disk that fills up mid-save), ``"fsync"`` at the flush (delayed
    allocation, network file systems), ``"open"`` when the file is created (read-only)."""
    real_write, real_fsync, real_open = os.write, os.fsync, os.open
    written = [0]

    def under(fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(str(where.resolve()))
        except OSError:
            return False

    def write(fd: int, data) -> int:
        if on == "write" and under(fd):
            room = after - written[0]
            if room <= 0:
                raise OSError(err, os.strerror(err))
            n = real_write(fd, bytes(memoryview(data)[:room]))
            written[0] += n
            return n
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        if on == "fsync" and under(fd):
            raise OSError(err, os.strerror(err))
        real_fsync(fd)

    def open_(path, flags, *args, **kw):
        if on == "open" and str(path).startswith(str(where)) and flags & os.O_CREAT:
            raise OSError(err, os.strerror(err), str(path))
        return real_open(path, flags, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(os, "write", write)
        m.setattr(os, "fsync", fsync)
        m.setattr(os, "open", open_)
        yield


# --- the format -------------------------------------------------------------------------------


def test_snapshot_format_round_trips(engine: Engine, session: str) -> None:
    snap = engine.snapshot(session)
    assert snap[:8] == b"IGISESS2"
    meta, kv = snapshot.unpack(snap)
    assert meta["tokens"] and len(kv) > 1000
    again = engine.restore(snap)
    meta2, kv2 = snapshot.unpack(engine.snapshot(again))
    assert meta2 == meta and len(kv2) == len(kv)  # the same conversation and KV cells
    engine.close_session(again)


def _variants(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """Damaged, truncated and foreign versions of a good save."""
    (n_head,) = struct.unpack_from("<Q", data, 8)
    kv_start, kv_end = 24 + n_head, len(data) - 4
    out = []
    for i in range(12):  # 8 random bytes of the KV state changed
        b = bytearray(data)
        for pos in rng.sample(range(kv_start, kv_end), 8):
            b[pos] ^= rng.randrange(1, 256)
        out.append((f"kv-bytes-{i}", bytes(b)))
    for i in range(6):  # one byte of the JSON header changed (still JSON, often)
        b = bytearray(data)
        pos = rng.randrange(24, kv_start)
        b[pos] = ord(rng.choice("0123456789,:[]{}\" "))
        if bytes(b) != data:
            out.append((f"header-byte-{i}", bytes(b)))
    b = bytearray(data)
    b[8] ^= 1  # the header length
    out.append(("header-length", bytes(b)))
    b = bytearray(data)
    b[-1] ^= 0x40  # the checksum itself
    out.append(("checksum", bytes(b)))
    out += [
        ("cut-after-header", data[:kv_start]),
        ("cut-after-header-kept-trailer", data[:kv_start] + data[-4:]),
        ("cut-in-kv", data[: (kv_start + kv_end) // 2]),
        ("cut-last-byte", data[:-1]),
        ("cut-in-prefix", data[:12]),
        ("empty", b""),
        ("trailing-bytes", data + b"\0" * 16),
        ("unknown-version", b"IGISESS9" + data[8:]),
        ("format-1", b"IGISESS1" + struct.pack("<Q", n_head) + data[24:kv_start]
         + data[kv_start:kv_end]),
        ("foreign-gguf", b"GGUF\x03\x00\x00\x00" + bytes(4096)),
        ("foreign-text", b"hello, I am not a save\n" * 100),
        ("random", rng.randbytes(len(data))),
    ]
    return out


def test_damaged_truncated_and_foreign_saves_are_refused_and_take_no_slot(
        engine: Engine, session: str, tmp_path: Path) -> None:
    path = tmp_path / "brom.igisession"
    engine.save_session(session, path)
    data = path.read_bytes()
    variants = _variants(data, random.Random(7))
    assert len(variants) > 3 * SLOTS  # more failed restores than there are slots
    for what, bad in variants:
        f = tmp_path / f"{what}.igisession"
        f.write_bytes(bad)
        with pytest.raises(InvalidStateError):
            engine.load_session(f)
        with pytest.raises(InvalidStateError):
            engine.restore(bad)
    _assert_no_leak(engine, [session])
    with pytest.raises(InvalidStateError, match="format 1"):
        engine.restore(dict(variants)["format-1"])
    with pytest.raises(InvalidStateError, match="unknown format"):
        engine.restore(dict(variants)["unknown-version"])
    restored = engine.load_session(path)  # the good one still restores
    engine.close_session(restored)


def test_a_whole_save_with_bad_fields_takes_no_slot(engine: Engine, session: str) -> None:
    """A file that passes its checksum (written by a buggy or hostile tool) is still checked
    field by field before a session slot is taken."""
    meta, kv = snapshot.unpack(engine.snapshot(session))
    bad_fields = [
        {"tokens": [10**9]}, {"tokens": [-1]}, {"tokens": "abc"}, {"pending": [1.5]},
        {"history": None}, {"messages": "hello"}, {"messages": [{"role": 1}]},
        {"committed_text": 3}, {"n_sampled": "7"}, {"n_sampled": -1}, {"priority": "x"},
        {"params": {"temperature": -3}}, {"params": []}, {"model": {"arch": "gpt9"}},
        {"tokens": list(range(20_000))},  # longer than the context
    ]
    for change in bad_fields * 2:
        with pytest.raises(InvalidStateError):
            engine.restore(snapshot.pack({**meta, **change}, kv))
    for key in ("messages", "tokens", "params", "n_sampled"):
        with pytest.raises(InvalidStateError):
            engine.restore(snapshot.pack({k: v for k, v in meta.items() if k != key}, kv))
    with pytest.raises(InvalidStateError):  # a conversation with no KV state at all
        engine.restore(snapshot.pack(meta, b""))
    with pytest.raises(InvalidStateError):  # KV bytes llama.cpp cannot read
        engine.restore(snapshot.pack(meta, bytes(len(kv))))
    _assert_no_leak(engine, [session])


# --- atomic writes ----------------------------------------------------------------------------

_KILL_CHILD = r"""
import sys
import igi_sdk
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig
model, path = sys.argv[1], sys.argv[2]
# one session holds most of the context: no floor kept for the other slot
with Engine(model, Plan.all_cpu(), EngineConfig(n_ctx=4608, max_sessions=2, n_threads=1,
                                                context_floor=0)) as e:
    small = e.open_session("You are a guard.")
    large = e.open_session("Brom the blacksmith sells swords. " * 240)
    for s in (small, large):
        e.chat(s, "Hello.", max_tokens=2).result(timeout=300)
    e.save_session(large, path)
    print("ready", flush=True)
    i = 0
    while True:  # overwrite the same save, small and large in turn, until killed
        e.save_session((small, large)[i % 2], path)
        i += 1
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_save_killed_mid_overwrite_leaves_the_old_or_the_new(
        engine: Engine, tiny_llama: Path, tmp_path: Path) -> None:
    rng = random.Random(3)
    sizes = set()
    for batch in range(2):  # 8 kills, 4 children at a time (each writes its own save)
        dirs = [tmp_path / f"run{batch}-{k}" for k in range(4)]
        children = []
        for d in dirs:
            d.mkdir()
            children.append(subprocess.Popen(
                [sys.executable, "-c", _KILL_CHILD, str(tiny_llama), str(d / "brom.igisession")],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        try:
            for child in children:
                assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            t0 = time.monotonic()
            for at, child in sorted(((rng.uniform(0.0, 0.4), c) for c in children),
                                    key=lambda x: x[0]):
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                child.send_signal(signal.SIGKILL)
        finally:
            for child in children:
                child.kill()
                child.wait(30)
        for d in dirs:
            path = d / "brom.igisession"
            sid = engine.load_session(path)  # whichever it is, it is whole
            engine.close_session(sid)
            meta, _ = snapshot.unpack(path.read_bytes())
            sizes.add(len(meta["tokens"]))
            saves = [p.name for p in d.iterdir() if not p.name.startswith(".igi-save-")]
            assert saves == ["brom.igisession"]
    # the small or the large session, nothing in between (which one a kill leaves depends on
    # the machine's speed: on a busy one it is mostly the small, the large save being cut)
    assert 1 <= len(sizes) <= 2


def test_disk_full_mid_write_keeps_the_old_save(engine: Engine, session: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "brom.igisession"
    engine.save_session(session, path)
    old = path.read_bytes()
    _grow(engine, session)
    for on in ("write", "fsync"):
        with _fault(monkeypatch, tmp_path, errno.ENOSPC, on=on):
            with pytest.raises(DiskFullError) as e:
                engine.save_session(session, path)
        assert e.value.code == "disk_full" and e.value.retryable
        assert isinstance(e.value, SaveFailedError)
        assert "brom" in e.value.message and str(tmp_path) not in e.value.message
        assert path.read_bytes() == old  # the earlier save is whole
        assert os.listdir(tmp_path) == ["brom.igisession"]  # no partial or temporary file
        with _fault(monkeypatch, tmp_path, errno.ENOSPC, on=on):  # a first save: no file at all
            with pytest.raises(DiskFullError):
                engine.save_session(session, tmp_path / "new.igisession")
        assert os.listdir(tmp_path) == ["brom.igisession"]
    engine.save_session(session, path)  # space is back: the retry works
    assert path.read_bytes() != old
    engine.close_session(engine.load_session(path))


def test_read_only_save_directory_is_a_typed_error(engine: Engine, session: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    saves = tmp_path / "saves"
    saves.mkdir()
    path = saves / "brom.igisession"
    engine.save_session(session, path)
    old = path.read_bytes()
    _grow(engine, session)
    saves.chmod(0o555)
    try:
        with contextlib.ExitStack() as stack:
            if os.geteuid() == 0:  # root writes through a 0555 directory: fail like EROFS
                stack.enter_context(_fault(monkeypatch, saves, errno.EROFS, on="open"))
            with pytest.raises(SaveFailedError) as e:
                engine.save_session(session, path)
    finally:
        saves.chmod(0o755)
    assert e.value.code == "save_failed" and not e.value.retryable
    assert "brom" in e.value.message and str(tmp_path) not in e.value.message
    assert path.read_bytes() == old and os.listdir(saves) == ["brom.igisession"]


def test_a_name_too_long_for_the_file_system_is_a_typed_error(engine: Engine, session: str,
                                                              tmp_path: Path) -> None:
    path = tmp_path / ("n" * 300 + ".igisession")
    with pytest.raises(SaveFailedError, match="too long") as e:
        engine.save_session(session, path)
    assert str(tmp_path) not in e.value.message
    assert os.listdir(tmp_path) == []
    with pytest.raises(InvalidStateError):
        engine.load_session(path)
    # the protocol's longest name, with the sidecar's suffix, fits NAME_MAX
    longest = tmp_path / ("n" * 128 + ".igisession")
    engine.save_session(session, longest)
    engine.close_session(engine.load_session(longest))


@contextlib.contextmanager
def _tmpfs(where: Path, size: int) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(where)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.skipif(not LINUX or shutil.which("mount") is None or os.geteuid() != 0,
                    reason="a real small file system needs Linux and root")
def test_a_real_full_and_read_only_file_system(engine: Engine, session: str,
                                               tmp_path: Path) -> None:
    size = len(engine.snapshot(session))
    with _tmpfs(tmp_path / "small", (size // 4096 + 16) * 4096) as disk:
        path = disk / "brom.igisession"
        engine.save_session(session, path)
        old = path.read_bytes()
        for _ in range(4):  # now larger than the whole file system
            _grow(engine, session)
        with pytest.raises(DiskFullError):
            engine.save_session(session, path)
        assert path.read_bytes() == old and os.listdir(disk) == ["brom.igisession"]
        with pytest.raises(DiskFullError):
            engine.save_session(session, disk / "other.igisession")
        assert os.listdir(disk) == ["brom.igisession"]
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(SaveFailedError, match="read-only") as e:
            engine.save_session(session, path)
        assert not e.value.retryable and str(disk) not in e.value.message
        engine.close_session(engine.load_session(path))  # a read-only save still restores


# --- save names in the protocol ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["con", "CON", "Con.txt", "prn", "aux.sav", "nul", "NUL.",
                                  "com1", "COM9.x", "lpt1", "Lpt9.a.b", "com0", "lpt0"])
def test_windows_device_names_are_not_save_names(name: str) -> None:
    for msg_type, body in (("save_session", {"session": "abc", "name": name}),
                           ("restore_session", {"name": name})):
        with pytest.raises(P.EnvelopeError) as e:
            P.parse_request(P.encode(1, msg_type, body))
        assert e.value.code == "invalid_body" and "device name" in e.value.message


@pytest.mark.parametrize("name", ["console", "con_1", "aux-2", "com10", "lpt", ".con", "brom",
                                  "Null", "n" * 128])
def test_ordinary_save_names_are_accepted(name: str) -> None:
    P.parse_request(P.encode(1, "restore_session", {"name": name}))


def test_a_save_name_longer_than_the_limit_is_invalid_body() -> None:
    with pytest.raises(P.EnvelopeError) as e:
        P.parse_request(P.encode(1, "save_session", {"session": "abc", "name": "n" * 300}))
    assert e.value.code == "invalid_body"


# --- over the wire ----------------------------------------------------------------------------

# A sidecar whose save writes fail with the errno written in FAULT (0 or absent: no fault):
# EROFS when the file is created, any other after the first 1000 bytes are written.
_SIDECAR = r"""
import errno, os, sys
from igi_sdk.cli import _reexec_with_native_preload, main
_reexec_with_native_preload()
FAULT = sys.argv[1]
real_write, real_open = os.write, os.open

def fault():
    try:
        with open(FAULT) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0

def ours(fd):
    try:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".igi-save-")
    except OSError:
        return False

def write(fd, data):
    e = fault()
    if e and e != errno.EROFS and ours(fd):
        real_write(fd, bytes(memoryview(data)[:1000]))
        raise OSError(e, os.strerror(e))
    return real_write(fd, data)

def open_(path, flags, *a, **kw):
    if fault() == errno.EROFS and os.path.basename(str(path)).startswith(".igi-save-"):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return real_open(path, flags, *a, **kw)

os.write, os.open = write, open_
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def wire(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory):
    from igi_sdk.client import Client

    d = tmp_path_factory.mktemp("wire")
    (d / "models").mkdir()
    shutil.copy(tiny_llama, d / "models" / "tiny.gguf")
    fault, saves = d / "fault", d / "saves"
    endpoint = f"ipc://{d / 's.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIDECAR, str(fault), "serve", "--endpoint", endpoint,
         "--model-dir", str(d / "models"), "--model", "tiny.gguf", "--save-dir", str(saves),
         "--ctx", "2048", "--threads", "2", "--max-sessions", str(SLOTS), "--no-arbiter"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = Client(endpoint, timeout=60)
    try:
        client.wait_ready(120)
        yield client, fault, saves, proc
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _bridge_error(fn, *args):
    from igi_sdk.client import BridgeError

    with pytest.raises(BridgeError) as e:
        fn(*args)
    return e.value


@pytest.mark.skipif(not LINUX, reason="the fault injection reads /proc/self/fd")
def test_wire_disk_full_and_read_only_are_typed_and_keep_the_old_save(wire) -> None:
    client, fault, saves, proc = wire
    sid = client.open_session(NPC, sampling={"temperature": 0.0})
    client.chat(sid, "What do you sell?", max_tokens=6).result()
    assert client.save_session(sid, "brom")["bytes"] > 1000
    old = (saves / "brom.igisession").read_bytes()
    client.chat(sid, "And shields?", max_tokens=6).result()
    for err, code, retryable in ((errno.ENOSPC, "disk_full", True),
                                 (errno.EROFS, "save_failed", False)):
        fault.write_text(str(err))
        try:
            e = _bridge_error(client.save_session, sid, "brom")
        finally:
            fault.write_text("0")
        assert (e.code, e.retryable) == (code, retryable), e
        assert "brom" in e.message and str(saves) not in e.message
        assert (saves / "brom.igisession").read_bytes() == old
        assert sorted(p.name for p in saves.iterdir()) == ["brom.igisession"]
    restored = client.restore_session("brom")
    client.close_session(restored)
    assert client.save_session(sid, "brom")["bytes"] > len(old)  # the retry works
    client.close_session(sid)
    assert proc.poll() is None


def test_wire_save_names_differing_only_in_case_are_refused(wire) -> None:
    client, _, saves, _ = wire
    sid = client.open_session(NPC, sampling={"temperature": 0.0})
    client.save_session(sid, "Mira")
    e = _bridge_error(client.save_session, sid, "mira")
    assert e.code == "save_name_conflict" and not e.retryable and "'Mira'" in e.message
    assert client.save_session(sid, "Mira")["name"] == "Mira"  # the same name overwrites
    e = _bridge_error(client.restore_session, "MIRA")
    assert e.code == "unknown_save" and "'Mira'" in e.message
    for name in ("con", "Aux.txt", "lpt3", "n" * 300):
        assert _bridge_error(client.save_session, sid, name).code == "invalid_body"
        assert _bridge_error(client.restore_session, name).code == "invalid_body"
    assert not any(p.name.lower().startswith(("con", "aux", "lpt")) for p in saves.iterdir())
    client.close_session(sid)


def test_wire_damaged_saves_answer_invalid_state_and_leak_no_slot(wire) -> None:
    client, _, saves, _ = wire
    sid = client.open_session(NPC, sampling={"temperature": 0.0})
    client.chat(sid, "What do you sell?", max_tokens=6).result()
    client.save_session(sid, "good")
    client.close_session(sid)
    data = (saves / "good.igisession").read_bytes()
    rng = random.Random(5)
    variants = dict(_variants(data, rng))
    for what in ("kv-bytes-0", "kv-bytes-1", "cut-after-header", "header-byte-0", "random"):
        (saves / f"bad-{what}.igisession").write_bytes(variants[what])
    for _ in range(2 * SLOTS):  # more failures than the model has slots
        for what in ("kv-bytes-0", "kv-bytes-1", "cut-after-header", "header-byte-0", "random"):
            e = _bridge_error(client.restore_session, f"bad-{what}")
            assert e.code == "invalid_state", e
            assert str(saves) not in e.message
    sids = [client.open_session("probe") for _ in range(SLOTS)]  # every slot is free
    for s in sids:
        client.close_session(s)
    client.close_session(client.restore_session("good"))


@pytest.mark.skipif(not LINUX, reason="FIFOs, /dev/zero and sparse files as planted on Linux")
def test_wire_planted_saves_are_refused_unread_and_hold_up_nothing(wire) -> None:
    import psutil

    client, _, saves, proc = wire
    saves.mkdir(exist_ok=True)
    os.mkfifo(saves / "fifo.igisession")
    (saves / "zero.igisession").symlink_to("/dev/zero")
    (saves / "random.igisession").symlink_to("/dev/urandom")
    with open(saves / "huge.igisession", "wb") as f:
        f.truncate(3 << 30)  # 3 GiB, sparse: no disk used
    rss = psutil.Process(proc.pid).memory_info().rss
    for name in ("fifo", "zero", "random", "huge"):
        e = _bridge_error(client.restore_session, name)
        assert e.code == "invalid_state", e
        assert "refused" in e.message
    # nothing was read: the sidecar did not grow by a planted file's size
    assert psutil.Process(proc.pid).memory_info().rss - rss < 256 << 20
    # the I/O thread is free (a FIFO blocked it, and every save with it), and grammars never
    # wait behind it
    sid = client.open_session(NPC, sampling={"temperature": 0.0})
    reply = client.chat(sid, "What do you sell?", max_tokens=8,
                        json_schema={"type": "object"}).result()
    assert reply["text"].startswith("{")
    assert client.save_session(sid, "after-planted")["bytes"] > 0
    client.close_session(sid)
