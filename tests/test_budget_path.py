"""One VRAM budget path: `chat/plan --vram`, a fixed `load_model.vram_budget` and every GPU rung
of the arbiter's ladder are planned by the same checked function, with one typical-prompt rule;
under the arbiter `serve --vram` and `load_model.vram_budget` are caps (CPU CI: a profile and a
scripted VRAM trace stand in for the GPU)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from igi_sdk.arbiter import PlanLadder
from igi_sdk.arbiter.ladder import arbiter_workload
from igi_sdk.client import Client
from igi_sdk.errors import BudgetTooSmallError
from igi_sdk.model import read_inventory, spec_with, write_synthetic_gguf
from igi_sdk.planner import Plan, PlanResult, Workload, typical_prompt
from igi_sdk.tuning import autoplan
from igi_sdk.tuning.autoplan import Beside, BudgetPlanner, DryRun
from tests.sidecars import start_sidecar, stop
from tests.test_planner import GPU_PROFILE

MIB = 1024**2
GIB = 1024**3
CAP = 2 * GIB


# --- one typical-prompt rule ---------------------------------------------------------------------


@pytest.mark.parametrize("n_ctx", [256, 2048, 4096, 16384])
def test_the_ladder_plans_the_typical_prompt(n_ctx: int) -> None:
    assert arbiter_workload(n_ctx).prompt_tokens == typical_prompt(n_ctx)


def test_load_model_and_chat_plan_the_typical_prompt(tiny_llama, monkeypatch) -> None:
    """`plan_for_model` (a fixed load_model budget, `chat --vram`) hands the budget path a
    workload with the same prompt as the ladder's."""
    seen: list[Workload] = []

    class Gpu:
        free_bytes = 8 * GIB

    def checked(path, inv, prof, budget, wl, settings, measure=None) -> PlanResult:
        seen.append(wl)
        return PlanResult(Plan.all_cpu(), [], budget, 0)

    monkeypatch.setattr(autoplan._native, "backend_started", lambda: True)
    monkeypatch.setattr(autoplan, "first_gpu", lambda: Gpu())
    monkeypatch.setattr(autoplan, "with_threshold_in_effect", lambda wl: wl)
    monkeypatch.setattr(autoplan, "plan_checked", checked)
    for n_ctx in (512, 4096, 32768):
        autoplan.plan_for_model(tiny_llama, read_inventory(tiny_llama), budget=GIB,
                                n_ctx=n_ctx, max_sessions=2, profile=GPU_PROFILE)
        assert seen[-1].prompt_tokens == typical_prompt(n_ctx) == \
            arbiter_workload(n_ctx).prompt_tokens


def test_plan_cli_plans_the_typical_prompt(tiny_llama, tmp_path, capsys) -> None:
    from igi_sdk.cli import main

    prof = tmp_path / "p.json"
    prof.write_text(GPU_PROFILE.model_dump_json())
    assert main(["plan", str(tiny_llama), "--vram", "1GiB", "--ctx", "2048",
                 "--profile", str(prof)]) == 0
    assert f"prompt {typical_prompt(2048)} tokens" in capsys.readouterr().out


def test_the_rule_is_written_once() -> None:
    root = Path(__file__).resolve().parents[1] / "igi_sdk"
    writers = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
               if "min(1024, " in p.read_text()]
    assert writers == ["planner/planner.py"]


# --- one planning path ---------------------------------------------------------------------------


def test_what_is_beside_the_model_comes_off_the_budget_once(tiny_llama) -> None:
    """The draft's and the encoder's VRAM come off the budget in the budget path (the plan's
    `vram_bytes` names them and counts them in its total); a budget they leave too little of is
    a typed error naming them."""
    inv, wl = read_inventory(tiny_llama), Workload(n_ctx=512)
    alone = BudgetPlanner(inv, GPU_PROFILE, wl)
    beside = BudgetPlanner(inv, GPU_PROFILE, wl, beside=Beside(draft=40 * MIB, encoder=60 * MIB))
    budget = alone(64 * GIB).minimum_bytes + GIB
    plan = beside(budget).best
    assert plan.vram_bytes["draft"] == 40 * MIB and plan.vram_bytes["encoder"] == 60 * MIB
    assert plan.vram_bytes["total"] <= budget
    assert beside(budget).minimum_bytes == alone(budget).minimum_bytes + 100 * MIB
    assert beside(None).best == alone(None).best  # the CPU plan holds neither
    with pytest.raises(BudgetTooSmallError, match="vision encoder") as e:
        beside(alone(budget).minimum_bytes + 50 * MIB)
    assert e.value.minimum_bytes == alone(budget).minimum_bytes + 100 * MIB


def test_every_gpu_rung_is_dry_run_checked_once_per_placement(tiny_llama, monkeypatch) -> None:
    """With a GPU, the ladder's rungs take the checked path: each rung's compute buffer is the
    dry run's, and one dry run per placement keeps the build fast."""
    inv, wl = read_inventory(tiny_llama), arbiter_workload(2048, 8)
    measured: dict[str, int] = {}
    runs: list[str] = []

    def key(plan: Plan) -> str:
        return plan.model_dump_json(exclude={"name", "predicted", "vram_bytes"})

    def measure(path, inv_, plan, settings) -> int:
        runs.append(key(plan))
        measured[key(plan)] = int(plan.vram_bytes["compute"] * 1.2)  # more than estimated
        return measured[key(plan)]

    monkeypatch.setattr(autoplan.loader, "first_gpu", lambda: object())
    monkeypatch.setattr(autoplan, "measured_compute", measure)
    settings = autoplan.ContextSettings(2048, 8, 512, 1, n_outputs=8)
    planner = BudgetPlanner(inv, GPU_PROFILE, wl, check=DryRun(tiny_llama, settings))
    ladder = PlanLadder.build(inv, GPU_PROFILE, wl, step=16 * MIB, planner=planner)
    assert len(ladder.rungs) > 1
    assert len(runs) == len(set(runs))  # never the same placement twice
    for rung in ladder.rungs[1:]:
        v = rung.plan.vram_bytes
        assert v["compute"] == measured[key(rung.plan)] and rung.vram == v["total"]


def test_a_capped_ladder_plans_nothing_above_the_cap(default_model) -> None:
    inv, wl = read_inventory(default_model), arbiter_workload(2048, 8)
    full = PlanLadder.build(inv, GPU_PROFILE, wl, step=32 * MIB)
    assert len(full.rungs) > 2
    cap = full.rungs[-1].vram - 1
    capped = PlanLadder.build(inv, GPU_PROFILE, wl, step=32 * MIB, cap=cap)
    assert len(capped.rungs) > 1 and all(r.vram <= cap for r in capped.rungs)
    # below the smallest GPU rung: not an error, the CPU rung alone
    tiny = PlanLadder.build(inv, GPU_PROFILE, wl, cap=full.rungs[1].vram - 1)
    assert tiny.rungs == [full.cpu]


# --- the cap in the real sidecar -----------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A model, a profile whose fastest rung the 2 GiB cap leaves room to grow to (its fixed
    share shifted, which shifts every GPU rung alike), and that ladder."""
    d = tmp_path_factory.mktemp("budget")
    path = write_synthetic_gguf(d / "m.gguf", spec_with("tiny-llama", n_layers=4, n_embd=256,
                                                       n_ff=1024))
    inv, wl = read_inventory(path), arbiter_workload(2048, 8)  # the sidecar's: ctx 2048, 8 slots
    top = PlanLadder.build(inv, GPU_PROFILE, wl).rungs[-1].vram
    prof = GPU_PROFILE.model_copy(update={
        "gpu_fixed_bytes": GPU_PROFILE.gpu_fixed_bytes + CAP - 256 * MIB - top})
    (d / "profile.json").write_text(prof.model_dump_json())
    ladder = PlanLadder.build(inv, prof, wl)
    assert ladder.rungs[-1].vram == CAP - 256 * MIB and ladder.cpu.vram < CAP
    return d, ladder


def _trace(d: Path, name: str, total: int, points: list[tuple[float, int]]) -> Path:
    p = d / name
    p.write_text(json.dumps({"total": total, "points": [{"t": t, "game": g} for t, g in points]}))
    return p


def _watch(c: Client, until, seconds: float = 20.0) -> list[dict]:
    """The arbiter's stats every 50 ms until ``until(stats)`` holds (then 0.5 s more)."""
    seen: list[dict] = []
    deadline, done_at = time.monotonic() + seconds, None
    while time.monotonic() < deadline and (done_at is None or time.monotonic() < done_at):
        arb = c.stats().get("arbiter")
        assert arb is not None, "the arbiter is off"
        seen.append(arb)
        if done_at is None and arb["budget"] is not None and until(arb):
            done_at = time.monotonic() + 0.5
        time.sleep(0.05)
    assert done_at is not None, seen[-1]
    return seen


def test_serve_vram_caps_every_rung_and_the_live_budget(setup) -> None:
    """`serve --vram 2GiB --profile P --vram-trace T`: the game holds most of the device, then
    frees it all (7.75 GiB would be free to take): the budget stays 2 GiB and the model grows
    to the fastest rung within it, and no decision lands above it."""
    d, ladder = setup
    total = 8 * GIB
    trace = _trace(d, "frees.json", total, [(0.0, 7 * GIB), (0.6, 0)])
    proc = start_sidecar(d, f"ipc://{d / 'cap.sock'}", "--model", "m.gguf", "--vram-trace",
                         str(trace), "--profile", str(d / "profile.json"), "--grow-hold", "0.2",
                         "--vram", "2GiB")
    try:
        c = Client(f"ipc://{d / 'cap.sock'}", timeout=30)
        c.wait_ready(60)
        seen = _watch(c, lambda a: a["plan_vram"] == ladder.rungs[-1].vram)
        c.close()
    finally:
        stop(proc)
    assert all(a["budget"] is None or a["budget"] <= CAP for a in seen)
    assert all(a["plan_vram"] <= CAP for a in seen)
    decisions = [x for a in seen for x in a["decisions"]]
    assert decisions and all(x["budget"] <= CAP and x["vram"] <= CAP for x in decisions)
    assert seen[-1]["budget"] == CAP  # the cap, not what the trace frees


def test_load_model_vram_budget_under_the_arbiter_is_a_cap(setup) -> None:
    """`load_model.vram_budget` with an arbiter keeps it on (before: it fixed the plan and
    switched the arbiter off) and caps it at the least of it and `serve --vram`; one below the
    smallest GPU rung runs the model on the CPU rung, not an error."""
    d, ladder = setup
    trace = _trace(d, "free.json", 8 * GIB, [(0.0, 0)])
    proc = start_sidecar(d, f"ipc://{d / 'load.sock'}", "--model", "m.gguf", "--vram-trace",
                         str(trace),
                         "--profile", str(d / "profile.json"), "--grow-hold", "0.2",
                         "--vram", "2GiB")
    top = ladder.rungs[-1]
    try:
        c = Client(f"ipc://{d / 'load.sock'}", timeout=30)
        c.wait_ready(60)
        # a budget below the top rung: the arbiter stays on, within it
        below = top.vram - 1
        c.load_model("m.gguf", n_ctx=2048, vram_budget=below)
        seen = _watch(c, lambda a: a["budget"] == below, seconds=10)
        assert all(a["plan_vram"] <= below and a["budget"] <= below for a in seen)
        # a budget above serve's cap: the cap holds
        c.load_model("m.gguf", n_ctx=2048, vram_budget=4 * GIB)
        seen = _watch(c, lambda a: a["plan_vram"] == top.vram)
        assert all(a["budget"] <= CAP for a in seen) and seen[-1]["budget"] == CAP
        # a budget no GPU rung fits: the CPU rung
        c.load_model("m.gguf", n_ctx=2048, vram_budget=ladder.cpu.vram - 1)
        seen = _watch(c, lambda a: True, seconds=10)
        assert seen[-1]["plan_vram"] == ladder.cpu.vram and seen[-1]["rungs"] == 1
        c.close()
    finally:
        stop(proc)


def test_serve_vram_holds_without_the_arbiter(setup) -> None:
    """`serve --no-arbiter --vram X`: the cap fixes the plan on the one budget path (before,
    with no `load_model.vram_budget`, the model ran all on the CPU whatever X said)."""
    d, ladder = setup
    top = ladder.rungs[-1]
    proc = start_sidecar(d, f"ipc://{d / 'fixed.sock'}", "--model", "m.gguf", "--no-arbiter",
                         "--profile", str(d / "profile.json"), "--vram", str(top.vram))
    try:
        c = Client(f"ipc://{d / 'fixed.sock'}", timeout=30)
        c.wait_ready(60)
        st = c.stats()
        c.close()
    finally:
        stop(proc)
    assert "arbiter" not in st or not st["arbiter"]
    assert st["plan"] != "all-cpu", st["plan"]  # a GPU plan within the cap (CPU here)
