"""ggml's CPU threadpools, bound with ctypes, and :class:`ThreadRunner`, the engine thread's owner
of them and of the thread controller (runtime/thread_control.py).

Two builds of llama.cpp's CPU backend behave differently, and the runtime works with both:

- **OpenMP** (llama-cpp-python's default build): every graph runs in ``#pragma omp parallel``
  and an attached threadpool's polling level is ignored; libgomp reads its wait policy once,
  when it is loaded (igi_sdk/__init__.py sets a spin count unless the user chose). Only the thread
  count can change while running (``llama_set_n_threads`` before a step): where libgomp spins,
  the count follows the cores nobody else wants, a count the user fixed included
  (:func:`libgomp_wait`).
- **ggml's own threadpool** (built with ``-DGGML_OPENMP=OFF``): without an attached pool ggml
  creates and joins a throw-away pool for every graph; with one, its threads persist, wait for
  the next graph by polling ``poll`` x 128K pause instructions and then sleeping on a condition,
  and a graph may use fewer of them than the pool has. ``poll`` is fixed when a pool is made,
  so the runner keeps one pool per wait, made on first use with the most threads the controller
  may ask for, and attaches the one the controller picks between steps (the others are paused:
  their threads sleep). A paused pool is resumed by its next graph, so pausing the attached pool
  while no reply decodes makes an idle sidecar sleep whatever the wait.

Within a graph ggml's threads meet at spinning barriers in both builds (OpenMP: per libgomp's
policy): the wait decides only how threads idle between graphs; the thread count decides
whether a barrier waits for a thread that has no core.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import llama_cpp as _llama
from llama_cpp._ctypes_extensions import load_shared_library
from llama_cpp._ggml import libggml

from igi_sdk import omp_wait, threads
from igi_sdk.runtime.cpu_demand import DemandWindow, own_running, procs_running
from igi_sdk.runtime.thread_control import (
    POLL_LEVEL,
    ControlConfig,
    GameCpu,
    HostLoad,
    Setting,
    ThreadController,
    Wait,
)

log = logging.getLogger("igi_sdk.runtime")

GGML_MAX_N_THREADS = 512  # ggml.h of this build: the size of a pool's cpumask
OPENMP = "openmp"
THREADPOOL = "threadpool"
WAITS = ("auto", "spin", "poll", "sleep")


class ThreadpoolParams(ctypes.Structure):
    """``struct ggml_threadpool_params`` (ggml.h of this build)."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),  # enum ggml_sched_priority
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


def libgomp_wait() -> Wait:
    """How libgomp's idle threads wait, as its environment set it before it loaded (it reads
    it once): SLEEP where they sleep at once (OMP_WAIT_POLICY=PASSIVE or GOMP_SPINCOUNT=0), SPIN
    where they spin first (any spin count, what igi_sdk sets unless told otherwise, ACTIVE, or
    libgomp's own default of about 300,000 rounds)."""
    wait = omp_wait.in_effect(os.environ)
    if wait == "passive":
        return Wait.SLEEP
    try:
        return Wait.SLEEP if int(wait.removeprefix("spin")) == 0 else Wait.SPIN
    except ValueError:
        return Wait.SPIN  # "active", "infinity" (or libgomp's own default for what it cannot read)


def uses_openmp() -> bool:
    """Whether the loaded CPU backend runs its graphs with OpenMP (it says so in its features)."""
    info = llama_cpp.llama_print_system_info() or b""
    return b"OPENMP = 1" in info


class _Lib:
    """The few C functions the runner needs (none declared by llama-cpp-python)."""

    def __init__(self) -> None:
        cpu = libggml
        try:
            cpu.ggml_threadpool_new  # noqa: B018  (resolved through libggml's dependencies)
        except AttributeError:  # where the loader does not search dependencies (Windows)
            lib_dir = Path(llama_cpp.__file__).parent / "lib"
            cpu = load_shared_library("ggml-cpu", lib_dir)
        vp = ctypes.c_void_p
        self.params_init = _fn(cpu, "ggml_threadpool_params_init", None,
                               ctypes.POINTER(ThreadpoolParams), ctypes.c_int)
        self.new = _fn(cpu, "ggml_threadpool_new", vp, ctypes.POINTER(ThreadpoolParams))
        self.free = _fn(cpu, "ggml_threadpool_free", None, vp)
        self.pause = _fn(cpu, "ggml_threadpool_pause", None, vp)
        self.resume = _fn(cpu, "ggml_threadpool_resume", None, vp)
        self.attach = _fn(_llama._lib, "llama_attach_threadpool", None, vp, vp, vp)
        self.detach = _fn(_llama._lib, "llama_detach_threadpool", None, vp)


def _fn(lib: Any, name: str, restype: object, *argtypes: object) -> Any:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_lib: _Lib | None = None


def lib() -> _Lib:
    global _lib
    if _lib is None:
        _lib = _Lib()
    return _lib


class Pools:
    """One context's threadpools (one per wait, ``size`` threads each) or, in an OpenMP build,
    its thread count only. Engine thread only."""

    def __init__(self, ctx: Any, size: int, *, openmp: bool) -> None:
        self.ctx, self.size, self.openmp = ctx, size, openmp
        self._pools: dict[Wait, int] = {}
        self._attached: Wait | None = None
        self._threads = 0
        self.made_s = 0.0  # seconds spent making pools (their threads start at once)

    def apply(self, s: Setting) -> None:
        """Run the next graphs with ``s`` (threads capped at the pools' size)."""
        n = max(1, min(s.threads, self.size))
        if not self.openmp and s.wait is not self._attached:
            pool = self._pools.get(s.wait)
            if pool is None:
                pool = self._make(s.wait)
            if self._attached is not None:
                lib().pause(self._pools[self._attached])  # its threads sleep
            lib().attach(self.ctx, pool, pool)
            self._attached = s.wait
        if n != self._threads:
            llama_cpp.llama_set_n_threads(self.ctx, n, n)
            self._threads = n

    def _make(self, wait: Wait) -> int:
        t0 = time.perf_counter()
        p = ThreadpoolParams()
        lib().params_init(ctypes.byref(p), self.size)
        p.poll = POLL_LEVEL[wait]
        p.paused = True  # its threads sleep until its first graph resumes them
        pool = lib().new(ctypes.byref(p))
        if not pool:
            raise MemoryError(f"ggml could not make a pool of {self.size} threads")
        self._pools[wait] = pool
        self.made_s += time.perf_counter() - t0
        return pool

    def pause(self) -> None:
        """No graph is coming soon: the attached pool's threads sleep (its next graph wakes
        them). Nothing to do with OpenMP (its threads sleep by themselves, at once or after
        their spin)."""
        if self._attached is not None:
            lib().pause(self._pools[self._attached])

    def close(self, *, ctx_alive: bool) -> None:
        """Free the pools (detached first while the context lives; a freed context runs no
        graph, so its pools may go after it)."""
        if self._pools:
            if ctx_alive and self.ctx:
                lib().detach(self.ctx)
            for pool in self._pools.values():
                lib().free(pool)
        self._pools.clear()
        self._attached = None


@dataclass(frozen=True)
class ThreadStatus:
    mechanism: str  # "threadpool" | "openmp"
    wait_mode: str  # "auto" or the fixed wait
    setting: str  # threads x wait now
    ceiling: int
    other_cores: float | None
    other_runnable: float | None
    game_cores: int | None
    switches: int
    probes: int
    last_probe: str
    pool_make_ms: float


class ThreadRunner:
    """The engine thread's owner of the pools and the controller. Inputs from other threads
    (the host's load, the game's report) are single attribute writes of frozen values, read by
    the engine thread after each step: nothing calls into the engine."""

    def __init__(self, *, start_threads: int, max_threads: int, cpus: int, wait: str = "auto",
                 openmp: bool | None = None, adapt_threads: bool = True,
                 exact_threads: bool = False) -> None:
        if wait not in WAITS:
            from igi_sdk.errors import UsageError

            raise UsageError(f"wait {wait!r}: one of {', '.join(WAITS)}")
        self.openmp = uses_openmp() if openmp is None else openmp
        self.wait = wait
        if self.openmp:
            waits: tuple[Wait, ...] = (libgomp_wait(),)  # libgomp's own, read once at its load
        elif wait == "auto":
            waits = (Wait.SPIN, Wait.POLL, Wait.SLEEP)
        else:
            waits = (Wait(wait),)
        adapt_threads = adapt_threads and not exact_threads  # an exact count never moves
        size = max(start_threads, max_threads if adapt_threads else start_threads)
        self.size = size
        self.controller = ThreadController(
            ControlConfig(max_threads=size, cpus=cpus, waits=waits,
                          fixed_threads=not adapt_threads, exact_threads=exact_threads,
                          # ggml's pools burn their cores while steps run; libgomp's threads
                          # sleep after a bounded spin, so their CPU time says nothing of
                          # starving (the run queue does: runtime/cpu_demand.py)
                          spinning_barriers=not self.openmp),
            Setting(start_threads, waits[0] if len(waits) == 1 else
                    (Wait.SPIN if start_threads < cpus else Wait.SLEEP)))
        self._pools: Pools | None = None
        self.host_load: HostLoad | None = None  # written by the sampler thread
        self.game: GameCpu | None = None  # written by the frame handler
        self._seen_load: HostLoad | None = None
        self._busy_s = 0.0  # seconds of steps since the last load sample was taken in
        # replies are decoding (engine thread writes, the sampler reads): the run queue is
        # counted only then, when the ceiling matters, so that an idle sidecar costs nothing
        self.decoding = False
        self._seen_game: GameCpu | None = None
        self._sampler: LoadSampler | None = None

    # --- any thread --------------------------------------------------------------------------

    def report_game(self, game: GameCpu | None) -> None:
        self.game = game  # one write, read whole by the engine thread

    def status(self) -> dict[str, object]:
        c = self.controller.status()
        made = self._pools.made_s if self._pools is not None else 0.0
        setting = c.setting
        if self.openmp:  # the wait is libgomp's, read once at start
            count = os.environ.get("GOMP_SPINCOUNT", "").strip()
            policy = (f"spin{count}" if count else
                      os.environ.get("OMP_WAIT_POLICY", "default").strip().lower())
            setting = f"{setting.split('x')[0]}x{policy}"
        # the latest readings as they arrived (the controller takes them in after its next step)
        load, game = self.host_load, self.game
        other = round(load.other_cores, 2) if load is not None else c.other_cores
        runnable = c.other_runnable
        if load is not None:
            runnable = None if load.other_runnable is None else round(load.other_runnable, 2)
        game_cores = (game.cores(self.controller.config.cpus) if game is not None
                      else None)
        return asdict(ThreadStatus(OPENMP if self.openmp else THREADPOOL, self.wait, setting,
                                   c.ceiling, other, runnable, game_cores, c.switches,
                                   c.probes, c.last_probe, round(made * 1000, 3)))

    # --- engine thread -----------------------------------------------------------------------

    @classmethod
    def for_engine(cls, n_threads: int, wait: str, adapt_threads: bool | None,
                   exact_threads: bool = False) -> ThreadRunner:
        """The runner for an engine's settings (runtime/config.py): ``n_threads`` 0 = the
        runtime's default; the count adapts when ``adapt_threads`` (None: when it is 0), and
        never moves with ``exact_threads``.

        Adapting, it may use every CPU but one (the game's main thread keeps a core): the
        host's load, sampled every second, and the game's reports lower it at once, so the
        cautious start-up default (half the CPUs from 4 up) would only leave idle cores idle.
        ``IGI_SDK_THREADS`` stays a ceiling."""
        from igi_sdk.runtime.loader import THREADS_ENV, default_threads, usable_cpus

        adapt = n_threads == 0 if adapt_threads is None else adapt_threads
        adapt = adapt and not exact_threads
        cpus = usable_cpus()
        most = default_threads() if os.environ.get(THREADS_ENV, "").strip() else max(1, cpus - 1)
        start = n_threads or (most if adapt else default_threads())
        return cls(start_threads=start, max_threads=max(start, most if adapt else start),
                   cpus=cpus, wait=wait, adapt_threads=adapt, exact_threads=exact_threads)

    def attach(self, ctx: Any) -> None:
        """A context was made (the previous one, if any, is freed): its pools follow the
        controller from its first step."""
        threads.expect(threads.ENGINE, "attaching threadpools")
        if self._pools is not None:
            self._pools.close(ctx_alive=False)
        self._pools = Pools(ctx, self.size, openmp=self.openmp)
        self._pools.apply(self.controller.setting)
        if self._sampler is None and self.controller.config.cpus > 1:
            self._sampler = LoadSampler(self)
            self._sampler.start()


    def after_step(self, n_tokens: int, seconds: float, *, decode: bool) -> None:
        """A step ran: learn from it (decode steps only) and set up the next one."""
        c = self.controller
        load, game = self.host_load, self.game
        self._busy_s += seconds
        if load is not self._seen_load and load is not None:
            self._seen_load = load
            c.observe_load(load, busy_s=self._busy_s)
            self._busy_s = 0.0
        if game is not self._seen_game:
            self._seen_game = game
            c.observe_game(game)
        if decode:
            self.decoding = True
            c.observe_step(n_tokens, seconds)
        if self._pools is not None:
            self._pools.apply(c.setting)

    @property
    def count(self) -> int:
        """Threads the next graph runs with."""
        return max(1, min(self.controller.setting.threads, self.size))

    def idle(self) -> None:
        """No reply is decoding: no thread may spin for a graph that is not coming."""
        self.decoding = False
        if self._pools is not None:
            self._pools.pause()

    def close(self) -> None:
        """The engine ends (its context is freed)."""
        if self._pools is not None:
            self._pools.close(ctx_alive=False)
            self._pools = None
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None


class LoadSampler:
    """Samples the host's load from other processes every ``period_s`` (a thread of its own:
    psutil's per-CPU read costs too much for the engine thread's every step): their CPU time
    over the window, and (while replies decode) their runnable threads, counted
    ``demand_samples`` times in it.

    The first window is short (``first_s``) and counts the runnable threads whatever the engine
    does: a context is made right before its first prompt, and until a reading arrives the
    steps run at the start-up count. On an H200 host with 14 of 16 CPUs busy, a turn that began
    with a one-second window spent it at 15 threads, then at a count misread from CPU time our
    own threads took from the others: 8.5 tok/s against 10.1 for the count it settled on."""

    def __init__(self, runner: ThreadRunner, period_s: float = 1.0,
                 demand_samples: int = 10, first_s: float = 0.1) -> None:
        self.runner, self.period_s, self.first_s = runner, period_s, first_s
        self.demand_samples = max(1, demand_samples)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="igi-cpu-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            import psutil
        except ImportError:
            return  # step times alone steer the controller
        from igi_sdk.cpus import affinity

        ids = affinity()
        me = psutil.Process()
        psutil.cpu_percent(percpu=True)
        own0, t0 = _cpu_seconds(me), time.monotonic()
        demand = DemandWindow()
        kernel_cpus = os.cpu_count() or 1
        counted = procs_running() is not None  # no /proc: not counted at all
        first = True
        while True:
            tick = (self.first_s if first else self.period_s) / self.demand_samples
            for _ in range(self.demand_samples):
                if self._stop.wait(tick):
                    return
                # ~1 ms a count with 40 threads: while replies decode, and in the first window
                if counted and (first or self.runner.decoding):
                    demand.add(procs_running(), own_running())
            first = False
            loads = psutil.cpu_percent(percpu=True)
            own1, t1 = _cpu_seconds(me), time.monotonic()
            if ids is not None and all(i < len(loads) for i in ids):
                loads = [loads[i] for i in ids]
            own = (own1 - own0) / max(t1 - t0, 1e-3)
            t_prev = t0
            own0, t0 = own1, t1
            other = max(0.0, sum(min(x, 100.0) for x in loads) / 100.0 - own)
            self.runner.host_load = HostLoad(
                len(loads), other, own_cores=own, window_s=max(t1 - t_prev, 1e-3),
                other_runnable=demand.other_runnable(len(loads), kernel_cpus))


def _cpu_seconds(p: Any) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)

