"""Arbiter policy and plan ladder on scripted VRAM traces (pure, fixed profiles)."""

from __future__ import annotations

import itertools

import pytest

from igi_sdk.arbiter import (
    BudgetPolicy,
    PlanLadder,
    PolicyConfig,
    ScriptedTrace,
    VramReading,
)
from igi_sdk.model import read_inventory
from igi_sdk.planner import Workload
from tests.test_planner import GPU_PROFILE

GIB = 1024**3
MIB = 1024**2
WL = Workload(n_ctx=2048, prompt_tokens=512, gen_tokens=64)


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    from igi_sdk.model import spec_with, write_synthetic_gguf

    # big enough that the ladder has several rungs between CPU-only and all-GPU
    spec = spec_with("tiny-llama", n_layers=8, n_embd=1024, n_ff=4096, n_vocab=4096)
    inv = read_inventory(write_synthetic_gguf(tmp_path_factory.mktemp("m") / "m.gguf", spec))
    return PlanLadder.build(inv, GPU_PROFILE, WL, step=16 * MIB)


class Device:
    """A GPU whose other user follows a trace; our use is the current rung's VRAM."""

    def __init__(self, total: int, game: list[tuple[float, int]], policy: BudgetPolicy):
        self.t = 0.0
        self.policy = policy
        self.trace = ScriptedTrace(total, game, own=lambda: policy.current.vram,
                                   clock=lambda: self.t)

    def read(self) -> VramReading:
        return self.trace.read()


def run(policy: BudgetPolicy, dev: Device, seconds: float, dt: float = 0.1):
    log = []
    frame = 0
    while dev.t <= seconds:
        d = policy.decide(dev.read(), frame, dev.t)
        if d.action != "stay":
            policy.applied(d.target)
            log.append((round(dev.t, 2), d.action, d.target.vram))
        dev.t += dt
        frame += 1
    return log


def test_ladder_is_sorted_and_each_rung_is_faster(ladder) -> None:
    assert len(ladder.rungs) >= 3
    assert ladder.cpu.plan.name == "all-cpu"
    vram = [r.vram for r in ladder.rungs]
    turns = [r.turn_s for r in ladder.rungs]
    assert vram == sorted(vram)
    assert all(b < a for a, b in itertools.pairwise(turns))
    top = ladder.rungs[-1]
    assert ladder.best_within(top.vram + GIB) is top
    assert ladder.best_within(0) is ladder.cpu


def test_shrinks_at_once_when_the_game_needs_memory(ladder) -> None:
    top = ladder.rungs[-1]
    total = top.vram + 2 * GIB
    policy = BudgetPolicy(ladder, PolicyConfig(headroom=64 * MIB), current=top)
    # the game jumps from 0.5 GiB to leaving only room for about half the model (a rung well
    # below the top, beyond the policy's tolerance for page rounding)
    below = [r for r in ladder.rungs if top.vram - r.vram > 64 * MIB]
    mid = below[len(below) // 2]
    game_hi = total - mid.vram - 64 * MIB - 1
    dev = Device(total, [(0.0, GIB // 2), (1.0, game_hi)], policy)
    log = run(policy, dev, 1.5)
    # the first decision after the game's jump shrinks (decisions every 0.1 s)
    assert log and abs(log[0][0] - 1.0) <= 0.11 and log[0][1] in ("shrink", "fast_shrink")
    assert policy.current.vram + game_hi + 64 * MIB <= total


def test_grows_only_after_the_budget_holds(ladder) -> None:
    top = ladder.rungs[-1]
    total = top.vram + 2 * GIB
    policy = BudgetPolicy(ladder, PolicyConfig(headroom=64 * MIB, grow_hold_s=2.0),
                          current=ladder.cpu)
    dev = Device(total, [(0.0, total - ladder.cpu.vram), (1.0, GIB // 4)], policy)
    log = run(policy, dev, 5.0)
    grows = [e for e in log if e[1] == "grow"]
    assert grows and grows[0][0] >= 3.0 - 1e-9  # freed at t=1, held for 2 s
    assert policy.current is not ladder.cpu


def test_oscillating_budget_does_not_thrash(ladder) -> None:
    top = ladder.rungs[-1]
    total = top.vram + 2 * GIB
    policy = BudgetPolicy(ladder, PolicyConfig(headroom=64 * MIB, grow_hold_s=2.0),
                          current=ladder.cpu)
    # free for 1 s, busy for 1 s, ten times: never free long enough to grow
    busy = total - ladder.cpu.vram
    points = [(float(i), GIB // 4 if i % 2 == 0 else busy) for i in range(20)]
    log = run(policy, Device(total, points, policy), 19.5)
    assert [e for e in log if e[1] == "grow"] == []


def test_reservation_acknowledged_only_after_release_and_not_grown_back_into(ladder) -> None:
    top = ladder.rungs[-1]
    game = GIB // 2
    total = top.vram + game + 64 * MIB + 16 * MIB  # the model fits with 16 MiB to spare
    policy = BudgetPolicy(ladder, PolicyConfig(headroom=64 * MIB, grow_hold_s=0.5),
                          current=top)
    dev = Device(total, [(0.0, game)], policy)
    want = top.vram // 2
    res = policy.reserve(want, deadline_frames=3, frame=0, r=dev.read())
    assert not res.acknowledged
    d = policy.decide(dev.read(), 0, 0.0)  # not free yet: shrink, no ack
    assert d.action in ("shrink", "fast_shrink") and not res.acknowledged
    policy.applied(d.target)
    policy.decide(dev.read(), 1, 0.1)  # now free on the device: acknowledged
    assert res.acknowledged
    assert dev.read().total - dev.read().used >= want
    # before the game allocates, the budget still holds the reservation: no growing back
    for k in range(2, 12):
        assert policy.decide(dev.read(), k, 0.1 * k).action == "stay"
    # the game takes it: the reservation retires, the memory now shows as the game's
    dev.trace = ScriptedTrace(total, [(0.0, game + want)], own=lambda: policy.current.vram,
                              clock=lambda: dev.t)
    policy.decide(dev.read(), 20, 2.0)
    assert policy.reservations == []
    assert policy.current.vram + game + want <= total


def test_urgent_reservation_fast_shrinks_to_cpu(ladder) -> None:
    top = ladder.rungs[-1]
    total = top.vram + GIB // 2 + 64 * MIB + 16 * MIB
    policy = BudgetPolicy(ladder, PolicyConfig(headroom=64 * MIB), current=top)
    dev = Device(total, [(0.0, GIB // 2)], policy)
    policy.reserve(top.vram // 3, deadline_frames=0, frame=5, r=dev.read())
    d = policy.decide(dev.read(), 5, 0.0)
    assert d.action == "fast_shrink" and d.target is ladder.cpu


def test_trace_file_round_trip(tmp_path) -> None:
    import json

    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"total": 8 * GIB, "points": [{"t": 0, "game": GIB},
                                                          {"t": 2.5, "game": 3 * GIB}]}))
    t = ScriptedTrace.load(p)
    assert t.game_at(0.0) == GIB and t.game_at(2.4) == GIB and t.game_at(2.5) == 3 * GIB
    with pytest.raises(ValueError):
        ScriptedTrace(GIB, [(1.0, 0), (0.5, 0)])


# --- the arbiter loop over a real engine (CPU here: GPU plans resolve to the CPU, but every
# --- reshard is a real unload/reload with the KV cache carried across) ------------------------


def _engine_setup(tmp_path):
    from igi_sdk.model import spec_with, write_synthetic_gguf
    from igi_sdk.runtime import Engine, EngineConfig

    spec = spec_with("tiny-llama", n_layers=4, n_embd=256, n_ff=1024)
    path = write_synthetic_gguf(tmp_path / "m.gguf", spec)
    inv = read_inventory(path)
    ladder = PlanLadder.build(inv, GPU_PROFILE, WL, step=8 * MIB)
    eng = Engine(path, ladder.cpu.plan, EngineConfig(n_ctx=1024, max_sessions=2, n_threads=2,
                          prefill_chunk=32))
    return eng, ladder


def test_three_reshards_during_one_stream_are_bit_exact(tmp_path) -> None:
    from igi_sdk.arbiter import Arbiter
    from igi_sdk.runtime import SamplingParams

    eng, ladder = _engine_setup(tmp_path)
    sampling = SamplingParams(temperature=0.9, seed=21)
    try:
        sid = eng.open_session("npc", sampling=sampling)
        ref = eng.chat(sid, "Tell me about the forest.", max_tokens=200,
                       ignore_eos=True).result(60)
        eng.close_session(sid)

        top = ladder.rungs[-1]
        total = top.vram + 64 * MIB + 256 * MIB  # room for the top rung + the grow margin
        t = [0.0]
        # the game: idle, a level-load spike that leaves only the CPU rung, then idle again
        trace = ScriptedTrace(total, [(0.0, 0), (1.0, total), (2.0, 0)],
                              own=lambda: arb.policy.current.vram, clock=lambda: t[0])
        arb = Arbiter(eng, ladder, [trace], config=PolicyConfig(headroom=64 * MIB,
                                                                grow_hold_s=0.5),
                      clock=lambda: t[0])
        sid = eng.open_session("npc", sampling=sampling)
        gen = eng.chat(sid, "Tell me about the forest.", max_tokens=200, ignore_eos=True)
        # arbiter ticks while the reply streams: grow (the game's use held 0.5 s), the spike
        # (back to the CPU), idle again (grow once more, once the game's use has held longer
        # than its earlier stretches: arbiter/trend.py's horizon)
        ticks = {2: 0.0, 10: 0.6, 15: 1.0, 20: 1.5, 30: 2.2, 40: 2.8, 50: 3.6}
        for i, _ in enumerate(gen):
            if i in ticks:
                t[0] = ticks[i]
                arb.tick()
        res = gen.result(60)
        actions = [r.action for r in arb.reshards]
        assert len(actions) >= 3 and "grow" in actions and actions.count("grow") >= 2, actions
        assert any(a in ("shrink", "fast_shrink") for a in actions)
        assert res.tokens == ref.tokens  # bit-exact across every reshard
    finally:
        eng.close()


def test_failed_reshard_falls_back_to_cpu_and_keeps_serving(tmp_path, monkeypatch) -> None:
    from igi_sdk.arbiter import Arbiter
    from igi_sdk.errors import ModelLoadError
    from igi_sdk.runtime import SamplingParams, loader

    eng, ladder = _engine_setup(tmp_path)
    real_load = loader.load

    def flaky(path, inv, plan, settings, **kw):  # injected failure for any GPU plan
        if plan.gpu_tensors:
            raise ModelLoadError("injected: out of VRAM")
        return real_load(path, inv, plan, settings, **kw)

    monkeypatch.setattr(loader, "load", flaky)
    try:
        sid = eng.open_session("npc", sampling=SamplingParams(temperature=0.0))
        top = ladder.rungs[-1]
        t = [0.0]
        trace = ScriptedTrace(top.vram * 4, [(0.0, 0)], own=lambda: 0, clock=lambda: t[0])
        arb = Arbiter(eng, ladder, [trace], config=PolicyConfig(headroom=0, grow_hold_s=0.0),
                      clock=lambda: t[0])
        arb.tick()
        t[0] = 1.0
        arb.tick()
        rec = list(arb.reshards)
        assert rec and not rec[-1].ok
        assert arb.policy.current is ladder.cpu and eng.plan == ladder.cpu.plan
        assert eng.chat(sid, "still there?", max_tokens=4).result(30).completion_tokens > 0
    finally:
        eng.close()


def test_pacer_backs_off_fast_and_relaxes_slowly() -> None:
    from igi_sdk.arbiter.pacing import FramePacer, PacingConfig

    p = FramePacer(PacingConfig(step_s=0.002, max_delay_s=0.1))
    assert p.update(10.0, None) == 0.0
    delays = [p.update(20.0, 16.7) for _ in range(8)]  # frames over the target
    assert delays[0] == 0.002 and delays == sorted(delays) and delays[-1] == 0.1
    assert p.update(16.0, 16.7) == 0.1  # near the target: hold
    relaxed = [p.update(8.0, 16.7) for _ in range(60)]  # menus: give the time back
    assert relaxed[0] == pytest.approx(0.098) and relaxed[-1] == 0.0


def test_engine_pacing_slows_steps_and_keeps_the_player_first(tmp_path) -> None:
    import time

    from igi_sdk.model import spec_with, write_synthetic_gguf
    from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

    path = write_synthetic_gguf(tmp_path / "m.gguf", spec_with("tiny-llama", n_layers=2))
    with Engine(path, None, EngineConfig(n_ctx=1024, max_sessions=2, n_threads=2)) as eng:
        g = SamplingParams(temperature=0.0)
        player = eng.open_session("p", sampling=g, priority=1)
        npc = eng.open_session("n", sampling=g, priority=0)
        eng.set_pacing(0.02)
        t0 = time.monotonic()
        a = eng.chat(player, "hi", max_tokens=30, ignore_eos=True)
        b = eng.chat(npc, "hi", max_tokens=30, ignore_eos=True)
        ra = a.result(60)
        elapsed = time.monotonic() - t0
        assert ra.completion_tokens == 30
        assert elapsed >= 30 * 0.02 * 0.9  # every step waited ~20 ms
        # the NPC was decoded every other step: it finished after the player
        assert b.result(60).total_s > ra.total_s
        eng.set_pacing(0.0)


def test_a_plan_barely_over_the_budget_stays(ladder) -> None:
    """NVML and the engine's reports differ by page rounding; a reload costs seconds."""
    top = ladder.rungs[-1]
    policy = BudgetPolicy(ladder, PolicyConfig(headroom=0), current=top)
    r = VramReading(total=top.vram + 1000, used=2000 + top.vram, own=top.vram, source="t", at=0)
    assert policy.budget(r) == top.vram - 1000  # 1000 bytes short
    assert policy.decide(r, 0, 0.0).action == "stay"
    far = VramReading(top.vram, top.vram + 64 * MIB, top.vram, "t", 0)  # 64 MiB short
    assert policy.decide(far, 0, 0.0).action in ("shrink", "fast_shrink")


def test_paced_frames_over_target_leave_the_gpu_to_the_game(ladder) -> None:
    top = ladder.rungs[-1]
    cfg = PolicyConfig(headroom=0, grow_hold_s=0.5, pressure_frames=3, pressure_window=10,
                       yield_hold_s=2.0)
    policy = BudgetPolicy(ladder, cfg, current=top)
    idle = VramReading(top.vram * 4, top.vram, top.vram, "t", 0)  # VRAM is no problem
    t = 0.0
    for _ in range(10):  # frames under target, and frames with no target: nothing happens
        policy.note_frame(15.0, 16.7, t)
        policy.note_frame(40.0, None, t)
    assert policy.decide(idle, 0, t).action == "stay"
    for _ in range(3):  # three paced frames over target: the model yields the GPU
        policy.note_frame(20.0, 16.7, t)
    d = policy.decide(idle, 0, t)
    assert d.action == "yield" and d.target is ladder.cpu
    policy.applied(d.target)
    assert policy.decide(idle, 0, t + 1.9).action == "stay"  # held for yield_hold_s ...
    grew = [policy.decide(idle, 0, t + x / 10) for x in range(20, 40)]
    assert any(g.action == "grow" for g in grew)  # ... then grows back once the budget holds
    policy.applied(ladder.rungs[-1])
    # yielding again soon after doubles the hold: the game is GPU-bound in this scene
    t2 = t + 4.0
    for _ in range(3):
        policy.note_frame(20.0, 16.7, t2)
    assert policy.decide(idle, 0, t2).action == "yield"
    policy.applied(ladder.cpu)
    assert policy.decide(idle, 0, t2 + 3.9).action == "stay"
    assert policy.yielding(t2 + 3.9) and not policy.yielding(t2 + 4.1)


def test_reservation_is_acknowledged_as_soon_as_the_old_plan_is_gone(tmp_path) -> None:
    """The game waits for the VRAM, not for the model to finish loading its next plan."""
    from igi_sdk.arbiter import Arbiter
    from igi_sdk.runtime import loader

    eng, ladder = _engine_setup(tmp_path)
    top = ladder.rungs[-1]
    t = [0.0]
    total = top.vram + 64 * MIB + 256 * MIB
    # what the device shows for us: nothing while the engine holds no model (mid-reshard)
    trace = ScriptedTrace(total, [(0.0, 0)], clock=lambda: t[0],
                          own=lambda: 0 if not eng.loaded else arb.policy.current.vram)
    arb = Arbiter(eng, ladder, [trace], config=PolicyConfig(headroom=64 * MIB, grow_hold_s=0.0),
                  clock=lambda: t[0])
    events: list[str] = []
    real_load = loader.load

    def logged_load(*a, **kw):
        events.append("load")
        return real_load(*a, **kw)

    try:
        arb.tick()
        t[0] = 0.5  # the game's use has settled (arbiter/trend.py): the model grows
        arb.tick()  # grown to the top rung
        assert arb.policy.current is top
        loader.load = logged_load
        need = total - ladder.cpu.vram - 64 * MIB - 1  # only the CPU plan leaves this much
        assert need > total - top.vram  # not free now
        arb.reserve(need, 0, lambda res, err: events.append("ack" if err is None else err.code))
        arb.tick()
        assert "ack" in events and events.index("ack") < events.index("load"), events
    finally:
        loader.load = real_load
        eng.close()


def test_every_rung_of_a_ladder_keeps_one_kv_format(tmp_path) -> None:
    """A reshard moves the KV cache's bytes as they are: rungs of mixed KV types would lose
    every conversation's cache when the arbiter moves between them."""
    from igi_sdk.model import spec_with, write_synthetic_gguf

    path = write_synthetic_gguf(tmp_path / "m.gguf", spec_with(
        "tiny-llama", n_layers=4, n_embd=256, n_ff=1024))
    ladder = PlanLadder.build(read_inventory(path), GPU_PROFILE, WL, step=8 * MIB)
    assert len(ladder.rungs) >= 2
    assert {(r.plan.type_k, r.plan.type_v) for r in ladder.rungs} == {("f16", "f16")}


class _Ops:
    """The engine's reshard steps, scripted: which plans fail to load, and the budget the
    device shows before and after the release (a greedy game takes memory meanwhile)."""

    standby = False  # every reshard stops the world (the engine without a CPU standby)

    def __init__(self, failing: set[str], budgets: list[int]) -> None:
        self.failing, self.budgets = failing, budgets
        self.loaded, self.tried = True, []

    def budget_now(self) -> int:
        return self.budgets.pop(0) if len(self.budgets) > 1 else self.budgets[0]

    def release(self) -> None:
        self.loaded = False

    def load_first_fitting(self, plans, give_up=None):
        from igi_sdk.runtime.engine_ops import LoadOutcome

        failures = []
        for plan in plans:
            self.tried.append(plan.name)
            if plan.name in self.failing:
                failures.append((plan.name, "injected: out of memory"))
                continue
            self.loaded = True
            return LoadOutcome(plan.name, tuple(failures))
        return LoadOutcome(None, tuple(failures))


def test_one_failed_load_sends_the_model_to_the_cpu_rung_not_the_next_gpu_rung(ladder) -> None:
    """A failed load is evidence the game is growing: trying the next GPU rung at once takes
    memory the game is reaching for (7 failed loads in 5.5 s, a 0.84 s allocation stall)."""
    from igi_sdk.arbiter.reshard import ReshardMachine

    gpu = [r for r in ladder.rungs if r is not ladder.cpu]
    assert len(gpu) >= 3
    top = gpu[-1]
    ops = _Ops({r.plan.name for r in gpu}, [top.vram * 2])
    out = ReshardMachine(ladder, top, ops.budget_now)(ops)
    assert ops.tried == [top.plan.name, ladder.cpu.plan.name], ops.tried
    assert out.landed is ladder.cpu and out.contended and len(out.failures) == 1


def test_memory_the_game_took_during_the_release_is_kept_as_a_margin(ladder) -> None:
    from igi_sdk.arbiter.reshard import ReshardMachine

    gpu = [r for r in ladder.rungs if r is not ladder.cpu]
    mid, top = gpu[len(gpu) // 2], gpu[-1]
    # while the model was released the game took `took`: the top rung would still fit what is
    # left, but not with a margin of what the game took (it is growing)
    took = max(ReshardMachine.GROWTH_TOLERANCE + MIB, (top.vram - gpu[0].vram) // 2)
    ops = _Ops(set(), [top.vram + took, top.vram])
    out = ReshardMachine(ladder, top, ops.budget_now)(ops)
    assert out.contended and out.game_took == took
    fits = [r for r in gpu if r.vram <= top.vram - took]
    assert fits and out.landed is fits[-1] and ops.tried == [fits[-1].plan.name]
    # the game keeps still: nothing taken, the target itself
    calm = _Ops(set(), [mid.vram * 2, mid.vram * 2])
    out = ReshardMachine(ladder, mid, calm.budget_now)(calm)
    assert out.landed is mid and not out.contended and ops.failing == set()


def test_after_a_contended_shrink_the_policy_grows_only_once_the_budget_held(ladder) -> None:
    policy = BudgetPolicy(ladder, PolicyConfig(headroom=0, grow_hold_s=2.0))
    top = ladder.rungs[-1]
    policy.applied(ladder.cpu)
    reading = VramReading(total=top.vram * 4, used=0, own=0, source="t", at=0.0)
    assert policy.decide(reading, 0, 0.0).action == "stay"  # the hold starts
    policy.hold_growth()  # a reshard found the game growing
    assert policy.decide(reading, 1, 1.9).action == "stay"  # would have grown at 2.0 before
    assert policy.decide(reading, 2, 3.8).action == "stay"
    assert policy.decide(reading, 3, 4.0).action == "grow"


class _StandbyOps(_Ops):
    """The engine with its CPU standby: a release moves the sessions onto the CPU placement,
    a load runs behind the decode and asks ``give_up`` while it loads."""

    standby = True

    def __init__(self, failing: set[str], budgets: list[int]) -> None:
        super().__init__(failing, budgets)
        self.released = 0
        self.gave_up = False

    def release(self) -> None:
        self.released += 1

    def load_first_fitting(self, plans, give_up=None):
        from igi_sdk.runtime.engine_ops import LoadOutcome

        if give_up is not None and give_up():  # the game grew while the rung loaded
            self.gave_up = True
            self.tried.append(plans[0].name)
            return LoadOutcome(plans[-1].name, ((plans[0].name, "given up"),))
        return super().load_first_fitting(plans)


def test_with_a_standby_the_vram_goes_back_before_anything_loads(ladder) -> None:
    from igi_sdk.arbiter.reshard import ReshardMachine

    gpu = [r for r in ladder.rungs if r is not ladder.cpu]
    mid, top = gpu[len(gpu) // 2], gpu[-1]
    ops = _StandbyOps(set(), [mid.vram * 2])
    freed: list[int] = []
    out = ReshardMachine(ladder, mid, ops.budget_now, lambda: freed.append(ops.released),
                         current=top, settled=lambda: True)(ops)
    assert ops.released == 1 and freed == [1]  # given back first, reservations told
    assert out.landed is mid and ops.tried == [mid.plan.name] and out.released_s is not None


def test_with_a_standby_nothing_loads_while_the_game_is_still_claiming(ladder) -> None:
    from igi_sdk.arbiter.reshard import ReshardMachine

    gpu = [r for r in ladder.rungs if r is not ladder.cpu]
    mid, top = gpu[len(gpu) // 2], gpu[-1]
    ops = _StandbyOps(set(), [mid.vram * 2])
    out = ReshardMachine(ladder, mid, ops.budget_now, current=top, settled=lambda: False)(ops)
    assert out.landed is ladder.cpu and out.waited_for_settle
    assert ops.tried == [ladder.cpu.plan.name]  # the standby, no GPU load


def test_with_a_standby_a_load_the_game_grows_into_is_given_up(ladder) -> None:
    from igi_sdk.arbiter.reshard import ReshardMachine

    gpu = [r for r in ladder.rungs if r is not ladder.cpu]
    mid, top = gpu[len(gpu) // 2], gpu[-1]
    # fits when it starts, then the game takes it while the rung loads
    ops = _StandbyOps(set(), [top.vram * 2, top.vram * 2, mid.vram // 2])
    out = ReshardMachine(ladder, mid, ops.budget_now, current=top, settled=lambda: True)(ops)
    assert ops.gave_up and out.landed is ladder.cpu and out.contended


def test_with_a_standby_a_grow_the_vram_holds_twice_keeps_decoding_on_the_gpu(ladder) -> None:
    """Make-before-break: the current GPU placement decodes while the larger one loads."""
    from igi_sdk.arbiter.reshard import ReshardMachine

    gpu = [r for r in ladder.rungs if r is not ladder.cpu]
    low, top = gpu[0], gpu[-1]
    roomy = _StandbyOps(set(), [low.vram + top.vram])
    out = ReshardMachine(ladder, top, roomy.budget_now, current=low, settled=lambda: True)(roomy)
    assert roomy.released == 0 and out.landed is top
    tight = _StandbyOps(set(), [top.vram + 1])  # only the target fits: the small one goes first
    out = ReshardMachine(ladder, top, tight.budget_now, current=low, settled=lambda: True)(tight)
    assert tight.released == 1 and out.landed is top


def test_the_ladder_pins_host_weights_where_every_token_gains_and_reloads_are_decoded_through(
        ) -> None:
    from igi_sdk.arbiter.ladder import pins_host_weights
    from igi_sdk.planner import PIN_RAM_HEADROOM

    model = 5 * GIB
    enough = 2 * model + PIN_RAM_HEADROOM

    def pins(choice: str = "auto", **kw) -> bool:
        args = dict(talking=1, vision_borrow=False, pipelines=True, standby=True,
                    model_bytes=model, available_ram=enough)
        args.update(kw)
        got = pins_host_weights(choice, **args)
        assert got.why
        return got.pinned

    assert pins()  # a pipelined decode, a standby, the RAM: pinned
    assert not pins(pipelines=False)  # stock llama.cpp: pinning buys a single token nothing
    assert not pins(standby=False)  # every NPC would wait out the longer reload
    assert not pins(available_ram=enough - 1) and not pins(available_ram=None)
    assert not pins(vision_borrow=True)  # two reloads in every image line's first token
    # NPCs talking together stream the host weights in their decode steps, pipelined or not
    assert pins(talking=4, pipelines=False, standby=False)
    assert not pins(talking=4, vision_borrow=True)
    # the player's (or the developer's) choice is kept, whatever auto would do
    assert pins("pinned", pipelines=False, available_ram=None)
    assert not pins("mapped")
    with pytest.raises(ValueError, match="host weights"):
        pins("locked")
    # `serve --host-weights` offers exactly these (the CLI spells them out: it imports no
    # planner before a command runs)
    from igi_sdk.arbiter.ladder import HOST_WEIGHTS
    from igi_sdk.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    action = next(a for a in serve._actions if a.dest == "host_weights")
    assert tuple(action.choices) == HOST_WEIGHTS and action.default == "auto"


def test_a_pinned_ladder_on_a_pipelining_llama_cpp_climbs_through_pipelined_rungs(
        tmp_path) -> None:
    import dataclasses

    from igi_sdk.arbiter.ladder import arbiter_workload
    from igi_sdk.model import write_synthetic_gguf
    from tests.test_planner import PIPE_PROFILE

    inv = read_inventory(write_synthetic_gguf(tmp_path / "l8b.gguf", "llama3-8b", data=False))
    wl = dataclasses.replace(arbiter_workload(1152), pipelined=True)
    mapped = PlanLadder.build(inv, PIPE_PROFILE, wl, step=512 * MIB, cap=6 * GIB)
    pinned = PlanLadder.build(inv, PIPE_PROFILE, dataclasses.replace(wl, pin_host=True),
                              step=512 * MIB, cap=6 * GIB)
    assert not any(r.plan.decode_streamed or r.plan.pinned_host for r in mapped.rungs)
    streamed = [r for r in pinned.rungs if r.plan.decode_streamed]
    assert streamed and all(r.plan.pinned_host for r in streamed)
    assert not pinned.cpu.plan.pinned_host  # the standby computes from the file's pages
    for r in streamed:  # at a streaming rung's VRAM the mapped ladder has nothing as fast
        assert mapped.best_within(r.vram).turn_s > r.turn_s
    # rungs that differ only in what they stream are told apart
    keys = [(r.plan.gpu_tensors, r.plan.decode_streamed) for r in pinned.rungs]
    assert len(keys) == len(set(keys))
