"""Scale-out through real routers: vLLM's router and SGLang's model gateway (their PyPI
packages) on loopback in front of two replicas (``igi-sdk serve --http`` on the default model),
and the sidecar (``--upstream <router> --upstream-policy remote``) between them and the NPCs.

Each replica's own engine counts the lines it answered (its ``stats``), and its reply's
``usage`` says what it reused of its prefix cache: each NPC stays on one replica and reuses its
KV; with one replica killed mid-conversation, its NPCs move to the other with their
transcripts and no line is lost."""

from __future__ import annotations

import importlib.util
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
    """The routers as the docs' recipes start them (health checked every second, so a killed
    replica is taken out of the rotation soon)."""
    health = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
              "--health-check-timeout-secs", "1"]
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
    # room for every NPC's conversation on one replica, after the other is gone
    proc = start_sidecar(d, ep, "--model", "smol.gguf", "--threads", "1", "--ctx", "4096",
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
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the {kind} router did not start: "
                                     f"{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield base
    finally:
        stop(proc)


def _say(client: Client, session: str, text: str) -> dict:
    stream = client.chat(session, text, max_tokens=MAX_TOKENS, sampling={"seed": 7})
    "".join(stream)
    assert stream.done is not None
    return stream.done


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
        npcs = [client.open_session(f"You are villager number {i} of Ashford. {LORE}",
                                    name=f"npc.villager{i}") for i in range(NPCS)]
        where: dict[str, list[int]] = {s: [] for s in npcs}  # the replica of each turn
        usage: dict[str, list[dict]] = {s: [] for s in npcs}
        took: dict[str, list[float]] = {s: [] for s in npcs}  # reported, never asserted
        lost: list[str] = []

        def turn(t: int, after: Callable[[], None] | None = None) -> None:
            for i, s in enumerate(npcs):
                before = [r.lines() for r in replicas]
                t0 = time.perf_counter()
                try:
                    done = _say(client, s, f"Turn {t}: what news, villager {i}?")
                except BridgeError as e:
                    lost.append(f"{s} turn {t}: {e}")
                    continue
                now = [r.lines() for r in replicas]
                served = [k for k in range(2) if now[k] > before[k]]
                assert len(served) == 1, (s, t, before, now)
                where[s].append(served[0])
                took[s].append(time.perf_counter() - t0)
                usage[s].append(done.get("usage", {}))

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
        # others) plus one full prefill of what it read there (its first turn, a full prefill,
        # scaled by the tokens each read): the time it may take, reported, not asserted
        for s in moved:
            usual = statistics.median(took[s][1:KILL_AFTER] + took[s][KILL_AFTER + 1:])
            read, first = total[s][KILL_AFTER], max(1, total[s][0])
            prefill = took[s][0] * read / first
            print(f"  {s}: moved reply {took[s][KILL_AFTER]:.2f} s ({read} tokens read), "
                  f"usual {usual:.2f} s + full prefill {prefill:.2f} s ({first} tokens: "
                  f"{took[s][0]:.2f} s) = {usual + prefill:.2f} s")


def _after(where: dict[str, list[int]]) -> list[int]:
    return [sum(w[KILL_AFTER:].count(k) for w in where.values()) for k in range(2)]
