"""Pieces of the HTTP-face benchmark: a streamed OpenAI chat turn timed from the client, a VRAM
peak sampler (NVML), and upstream ``llama-server`` run as a peer on a VRAM budget.

Used by ``http_face_bench.py``; every call takes a deadline so that no step outlives its phase.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MIB = 1024**2


class GapClock:
    """When a stream's pieces arrive: the first one, and the longest wait between two after
    it (a talking NPC that stops mid-sentence)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.max_gap_s = 0.0

    def piece(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self.last is not None:
            self.max_gap_s = max(self.max_gap_s, now - self.last)
        self.first = self.first or now
        self.last = now


@dataclass
class Turn:
    """One streamed chat completion as the client saw it."""

    turn_s: float  # request sent -> stream ended
    ttft_s: float  # request sent -> first content piece
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int | None  # the server's own report (usage or timings); None: not reported
    prefilled_tokens: int | None  # prompt tokens the server computed for this turn
    text: str
    timings: dict[str, float] = field(default_factory=dict)  # llama-server's own, when sent
    cut: bool = False  # stopped at the phase's deadline
    max_gap_s: float = 0.0  # the longest wait between two content pieces after the first

    @property
    def decode_tps(self) -> float:
        """Tokens after the first over the time after the first (the same rule for every
        server: the first token belongs to TTFT)."""
        gen_s = self.turn_s - self.ttft_s
        return (self.completion_tokens - 1) / gen_s if self.completion_tokens > 1 and gen_s > 0 \
            else 0.0


def stream_chat(http: httpx.Client, url: str, body: dict[str, Any], deadline: float) -> Turn:
    """POST a streamed chat completion and time it; stops reading at ``deadline`` (monotonic),
    which closes the connection (both servers cancel a generation whose client left).

    A kept-alive connection the server closed as the request went out is retried on a new one,
    as OpenAI clients do (llama-server's HTTP library closes idle connections); the turn is
    timed from the attempt that was answered."""
    for attempt in range(3):
        try:
            return _stream_once(http, url, body, deadline)
        except (httpx.RemoteProtocolError, httpx.ConnectError) as e:
            if attempt == 2 or getattr(e, "answered", False):
                raise
    raise AssertionError("unreachable")


def _stream_once(http: httpx.Client, url: str, body: dict[str, Any], deadline: float) -> Turn:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    left = max(1.0, deadline - time.monotonic())
    timeout = httpx.Timeout(connect=10.0, read=left, write=10.0, pool=10.0)
    t0 = time.perf_counter()
    said: list[str] = []
    usage: dict[str, Any] = {}
    timings: dict[str, float] = {}
    cut = False
    clock = GapClock()
    with http.stream("POST", url, json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.read()[:300]!r}")
        try:
            for line in r.iter_lines():
                if time.monotonic() > deadline:
                    cut = True
                    break
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"{url}: {chunk['error']}")
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for c in chunk.get("choices") or []:
                    piece = (c.get("delta") or {}).get("content")
                    if piece:
                        clock.piece()
                        said.append(piece)
        except httpx.RemoteProtocolError as e:
            e.answered = True  # type: ignore[attr-defined]  # a reply broken off: no retry
            raise
    end = time.perf_counter()
    prompt = int(usage.get("prompt_tokens", 0))
    details = usage.get("prompt_tokens_details") or {}
    cached: int | None = details.get("cached_tokens")
    if "cache_n" in timings:  # llama-server's timings say what it reused and computed
        cached = int(timings["cache_n"])
    prefilled = int(timings["prompt_n"]) if "prompt_n" in timings else (
        prompt - cached if cached is not None and prompt else None)
    return Turn(turn_s=end - t0, ttft_s=(clock.first or end) - t0,
                completion_tokens=int(usage.get("completion_tokens", len(said))),
                prompt_tokens=prompt, cached_tokens=cached, prefilled_tokens=prefilled,
                text="".join(said), timings=timings, cut=cut, max_gap_s=clock.max_gap_s)


class VramSampler:
    """Peak VRAM of one process (NVML's per-process figure) and of the device over a baseline,
    sampled every 20 ms in a side thread. Without NVML (a CPU machine) every peak is None."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.pid = pid
        self.proc_peak = 0
        self.dev_peak = 0
        self._win_proc = self._win_dev = 0  # peaks since mark()
        self._nv: Any = None
        self._h: Any = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                import pynvml
            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.baseline = int(pynvml.nvmlDeviceGetMemoryInfo(self._h).used)
        except Exception:  # noqa: BLE001 - no NVIDIA driver: no VRAM figures
            self._nv = None
            self.baseline = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        if self._nv is not None:
            self._t.start()

    @property
    def available(self) -> bool:
        return self._nv is not None

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            try:
                used = int(self._nv.nvmlDeviceGetMemoryInfo(self._h).used) - self.baseline
                self.dev_peak = max(self.dev_peak, used)
                self._win_dev = max(self._win_dev, used)
                for p in self._nv.nvmlDeviceGetComputeRunningProcesses(self._h):
                    if p.pid == self.pid:
                        mine = int(p.usedGpuMemory or 0)
                        self.proc_peak = max(self.proc_peak, mine)
                        self._win_proc = max(self._win_proc, mine)
            except Exception:  # noqa: BLE001 - a sample lost while the process exits
                pass
            time.sleep(period)

    def peak(self) -> int | None:
        """The process's own figure; the device's rise over the baseline where NVML lists no
        per-process figure (inside some containers)."""
        if self._nv is None:
            return None
        return self.proc_peak or self.dev_peak

    def mark(self) -> dict[str, int | None]:
        """The peaks so far; a new window starts (e.g. the load's peak, then the turns')."""
        now: dict[str, int | None] = {"proc_peak": self.proc_peak if self.available else None,
                                      "dev_peak": self.dev_peak if self.available else None,
                                      "peak": self.peak()}
        self._win_proc = self._win_dev = 0
        return now

    def window_peak(self) -> int | None:
        """The peak since :meth:`mark` (process figure, else the device's)."""
        if self._nv is None:
            return None
        return self._win_proc or self._win_dev

    def free_bytes(self) -> int | None:
        if self._nv is None:
            return None
        return int(self._nv.nvmlDeviceGetMemoryInfo(self._h).free)

    def stop(self) -> dict[str, int | None]:
        self._stop.set()
        if self._t.is_alive():
            self._t.join()
        return {"proc_peak": self.proc_peak if self.available else None,
                "dev_peak": self.dev_peak if self.available else None, "peak": self.peak()}


def gpu_free_bytes() -> int | None:
    """Free device memory now (None without NVML)."""
    s = VramSampler(pid=-1)
    free = s.free_bytes()
    s.stop()
    return free


class LlamaServer:
    """Upstream ``llama-server`` on one slot; on a GPU fitted by llama.cpp's own ``--fit`` to a
    VRAM budget (``--fit-target``: the margin it leaves free, i.e. free memory minus the budget),
    on a CPU machine with every layer on the CPU."""

    def __init__(self, binary: str, model: str, *, ctx: int, threads: int, port: int,
                 log: Path, margin_mib: int | None, extra: list[str]) -> None:
        self.url = f"http://127.0.0.1:{port}"
        fit = ["--fit", "on", "--fit-target", str(margin_mib)] if margin_mib is not None \
            else ["--fit", "off", "-ngl", "0"]
        self.cmd = [binary, "-m", model, "-c", str(ctx), "--parallel", "1", "-fa", "on",
                    "--host", "127.0.0.1", "--port", str(port), "--no-webui",
                    *(["-t", str(threads)] if threads else []), *fit, *extra]
        self.log = log
        self._logf = log.open("a")
        self._logf.write(" ".join(self.cmd) + "\n")
        self._logf.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=self._logf, stderr=subprocess.STDOUT)
        self.sampler = VramSampler(self.proc.pid)

    def wait_ready(self, deadline: float) -> float:
        """Seconds until /health answers 200 (the model loaded and warmed up)."""
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} (log: "
                                   f"{self.log})")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("llama-server did not become ready in time")

    def offload(self) -> str:
        """What llama.cpp's fit chose, from its log (layers offloaded, tensor overrides)."""
        self._logf.flush()
        keep = ("offloaded", "fit", "n_gpu_layers", "override", "CUDA0 model buffer",
                "CPU_Mapped model buffer", "CUDA0 KV buffer", "CUDA0 compute buffer")
        lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                 if any(k in ln for k in keep)]
        return " | ".join(lines[-8:])

    def stop(self) -> dict[str, int | None]:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._logf.close()
        return self.sampler.stop()
