"""Scale-out through real routers: vLLM's router and SGLang's model gateway (their PyPI
packages) on loopback in front of two replicas (``igi-sdk serve --http`` on the default model),
and the sidecar (``--upstream <router> --upstream-policy remote``) between them and the NPCs.

Each replica's own engine counts the lines it answered (its ``stats``), and its reply's
``usage`` says what it reused of its prefix cache: each NPC stays on one replica and reuses its
KV; with one replica killed mid-conversation, its NPCs move to the other with their
transcripts and no line is lost."""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from igi_sdk.client import BridgeError, Client
from tests.sidecars import free_port, start_sidecar, stop, wait_http

NPCS, TURNS, KILL_AFTER = 8, 6, 3
MAX_TOKENS = 8
# an NPC's persona, as long as a game's: what a replica keeps of a conversation is mostly this
LORE = ("Ashford is a river town of millers, smiths and ferrymen under the old stone bridge. "
        "The harvest was poor this year, the baron raised the bridge toll twice, and wolves "
        "were seen on the north road after the first frost. The inn is the Drowned Lantern, "
        "kept by the widow Maelis; the temple bell cracked in the storm and nobody has paid "
        "to recast it. Strangers are watched but served. You know the gossip of the market, "
        "the price of bread and who owes whom. You never speak of the old mine. Stay in "
        "character, speak plainly and answer in one short sentence.")


def _router_cmd(kind: str, port: int, workers: list[str]) -> list[str]:
    """The routers as the docs' recipes start them. A worker that refuses two requests in a
    row has its circuit opened, so the router's own retry of a line goes to another worker at
    once; without it the router retried the dead one until its health check (every second)
    took it out: 2 to 7 refused tries and 0.1 to 1.5 s more for the first moved NPC. Their
    metrics exporters take a free port (both default to 29000: a second router, or anything
    else there, stops one from starting)."""
    health = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
              "--health-check-timeout-secs", "1", "--cb-failure-threshold", "2",
              "--prometheus-port", str(free_port())]
    if kind == "vllm":
        # consistent_hash: a request's worker is the hash of its x-session-id header
        return [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--worker-urls", *workers, "--policy", "consistent_hash",
                *health]
    # manual: a request's worker is the one its x-smg-routing-key was given (kept until it is
    # unhealthy); a new key goes to the worker with the fewest
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port), "--worker-urls", *workers, "--policy", "manual",
            "--assignment-mode", "min_group", *health]


ROUTERS = {"vllm": "vllm_router", "sglang": "sglang_router"}


@dataclass
class Replica:
    proc: subprocess.Popen
    base: str
    endpoint: str
    stats: Client = field(init=False)

    def __post_init__(self) -> None:
        self.stats = Client(self.endpoint, timeout=10)

    def lines(self) -> int:
        """The chat lines this replica's engine was asked for (its own count)."""
        if self.proc.poll() is not None:
            return -1
        chat = self.stats.stats()["control_latency_ms"].get("chat")
        return int(chat["n"]) if chat else 0


@contextmanager
def _replica(tmp: pytest.TempPathFactory, model: Path) -> Iterator[Replica]:
    d = tmp.mktemp("replica")
    shutil.copy(model, d / "smol.gguf")
    ep = f"ipc://{d / 's.sock'}"
    port = free_port()
    # room for every NPC's conversation on one replica, after the other is gone, and for the
    # fresh reads that measure a full prefill there (_full_prefill)
    proc = start_sidecar(d, ep, "--model", "smol.gguf", "--threads", "1", "--ctx", "8192",
                         "--max-sessions", "16",
                         "--http", f"127.0.0.1:{port}")
    try:
        probe = Client(ep, timeout=60)
        probe.wait_ready(90)
        probe.close()
        base = f"http://127.0.0.1:{port}"
        wait_http(base, 60)
        r = Replica(proc, base, ep)
        yield r
        r.stats.close()
    finally:
        stop(proc)


@contextmanager
def _router(kind: str, workers: list[str], log: Path) -> Iterator[str]:
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(_router_cmd(kind, port, workers), stdout=out,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base, 60, path="/v1/models", proc=proc, what=f"the {kind} router",
                  log=log.read_text)
        yield base
    finally:
        stop(proc)


def _say(client: Client, session: str, text: str) -> tuple[str, dict]:
    stream = client.chat(session, text, max_tokens=MAX_TOKENS, sampling={"seed": 7})
    reply = "".join(stream)
    assert stream.done is not None
    return reply, stream.done


def _full_prefill(base: str, messages: list[dict[str, str]], tokens: int) -> float:
    """What one full prefill of ``tokens`` (a moved NPC's transcript, ``messages``) costs on
    the replica at ``base``, measured right after its moved reply: the seconds to the first
    token of that transcript read afresh there, scaled to ``tokens``. Its system prompt starts
    with a mark of its own, so the replica finds no other conversation's cache to share."""
    mark = f"[{time.monotonic_ns() % 9973}] "
    messages = [{**messages[0], "content": mark + messages[0]["content"]}, *messages[1:]]
    t0 = time.perf_counter()
    first, usage = 0.0, {}
    body = {"messages": messages, "max_tokens": 1, "stream": True,
            "stream_options": {"include_usage": True}, "seed": 7}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120,
                      headers={"x-session-id": f"fresh-read-{time.monotonic_ns()}"}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("choices") and not first:
                first = time.perf_counter() - t0
            usage = chunk.get("usage") or usage
    read = usage["prompt_tokens"] - usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    assert abs(read - tokens) <= 8, (usage, tokens)  # the transcript, nearly all of it read
    return first * tokens / read


@pytest.mark.parametrize("kind", sorted(ROUTERS))
def test_a_router_keeps_each_npc_on_one_replica_and_moves_it_when_one_dies(
        kind: str, tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> None:
    if importlib.util.find_spec(ROUTERS[kind]) is None:
        pytest.skip(f"the {kind} router is not installed (pip install -e '.[dev]')")
    with ExitStack() as stack:
        replicas = [stack.enter_context(_replica(tmp_path_factory, default_model))
                    for _ in range(2)]
        log = tmp_path_factory.mktemp("router") / f"{kind}.log"
        router = stack.enter_context(_router(kind, [r.base for r in replicas], log))
        d = tmp_path_factory.mktemp("sidecar")
        shutil.copy(default_model, d / "smol.gguf")
        ep = f"ipc://{d / 's.sock'}"
        # 5 retries (0.25 s doubling, 7.75 s in all) outlast the router's health check, which
        # takes a dead replica out within a second or two
        sidecar = start_sidecar(d, ep, "--model", "smol.gguf", "--threads", "1",
                                "--upstream", f"{router}/v1", "--upstream-policy", "remote",
                                "--upstream-retries", "5")
        stack.callback(stop, sidecar)
        client = stack.enter_context(Client(ep, timeout=120))
        client.wait_ready(90)
        system = [f"You are villager number {i} of Ashford. {LORE}" for i in range(NPCS)]
        npcs = [client.open_session(system[i], name=f"npc.villager{i}") for i in range(NPCS)]
        # what each NPC's conversation holds, as the sidecar sends it upstream
        said: dict[str, list[dict[str, str]]] = {
            s: [{"role": "system", "content": system[i]}] for i, s in enumerate(npcs)}
        prefill: dict[str, float] = {}  # a moved NPC's transcript read afresh on the survivor
        where: dict[str, list[int]] = {s: [] for s in npcs}  # the replica of each turn
        usage: dict[str, list[dict]] = {s: [] for s in npcs}
        took: dict[str, list[float]] = {s: [] for s in npcs}  # reported, never asserted
        lost: list[str] = []

        def turn(t: int, after: Callable[[], None] | None = None) -> None:
            for i, s in enumerate(npcs):
                before = [r.lines() for r in replicas]
                t0 = time.perf_counter()
                line = f"Turn {t}: what news, villager {i}?"
                try:
                    reply, done = _say(client, s, line)
                except BridgeError as e:
                    lost.append(f"{s} turn {t}: {e}")
                    continue
                took[s].append(time.perf_counter() - t0)
                now = [r.lines() for r in replicas]
                served = [k for k in range(2) if now[k] > before[k]]
                assert len(served) == 1, (s, t, before, now)
                where[s].append(served[0])
                usage[s].append(done.get("usage", {}))
                u = usage[s][-1]
                if t == KILL_AFTER + 1 and where[s][KILL_AFTER - 1] != served[0]:
                    prefill[s] = _full_prefill(
                        replicas[served[0]].base, [*said[s], {"role": "user", "content": line}],
                        u["prompt_tokens"] + u["cached_tokens"])
                said[s] += [{"role": "user", "content": line},
                            {"role": "assistant", "content": reply}]

        for t in range(1, KILL_AFTER + 1):
            turn(t)
        first = {s: where[s][0] for s in npcs}
        assert all(set(where[s]) == {first[s]} for s in npcs), where  # 100% on one replica
        victim = first[npcs[0]]  # a replica with NPCs on it
        stop(replicas[victim].proc)
        for t in range(KILL_AFTER + 1, TURNS + 1):
            turn(t)
        assert lost == [], lost  # every line answered, retries included
        moved = [s for s in npcs if first[s] == victim]
        assert moved
        total = {s: [u["prompt_tokens"] + u["cached_tokens"] for u in usage[s]] for s in npcs}
        ratio = {s: [u["cached_tokens"] / max(1, t) for u, t in zip(usage[s], total[s],
                                                                strict=True)]
                 for s in npcs}
        reuse = []  # turn 2+ on the replica that served the turn before
        for s in npcs:
            assert len(where[s]) == TURNS
            if s in moved:  # the survivor from the kill on, with the whole transcript
                assert set(where[s][KILL_AFTER:]) == {1 - victim}, (s, where[s])
                assert total[s][KILL_AFTER] > total[s][KILL_AFTER - 1], total[s]
                reused = ratio[s][1:KILL_AFTER] + ratio[s][KILL_AFTER + 1:]
            else:
                assert set(where[s]) == {first[s]}, (s, where[s])
                reused = ratio[s][1:]
            assert min(reused) >= 0.8, (s, ratio[s])  # its KV reused
            reuse += reused
        on = [sum(w[:KILL_AFTER].count(k) for w in where.values()) for k in range(2)]
        retries = client.stats()["upstream"]["retries"]
        print(f"\n{kind}: turns per replica before the kill {on}, after {_after(where)}; "
              f"{len(moved)} NPCs moved; turn 2+ cached min {min(reuse):.2f}, mean "
              f"{sum(reuse) / len(reuse):.2f}; first turn after a move cached max "
              f"{max(ratio[s][KILL_AFTER] for s in moved):.2f}; sidecar retries {retries}; "
              f"lines lost {len(lost)}")
        # a moved NPC's first reply on the survivor beside its usual turn (median of its
        # others) plus one full prefill there (its transcript read afresh on the survivor
        # right after): within it, the move cost nothing beyond reading the transcript once.
        # Reported; asserted only at twice that (a router retrying a dead worker until its
        # health check, or the sidecar backing off, for seconds), a ratio to this run's own
        within = 0
        for s in moved:
            usual = statistics.median(took[s][1:KILL_AFTER] + took[s][KILL_AFTER + 1:])
            bound = usual + prefill[s]
            within += took[s][KILL_AFTER] <= bound
            print(f"  {s}: moved reply {took[s][KILL_AFTER]:.2f} s ({total[s][KILL_AFTER]} "
                  f"tokens read), usual {usual:.2f} s + full prefill {prefill[s]:.2f} s = "
                  f"{bound:.2f} s ({took[s][KILL_AFTER] / bound:.2f}x)")
            assert took[s][KILL_AFTER] <= 2 * bound, (s, took[s], prefill[s])
        print(f"  {within} of {len(moved)} moved NPCs within their usual turn + a full prefill")


def _after(where: dict[str, list[int]]) -> list[int]:
    return [sum(w[KILL_AFTER:].count(k) for w in where.values()) for k in range(2)]
