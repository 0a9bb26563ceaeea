"""How many threads the next decode steps run and how their idle threads wait (pure).

Why it changes while running: one fixed policy loses somewhere. On idle cores, threads that
spin between graphs decode faster than threads that sleep; on cores the game holds, a spinning
thread burns the core a descheduled one needs and decode collapses. Only the running sidecar
sees which case it is in, from three inputs that arrive as typed values:

- each decode step's measured time (:meth:`ThreadController.observe_step`), compared with the
  best time seen for the same kind of step (the number of tokens in the batch) under the same
  setting: the step time itself tells when a setting collapses or pays;
- the host's load from other processes (:class:`HostLoad`, sampled off the engine thread): the
  CPU time they got and, where the OS counts it, how many of their threads want a CPU (what they
  got shrinks while our threads spin; what they want does not: runtime/cpu_demand.py);
- what the game says it keeps busy (:class:`GameCpu`, from its ``frame`` reports).

The load and the game's report set a ceiling on the thread count (cores the game holds are
not planned for; an increase applies at once, a decrease only once it has held for two
samples). Within it, the controller keeps the setting it has, and every so often probes one
alternative for a few steps (another wait, one thread more or fewer): the probe is kept when
it is faster by a margin (hysteresis), and a probe that loses is tried again later and later
(backoff), so a policy that collapses costs a step or two per probe. A setting whose steps
turn much slower than its best (the game took the cores) makes the next probe come at once.

No I/O and no llama.cpp here; runtime/threadpool.py applies the setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from igi_sdk.errors import UsageError


class Wait(str, Enum):
    """How a pool's idle threads wait for the next graph (between steps; within a graph,
    ggml's threads meet at spinning barriers whatever the wait)."""

    SPIN = "spin"  # poll long: the next step starts at once, an idle core is burnt meanwhile
    POLL = "poll"  # poll briefly (about one step's gap), then sleep
    SLEEP = "sleep"  # sleep at once: a wake-up per graph, no core burnt


# ggml's polling level per wait (0..100; a pool polls 128K x level pause instructions)
POLL_LEVEL = {Wait.SPIN: 100, Wait.POLL: 1, Wait.SLEEP: 0}

# core-equivalents of background noise that do not cost a thread (as guest/cores.py)
NOISE_CORES = 0.25
# runnable threads of background noise (kernel workers, short wake-ups) that do not cost one
NOISE_RUNNABLE = 0.5


@dataclass(frozen=True)
class Setting:
    threads: int
    wait: Wait

    def __str__(self) -> str:
        return f"{self.threads}x{self.wait.value}"


@dataclass(frozen=True)
class HostLoad:
    """The load of everything but this process: ``other_cores`` cores' worth of CPU time (the
    sum of the per-CPU loads minus this process's own use over the same window) on ``cpus``
    CPUs this process may use, and ``other_runnable``: their threads that wanted a CPU, on
    average over the window (None where the OS does not count them)."""

    cpus: int
    other_cores: float
    own_cores: float = 0.0  # this process's CPU time over the window, in cores
    window_s: float = 1.0
    other_runnable: float | None = None

    def __post_init__(self) -> None:
        if self.cpus < 1 or not (0.0 <= self.other_cores) or math.isnan(self.other_cores):
            raise UsageError(f"a host load of {self.other_cores} cores on {self.cpus} CPUs")
        if not (self.own_cores >= 0.0) or not (self.window_s > 0.0):
            raise UsageError(f"own use {self.own_cores} cores over {self.window_s} s")
        if self.other_runnable is not None and not (self.other_runnable >= 0.0):
            raise UsageError(f"{self.other_runnable} runnable threads of other processes")

    def held(self) -> int:
        """Cores the other processes hold: what they got, or what they want where that is
        more (a spinning pool of ours takes CPU time from them, not their demand)."""
        held = math.ceil(self.other_cores - NOISE_CORES)
        if self.other_runnable is not None:
            held = max(held, math.ceil(self.other_runnable - NOISE_RUNNABLE))
        return max(0, held)


@dataclass(frozen=True)
class GameCpu:
    """What the game reports of its CPU use: the threads it keeps busy and/or the share of the
    machine's CPU time it uses (0..1). Either may be None (not reported)."""

    busy_threads: int | None = None
    cpu_share: float | None = None

    def __post_init__(self) -> None:
        if self.busy_threads is not None and self.busy_threads < 0:
            raise UsageError(f"the game reports {self.busy_threads} busy threads")
        if self.cpu_share is not None and not (0.0 <= self.cpu_share <= 1.0):
            raise UsageError(f"the game reports a CPU share of {self.cpu_share}")

    def cores(self, cpus: int) -> int:
        """Cores the game holds, by its own report."""
        by_threads = self.busy_threads or 0
        by_share = math.ceil(self.cpu_share * cpus - NOISE_CORES) if self.cpu_share else 0
        return max(by_threads, by_share, 0)


@dataclass(frozen=True)
class ControlConfig:
    max_threads: int  # never more (the configured or default count)
    cpus: int  # usable CPUs
    waits: tuple[Wait, ...] = (Wait.SPIN, Wait.POLL, Wait.SLEEP)  # one: the wait is fixed
    # the user set the count: only the wait adapts; where the wait cannot leave SPIN (libgomp
    # told to spin) the count is a ceiling instead, lowered while others want the cores
    fixed_threads: bool = False
    # the user's count holds even where the wait cannot leave SPIN (EngineConfig.exact_threads:
    # bit-exact replies need a count that never moves)
    exact_threads: bool = False
    probe_every: int = 48  # decode steps between probes (before backoff)
    probe_steps: int = 4  # steps a probe runs (its first pays the switch and is not counted)
    max_backoff: int = 16  # a losing probe waits up to this many times probe_every
    margin: float = 0.08  # a probe must be this much faster to be kept
    collapse: float = 2.0  # steps this many times their best: probe at once
    # ggml's own threadpools: threads meet at spinning barriers within a graph, so a thread the
    # OS deschedules stalls all the others (OpenMP builds: False; where libgomp spins, the
    # count follows the free cores instead: waits == (SPIN,))
    spinning_barriers: bool = False
    starved: float = 0.75  # spinning threads that get less than this share of a core each
    starved_hold: int = 8  # load samples a starved cap holds (doubling while it recurs)

    def __post_init__(self) -> None:
        if self.max_threads < 1 or self.cpus < 1 or not self.waits:
            raise UsageError(f"a thread controller for {self.max_threads} threads on "
                             f"{self.cpus} CPUs and waits {self.waits}")
        if self.exact_threads and not self.fixed_threads:
            raise UsageError("an exact thread count is a fixed one (fixed_threads)")


@dataclass
class _Arm:
    """What one setting has shown, per kind of step."""

    ewma: dict[int, float] = field(default_factory=dict)
    best: dict[int, float] = field(default_factory=dict)

    def add(self, kind: int, seconds: float) -> None:
        old = self.ewma.get(kind)
        self.ewma[kind] = seconds if old is None else 0.7 * old + 0.3 * seconds
        best = self.best.get(kind)
        # the best drifts up slowly: a longer context makes every step a little slower
        self.best[kind] = seconds if best is None else min(best * 1.002, seconds)


@dataclass
class _Probe:
    setting: Setting
    back_to: Setting
    left: int
    ratios: list[float] = field(default_factory=list)
    warm: bool = False  # the switch step has run


@dataclass(frozen=True)
class ControlStatus:
    setting: str
    ceiling: int
    other_cores: float | None
    other_runnable: float | None
    game_cores: int | None
    switches: int
    probes: int
    last_probe: str


class ThreadController:
    """The policy (see the module doc). Methods are called by one thread (the engine's)."""

    def __init__(self, config: ControlConfig, start: Setting | None = None) -> None:
        self.config = config
        self._arms: dict[Setting, _Arm] = {}
        self._load: HostLoad | None = None
        self._game: GameCpu | None = None
        self._ceiling = config.max_threads
        self._lower_pending: int | None = None  # a lower load seen once
        self._probe: _Probe | None = None
        self._since_probe = 0
        self._backoff: dict[Setting, int] = {}  # multiplier of probe_every per candidate
        self._next_candidate = 0
        # no candidate is due before this many steps since the last probe, while the setting
        # and the ceiling are these (the backoffs change only as a probe ends, or are reset)
        self._backed_off_until = 0
        self._backed_off_for: tuple[Setting, int] | None = None
        self._bad_steps = 0
        self._samples = 0
        self._starved_cap: int | None = None  # threads the OS actually gave us, lately
        self._starved_until = 0
        self._starved_hold = config.starved_hold
        # the setting the steps had chosen before the load forced fewer threads: restored as
        # the load lets it (one noisy load sample must not cost the rest of a reply)
        self._forced_from: Setting | None = None
        self.switches = 0
        self.probes = 0
        self.last_probe = ""
        self._current = start or Setting(config.max_threads, self._default_wait())

    # ------------------------------------------------------------------ inputs

    @property
    def setting(self) -> Setting:
        """The setting for the next step (a probe's while one runs)."""
        return self._probe.setting if self._probe is not None else self._current

    def observe_load(self, load: HostLoad, busy_s: float = 0.0) -> Setting:
        """The host's load over a window in which steps ran for ``busy_s`` seconds."""
        self._load = load
        self._samples += 1
        self._check_starved(load, busy_s)
        return self._update_ceiling()

    def _check_starved(self, load: HostLoad, busy_s: float) -> None:
        """Spinning threads burn their core the whole time steps run: one that got much less
        was descheduled, and every barrier waited for it. The load of the others cannot show
        this (they get less CPU while ours spin), the CPU time we got can: the threads are
        capped at the cores we got, held a while (and longer each time it recurs)."""
        c, cur = self.config, self.setting
        frac = min(1.0, busy_s / load.window_s)
        if self._starved_cap is not None and self._samples >= self._starved_until:
            self._starved_cap = None  # try more again: the others may have gone
        if not c.spinning_barriers or cur.wait is not Wait.SPIN or frac < 0.6 or cur.threads < 2:
            return
        if load.own_cores >= c.starved * frac * cur.threads:
            return
        got = max(1, min(cur.threads - 1, math.floor(load.own_cores / frac)))
        if self._starved_cap is not None:
            self._starved_hold = min(self._starved_hold * 2, 64 * c.starved_hold)
        self._starved_cap = got
        self._starved_until = self._samples + self._starved_hold

    def observe_game(self, game: GameCpu | None) -> Setting:
        self._game = game
        return self._update_ceiling()

    def observe_step(self, kind: int, seconds: float) -> Setting:
        """A decode step of ``kind`` (tokens in its batch) took ``seconds`` under
        :attr:`setting`; returns the setting for the next step."""
        if kind < 1 or not (seconds > 0.0) or math.isinf(seconds):
            return self.setting  # nothing to learn from
        kind = min(kind, 64)
        if self._probe is not None:
            self._probe_step(kind, seconds)
            return self.setting
        arm = self._arms.get(self._current)
        if arm is None:
            arm = self._arms[self._current] = _Arm()
        best = arm.best.get(kind)
        arm.add(kind, seconds)
        self._since_probe += 1
        collapsed = best is not None and seconds > self.config.collapse * best
        self._bad_steps = self._bad_steps + 1 if collapsed else 0
        if self._bad_steps >= 2:  # this setting stopped paying: look for another now
            self._bad_steps = 0
            self._start_probe(self._safer(self._current))
        elif self._since_probe >= self.config.probe_every and (
                self._since_probe >= self._backed_off_until
                or self._backed_off_for != (self._current, self._ceiling)):
            cand = self._next_alternative()
            if cand is None:  # every candidate backs off: none is due before the first one
                # (found once, not on every decode step until then: each step's own host
                # work comes out of a decode on a CPU whose cores all run llama.cpp)
                self._backed_off_for = (self._current, self._ceiling)
                self._backed_off_until = min(
                    (self.config.probe_every * self._backoff.get(c, 1)
                     for c in self._candidates()), default=1 << 62)
            self._start_probe(cand)
        return self.setting

    def status(self) -> ControlStatus:
        return ControlStatus(
            str(self.setting), self._ceiling,
            round(self._load.other_cores, 2) if self._load is not None else None,
            (round(self._load.other_runnable, 2) if self._load is not None
             and self._load.other_runnable is not None else None),
            self._game.cores(self.config.cpus) if self._game is not None else None,
            self.switches, self.probes, self.last_probe)

    # ------------------------------------------------------------------ ceiling

    def _held(self) -> int:
        cpus = self._load.cpus if self._load is not None else self.config.cpus
        held = 0
        if self._load is not None:
            held = max(held, self._load.held())
        if self._game is not None:
            held = max(held, self._game.cores(cpus))
        return held

    def _update_ceiling(self) -> Setting:
        c = self.config
        cpus = self._load.cpus if self._load is not None else c.cpus
        target = max(1, min(c.max_threads, cpus - self._held()))
        if self._starved_cap is not None:
            target = min(target, self._starved_cap)
        if c.fixed_threads and (c.exact_threads or not self._spin_only()):
            target = c.max_threads
        if target < self._ceiling:  # the game took cores: give them back at once
            self._ceiling, self._lower_pending = target, None
            self._reset_exploration()
        elif target > self._ceiling:  # cores came free: only once it has held for 2 samples
            if self._lower_pending is not None:
                self._ceiling, self._lower_pending = min(target, self._lower_pending), None
                self._reset_exploration()
            else:
                self._lower_pending = target
        else:
            self._lower_pending = None
        # a busy host: threads that spin while another process wants the core lose it
        crowded = self._held() + self._current.threads > cpus
        if self._current.threads > self._ceiling or (crowded and c.waits != (self._current.wait,)):
            threads = min(self._current.threads, self._ceiling)
            if threads < self._current.threads and self._forced_from is None:
                self._forced_from = self._current
            self._switch(Setting(threads, self._wait_beside_others(threads)))
        elif self._forced_from is not None and self._ceiling > self._current.threads:
            # the load that forced the count down eased: back towards what the steps had chosen
            # (on an H200 host beside 14 busy CPUs, one sample that read 14.6 runnable threads
            # moved 2 threads to 1 and it stayed there: 6.8 tok/s against 10.3)
            back = self._forced_from
            threads = min(self._ceiling, back.threads)
            if threads >= back.threads:
                self._forced_from = None
            self._switch(Setting(threads, back.wait if self._held() + threads <= cpus
                                 else self._wait_beside_others(threads)))
        elif self._ceiling > self._current.threads and (c.fixed_threads or not self._arms.get(
                Setting(self._ceiling, self._current.wait))):
            # cores came free and the count there is untried (probes judge it), or the user's
            # count was lowered only while others wanted its cores: take them
            self._switch(Setting(self._ceiling, self._default_wait()))
        return self.setting

    def _wait_beside_others(self, threads: int) -> Wait:
        """The wait for ``threads`` threads: sleeping where they and the others' want more cores
        than there are (a spinning thread then takes the core another process needs)."""
        cpus = self._load.cpus if self._load is not None else self.config.cpus
        if self._held() + threads > cpus and Wait.SLEEP in self.config.waits:
            return Wait.SLEEP
        return self._current.wait

    def _spin_only(self) -> bool:
        """The threads spin whatever the controller decides (libgomp told to spin): a thread
        that loses its core to another process stalls the others at every barrier, so the count
        must follow the free cores, the user's included (2 fixed threads beside one busy core of
        2: 2.6 tok/s spinning, 98 sleeping, 120 on one thread)."""
        return self.config.waits == (Wait.SPIN,)

    def _reset_exploration(self) -> None:
        """New conditions: what lost before may pay now."""
        self._backoff.clear()
        self._backed_off_until = 0
        self._since_probe = 0
        for arm in self._arms.values():  # times under the old load say little now
            arm.best.clear()
            arm.ewma.clear()

    def _default_wait(self) -> Wait:
        waits = self.config.waits
        if len(waits) == 1:
            return waits[0]
        cpus = self._load.cpus if self._load is not None else self.config.cpus
        threads = min(self.config.max_threads, self._ceiling)
        if self._held() + threads <= cpus and Wait.SPIN in waits:
            return Wait.SPIN
        return Wait.SLEEP if Wait.SLEEP in waits else waits[-1]

    def _switch(self, to: Setting) -> None:
        self._probe = None
        if to != self._current:
            self._current = to
            self.switches += 1
            self._bad_steps = 0

    # ------------------------------------------------------------------ probes

    def _candidates(self) -> list[Setting]:
        cur, c = self._current, self.config
        out = [Setting(cur.threads, w) for w in c.waits if w != cur.wait]
        if not c.fixed_threads:
            if cur.threads + 1 <= self._ceiling:
                out.append(Setting(cur.threads + 1, cur.wait))
            if cur.threads > 1:
                out.append(Setting(cur.threads - 1, cur.wait))
        return out

    def _safer(self, cur: Setting) -> Setting | None:
        """Fewer threads, else a wait that burns less."""
        if not self.config.fixed_threads and cur.threads > 1:
            return Setting(cur.threads - 1, cur.wait)
        order = [Wait.SLEEP, Wait.POLL]
        for w in order:
            if w in self.config.waits and w != cur.wait:
                return Setting(cur.threads, w)
        return None

    def _next_alternative(self) -> Setting | None:
        """The next candidate whose backoff has run out (round robin)."""
        cands = self._candidates()
        for i in range(len(cands)):
            cand = cands[(self._next_candidate + i) % len(cands)]
            if self._since_probe >= self.config.probe_every * self._backoff.get(cand, 1):
                self._next_candidate = (self._next_candidate + i + 1) % max(1, len(cands))
                return cand
        return None

    def _start_probe(self, cand: Setting | None) -> None:
        if cand is None:  # nothing to try (one thread, one wait) or every candidate waits
            return
        self._since_probe = 0
        self.probes += 1
        self._probe = _Probe(cand, self._current, self.config.probe_steps)

    def _probe_step(self, kind: int, seconds: float) -> None:
        p = self._probe
        assert p is not None
        arm = self._arms.setdefault(p.setting, _Arm())
        arm.add(kind, seconds)
        p.left -= 1
        ref = self._arms.get(p.back_to, _Arm()).ewma.get(kind)
        if p.warm and ref is not None:
            p.ratios.append(seconds / ref)
        p.warm = True
        losing = bool(p.ratios) and p.ratios[-1] > 1.0 + 4 * self.config.margin
        if p.left > 0 and not losing:
            return
        self._backed_off_until = 0  # the backoffs change now
        ratios = sorted(p.ratios)
        score = ratios[len(ratios) // 2] if ratios else 1.0
        if score < 1.0 - self.config.margin:
            self.last_probe = f"{p.setting} kept ({score:.2f}x the time of {p.back_to})"
            self._backoff.pop(p.setting, None)
            self._backoff[p.back_to] = 1
            self._forced_from = None  # chosen by steps under today's load
            self._switch(p.setting)
        else:
            self.last_probe = f"{p.setting} lost ({score:.2f}x the time of {p.back_to})"
            self._backoff[p.setting] = min(self._backoff.get(p.setting, 1) * 2,
                                           self.config.max_backoff)
            self._probe = None
