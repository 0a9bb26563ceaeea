"""The engine core's contract: typed commands in, typed events out through one outbox, the two
reshard steps, and thread ownership (asserted in every test by conftest's fixture)."""

from __future__ import annotations

import threading

import pytest

from igi_sdk import threads
from igi_sdk.errors import EngineClosedError, EngineUnavailableError, ModelLoadError
from igi_sdk.events import Outbox, ReplyDone, ReplyText
from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, loader
from igi_sdk.runtime.placement import Placement

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(tiny_llama, Plan.all_cpu(), EngineConfig(n_ctx=512, max_sessions=2,
                                                         n_threads=1)) as eng:
        yield eng


def test_an_engine_leaves_the_process_wide_thread_stack_size_alone(engine) -> None:
    """It was set to 64 MiB while the engine thread started: every thread any other code
    started meanwhile got that stack too."""
    assert threading.stack_size() == 0


def test_listeners_and_futures_run_on_the_outbox_thread_never_the_engines(engine) -> None:
    sid = engine.open_session("You are a guard.", sampling=GREEDY)
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def listener(event) -> None:
        seen.append((type(event).__name__, threading.current_thread().name))
        if isinstance(event, ReplyDone):
            done.set()

    fut = engine.chat_async(sid, "Halt!", max_tokens=6, ignore_eos=True, listener=listener)
    callback_thread: list[str] = []
    fut.add_done_callback(lambda _f: callback_thread.append(threading.current_thread().name))
    gen = fut.result(30)
    assert gen.result(30).completion_tokens == 6 and done.wait(10)
    assert {name for _, name in seen} == {threads.OUTBOX}
    assert seen[-1][0] == "ReplyDone" and any(kind == "ReplyText" for kind, _ in seen)
    # a callback added before the command ran completes where the outbox completes it
    assert callback_thread in ([threads.OUTBOX], [threading.current_thread().name])
    engine.close_session(sid)


def test_engine_code_off_the_engine_thread_is_a_breach(tiny_llama) -> None:
    settings = loader.ContextSettings(256, 1, 64, 1)
    inv = read_inventory(tiny_llama)
    with pytest.raises(threads.ThreadOwnershipError):
        Placement.open(tiny_llama, inv, Plan.all_cpu(), settings)
    assert threads.breaches  # recorded, then cleared: this breach was the point
    threads.breaches.clear()


def test_other_layers_code_on_the_engine_thread_is_a_breach() -> None:
    outbox = Outbox()
    caught: list[BaseException] = []

    def on_engine_thread() -> None:
        try:
            threads.refuse(threads.ENGINE, "sending a protocol frame")
        except threads.ThreadOwnershipError as e:
            caught.append(e)

    t = threading.Thread(target=on_engine_thread, name=threads.ENGINE)
    t.start()
    t.join()
    outbox.close()
    assert caught and threads.breaches
    threads.breaches.clear()


def test_model_work_waits_between_release_and_load(engine) -> None:
    sid = engine.open_session("You are a smith.", sampling=GREEDY)
    ref = engine.chat(sid, "A sword?", max_tokens=5, ignore_eos=True).result(30)
    engine.close_session(sid)
    sid = engine.open_session("You are a smith.", sampling=GREEDY)
    engine.release_async().result(30)
    assert engine.state == "moving" and not engine.loaded
    chat = engine.chat_async(sid, "A sword?", max_tokens=5, ignore_eos=True)
    assert not chat.done()  # held, not refused: the reshard is under way
    out = engine.load_first_fitting_async([Plan.all_cpu()]).result(30)
    assert out.landed == "all-cpu" and not out.failures
    assert chat.result(30).result(30).tokens == ref.tokens
    engine.close_session(sid)


def test_load_first_fitting_tries_candidates_in_order(engine, monkeypatch) -> None:
    real = loader.load
    tried: list[str] = []

    def load(path, inv, plan, settings, **kw):
        tried.append(plan.name)
        if plan.name == "too-big":
            raise ModelLoadError("injected: out of memory")
        return real(path, inv, plan, settings, **kw)

    monkeypatch.setattr(loader, "load", load)
    sid = engine.open_session("You are a bard.", sampling=GREEDY)
    engine.chat(sid, "Sing.", max_tokens=3, ignore_eos=True).result(30)
    big = Plan.all_cpu().model_copy(update={"name": "too-big"})
    engine.release_async().result(30)
    out = engine.load_first_fitting_async([big, Plan.all_cpu()]).result(30)
    assert tried == ["too-big", "all-cpu"]
    assert out.landed == "all-cpu" and [f[0] for f in out.failures] == ["too-big"]
    assert engine.chat(sid, "Again.", max_tokens=3, ignore_eos=True).result(30)
    # nothing loads: unavailable, the session kept; a later load brings it back
    engine.release_async().result(30)
    out = engine.load_first_fitting_async([big]).result(30)
    assert out.landed is None and engine.state == "unavailable"
    with pytest.raises(EngineUnavailableError):
        engine.chat(sid, "Hello?", max_tokens=3)
    assert engine.load_first_fitting_async([Plan.all_cpu()]).result(30).landed == "all-cpu"
    assert engine.state == "ready" and sid in engine.sessions()
    assert engine.chat(sid, "Back.", max_tokens=3, ignore_eos=True).result(30)
    engine.close_session(sid)


def test_the_server_sends_through_one_socket_from_any_number_of_threads(tmp_path) -> None:
    """A PUSH socket per sending thread piled up (one per load thread, reservation timer)."""
    from igi_sdk.serving.server import Server, ServerConfig

    class NoModel:  # the server never asks it anything here
        model_name = None

        def status(self) -> dict:
            return {}

        def close(self) -> None:
            pass

    server = Server(ServerConfig(endpoint="tcp://127.0.0.1:0", model_dir=tmp_path),
                    NoModel())  # type: ignore[arg-type]
    try:
        workers = [threading.Thread(target=server._push, args=(b"", b"wake"))
                   for _ in range(50)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert server._push_sock is not None
        assert not hasattr(server, "_local")
    finally:
        server.close()


def test_outbox_delivers_in_order_and_survives_a_faulty_listener() -> None:
    outbox = Outbox()
    got: list[str] = []
    outbox.subscribe(1, lambda e: got.append(e.text) if isinstance(e, ReplyText) else None)

    def faulty(_e) -> None:
        raise RuntimeError("a listener's bug")

    outbox.subscribe(2, faulty)
    for i in range(100):
        outbox.post(ReplyText(2, "x"))
        outbox.post(ReplyText(1, str(i)))
    outbox.close()
    assert got == [str(i) for i in range(100)]


def test_a_listener_that_waits_for_the_engine_is_refused_not_deadlocked(engine) -> None:
    """Outcomes are delivered on the outbox thread: a listener waiting there for one could
    never be answered, so every NPC's stream would stop."""
    from igi_sdk.errors import InvalidStateError

    sid = engine.open_session("You are a guard.", sampling=GREEDY)
    caught: list[BaseException] = []
    delivered = threading.Event()  # the listener's events come in order: ReplyDone is last

    def listener(event) -> None:
        if isinstance(event, ReplyText) and not caught:
            try:
                engine.tokenize("halt")
            except InvalidStateError as e:
                caught.append(e)
        if isinstance(event, ReplyDone):
            delivered.set()

    gen = engine.chat(sid, "Halt!", max_tokens=4, ignore_eos=True, listener=listener)
    assert gen.result(30).completion_tokens == 4
    # the handle's result may come before the outbox thread has run the listener
    delivered.wait(10)
    assert caught and "_async" in str(caught[0])
    assert engine.tokenize("halt")  # from any other thread it works
    engine.close_session(sid)


def test_the_encoders_borrowing_never_tries_a_second_gpu_placement_after_a_failed_load() -> None:
    """Vision borrowing moves the LM with the arbiter's two steps and its rule: the smaller
    placement, else the room's fallback (the CPU plan under the arbiter); back, the LM's own
    placement, else the fallback, never the smaller GPU one again."""
    from igi_sdk.runtime.encoder import Encoder, EncoderRoom

    main, small, cpu = (Plan.all_cpu().model_copy(update={"name": n})
                        for n in ("main", "small", "cpu"))
    tried: list[list[str]] = []

    def move(lands_on: str | None):
        def run(candidates):
            tried.append([p.name for p in candidates])
            return next((p for p in candidates if p.name == lands_on), None)
        return run

    enc = Encoder(EngineConfig(vision_gpu=True, mmproj="m.gguf"),
                  EncoderRoom(((main, small), (cpu, None)), fallback=cpu))
    assert enc.place(main, move("small")) is True and enc.lent_from == main
    enc.give_back(move("cpu"))  # the game took the memory meanwhile
    assert tried == [["small", "cpu"], ["main", "cpu"]]
    tried.clear()
    assert enc.place(main, move("cpu")) is False  # the smaller one failed: encoder on the CPU
    assert enc.lent_from is None and tried == [["small", "cpu"]]
    assert enc.place(cpu, move("cpu")) is False  # on the CPU rung the game has the GPU
    # a fixed budget: the fallback is the LM's own placement, back to the smaller one if not
    tried.clear()
    fixed = Encoder(EngineConfig(vision_gpu=True, mmproj="m.gguf"),
                    EncoderRoom.always(small, fallback=main))
    assert fixed.place(main, move("small")) is True
    fixed.give_back(move("small"))
    assert tried == [["small", "main"], ["main", "small"]]


def test_a_priority_just_set_reads_as_set_while_the_engine_is_busy(engine) -> None:
    """Was: list_sessions right after set_priority showed the old priority until the engine
    thread took the command (a leased client's test failed on a loaded machine)."""
    from igi_sdk.runtime import commands as C

    sid = engine.open_session("You are a guard.")
    hold, held = threading.Event(), threading.Event()

    def busy() -> None:  # the engine thread, held between two steps
        held.set()
        hold.wait(10)

    blocked = engine._submit(C.Inspect(busy))
    try:
        assert held.wait(10)
        engine.set_priority(sid, 90)
        assert engine.session_info()[sid]["priority"] == 90  # not yet applied, read as set
    finally:
        hold.set()
        blocked.result(10)
    engine.close_session(sid)
    again = engine.open_session("You are a guard.", session_id=sid)
    assert engine.session_info()[again]["priority"] == 0  # another session of that name
    engine.close_session(again)


def test_a_tokens_text_is_handed_out_right_before_the_next_decode(default_model,
                                                                   monkeypatch) -> None:
    """The text a step samples waits while the engine prepares the next step and goes right
    before its llama_decode: the threads it wakes (the outbox's, the caller's) then run while
    the device computes instead of contending with the step's preparation. Nothing is lost or
    reordered, and the end follows the last text."""
    from igi_sdk.runtime import core

    handle: list = []
    at_decide: list[int] = []  # pieces handed to the caller's queue when a step is decided
    at_decode: list[int] = []  # ... and when its llama_decode is called
    decide, llama_decode = core.scheduler.decide, core.llama_cpp.llama_decode

    def handed() -> int:
        return handle[0]._events.qsize() if handle else -1

    def deciding(*a, **k):
        at_decide.append(handed())
        return decide(*a, **k)

    def decoding(*a, **k):
        at_decode.append(handed())
        return llama_decode(*a, **k)

    with Engine(default_model, Plan.all_cpu(), EngineConfig(n_ctx=512, max_sessions=1,
                                                            n_threads=1)) as eng:
        sid = eng.open_session("You are a blacksmith.", sampling=GREEDY)
        seen: list[str] = []
        done = threading.Event()

        def listener(event) -> None:
            seen.append("done" if isinstance(event, ReplyDone) else
                        event.text if isinstance(event, ReplyText) else "")
            if isinstance(event, ReplyDone):
                done.set()

        monkeypatch.setattr(core.scheduler, "decide", deciding)
        monkeypatch.setattr(core.llama_cpp, "llama_decode", decoding)
        gen = eng.chat_async(sid, "Tell me about your forge.", max_tokens=40, ignore_eos=True,
                             listener=listener).result(30)
        handle.append(gen)
        result = gen.result(60)
        monkeypatch.undo()
        assert done.wait(10)
        assert "".join(gen) == result.text == "".join(seen[:-1]) and seen[-1] == "done"
    steps = [(a, b) for a, b in zip(at_decide, at_decode, strict=True) if a >= 0]
    assert len(steps) >= 20, steps
    # held while the step was prepared, handed out before its decode: in nearly every step
    # (a piece can be empty while a character's bytes are incomplete)
    assert sum(b > a for a, b in steps) >= 0.8 * len(steps), steps


def test_a_command_taken_when_the_engine_thread_fails_is_answered_not_lost(tiny_llama,
                                                                           monkeypatch) -> None:
    """The loop fails between taking a command off the queue and running it: that command's
    caller gets engine_closed at once, as queued ones do (it waited forever before)."""
    from igi_sdk.runtime import core

    eng = Engine(tiny_llama, Plan.all_cpu(), EngineConfig(n_ctx=256, max_sessions=1,
                                                          n_threads=1))

    def fail(self) -> None:
        raise RuntimeError("injected: the loop fails before the command runs")

    monkeypatch.setattr(core.EngineCore, "_read_in_flight", fail)
    fut = eng.open_session_async("You are a guard.")
    with pytest.raises(EngineClosedError):
        fut.result(20)
    eng.close()


def test_a_closed_engine_answers_its_shutdown_once(tiny_llama, caplog) -> None:
    """The loop's last command (the shutdown) was run, its outcome on its way through the
    outbox: the thread's end must not answer it a second time (the outbox then failed on a
    finished future and logged a traceback at every close)."""
    import logging

    with caplog.at_level(logging.ERROR):
        eng = Engine(tiny_llama, Plan.all_cpu(), EngineConfig(n_ctx=256, max_sessions=1,
                                                              n_threads=1))
        eng.close_session(eng.open_session("You are a guard."))
        eng.close()
    assert not [r for r in caplog.records if "engine event failed" in r.getMessage()]
