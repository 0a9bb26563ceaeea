"""Profile data: what this machine's CPU, GPU and PCIe link can do, as the cost model needs it.

Throughput is stored as *weight bytes per second* of a matrix multiplication, per ggml type and
per token count: at 1 token a matmul is bound by reading its weight once, so the rate is close
to memory bandwidth; at thousands of tokens it is bound by arithmetic and the rate grows with
the token count. The cost of any weight at any batch size is then ``bytes / rate(type, tokens)``
with a roofline between measured token counts (see ``_rate``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

log = logging.getLogger("igi_sdk.profile")

# Types without their own measurement borrow the nearest measured kernel family's rate.
_TYPE_FALLBACK = {
    "F32": "F16", "BF16": "F16", "Q4_1": "Q4_0", "Q5_0": "Q4_0", "Q5_1": "Q4_0",
    "IQ4_NL": "Q4_0", "Q2_K": "Q4_K", "Q3_K": "Q4_K", "Q5_K": "Q4_K", "Q6_K": "Q4_K",
    "IQ4_XS": "Q4_K", "MXFP4": "Q4_0",
}  # fmt: skip


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "igi-sdk" / "profiles"


class DeviceProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["cpu", "gpu"]
    threads: int = 0
    free_bytes: int = 0
    total_bytes: int = 0
    # ggml type -> token count -> weight bytes per second of a matmul
    matmul_rate: dict[str, dict[int, float]]
    # flash attention over an f16 KV cache: FLOP/s for a prefill-sized batch of queries, and KV
    # bytes read per second for one query (decode); 0 = not measured (the matmul rates stand in)
    attn_flops: float = 0.0
    attn_kv_bps: float = 0.0
    # fixed cost of a decode step beyond its weights and attention: per layer (kernel launches or
    # thread-pool barriers, a few dozen per layer) and per llama_decode; 0 = not measured
    layer_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    # a MoE's routed experts at decode (one token), as a share of ``rate(type, 1)``: "gate_up"
    # (each token's one row against its experts) and "down" (each expert its own row), timed at
    # Qwen3-30B-A3B's expert shape; small experts, and the down experts' short rows, read
    # slower than one large weight where the kernels are the plain ones. GPU only, "prefill":
    # a prefill batch's experts (timed at 1024 tokens over all 128 experts) as a share of the
    # dense rate at each expert's share of the tokens: the grouped expert kernels reach a
    # fraction of a dense matmul's throughput. Empty: 1.0
    expert_scale: dict[str, float] = Field(default_factory=dict)
    # seconds per token and layer a prefill batch spends beyond its matmuls at these rates, its
    # attention and the fixed overheads: the element-wise ops (norms, rope, SwiGLU, adds), the
    # activations' quantisation and the small matrices' lower occupancy, which grow with the
    # tokens; fitted from a prefill probe of real-sized layers (GPU; 0: not measured)
    prefill_token_layer_s: float = 0.0
    # ... and per token of the ubatch whatever its layers (the token embeddings, read on the
    # CPU and sent to the GPU; the inputs' setup): the same probe's share that does not grow
    # with its layers
    prefill_token_s: float = 0.0
    _memo: dict[tuple[str, float], float] = PrivateAttr(default_factory=dict)

    def rate(self, ggml_type: str, tokens: float) -> float:
        """Weight bytes per second for a batch of ``tokens`` tokens (roofline interpolation)."""
        # the planner asks this about a million times per plan: one plain dict lookup here, not
        # pydantic's private-attribute access (``self._memo`` goes through __getattr__, ~2 µs)
        memo = self.__pydantic_private__["_memo"]  # type: ignore[index]
        key = (ggml_type, tokens)
        rate = memo.get(key)
        if rate is None:
            rate = memo[key] = self._rate(ggml_type, tokens)
        return rate

    def _rate(self, ggml_type: str, tokens: float) -> float:
        table = self.matmul_rate.get(ggml_type) or self.matmul_rate.get(
            _TYPE_FALLBACK.get(ggml_type, "Q4_0")
        )
        if not table:
            table = next(iter(self.matmul_rate.values()))
        # seconds per weight byte for a batch of n tokens, at the measured token counts
        pts = sorted((int(t), 1.0 / r) for t, r in table.items())
        n = max(1.0, tokens)
        if n <= pts[0][0]:
            return 1.0 / pts[0][1]
        # Roofline between neighbours: the batch costs at least the lower neighbour's time (the
        # weight must be read however few tokens there are) and at least the upper neighbour's
        # time per token times n (the arithmetic); whichever binds. Past the last measurement
        # the batch is compute-bound: time grows with n.
        for (n0, t0), (n1, t1) in itertools.pairwise(pts):
            if n <= n1:
                # per-token slope: the upper neighbour's; steeper where the measurements grow
                # faster than linearly, so the curve still meets the lower one
                slope = max(t1 / n1, (t1 - t0) / (n1 - n0))
                return 1.0 / max(t0, t1 - (n1 - n) * slope)
        n1, t1 = pts[-1]
        return 1.0 / (t1 * n / n1)

    def expert_rate_scale(self, tensor_name: str) -> float:
        """``expert_scale`` for a routed-expert weight of this name (1.0 unmeasured)."""
        kind = "down" if "ffn_down_exps" in tensor_name else "gate_up"
        return self.expert_scale.get(kind, 1.0)

    def expert_prefill_scale(self) -> float:
        """``expert_scale["prefill"]`` (1.0 unmeasured)."""
        return self.expert_scale.get("prefill", 1.0)

    def attention_flops(self) -> float:
        return self.attn_flops or self.flops()

    def attention_kv_bps(self) -> float:
        return self.attn_kv_bps or self.bandwidth()

    def bandwidth(self) -> float:
        """Bytes/s when reading weights once (the 1-token F16 matmul rate)."""
        return self.rate("F16", 1)

    def flops(self) -> float:
        """Dense arithmetic rate: an F16 matmul does 2 FLOP per weight element per token."""
        table = self.matmul_rate.get("F16") or next(iter(self.matmul_rate.values()))
        t_max = max(int(t) for t in table)
        return table[t_max] * t_max  # bytes/s × tokens × (2 FLOP / 2 bytes)


class Profile(BaseModel):
    """A machine's profile. ``gpu`` is None on a CPU-only machine (→ CPU plans)."""

    model_config = ConfigDict(extra="forbid")

    fingerprint: dict[str, str] = Field(default_factory=dict)
    cpu: DeviceProfile
    gpu: DeviceProfile | None = None
    h2d_pinned_bps: float = 0.0
    h2d_pageable_bps: float = 0.0
    # weight bytes per second that copy-compute streams in a real prefill (each weight copied,
    # then multiplied, on one stream), from pinned and from memory-mapped host weights;
    # 0 = not measured (the raw copy rates stand in)
    stream_pinned_bps: float = 0.0
    stream_mapped_bps: float = 0.0
    pcie: str = ""
    # VRAM the process holds as soon as the GPU backend starts (CUDA context, cuBLAS handles):
    # part of the budget no plan can give back.
    gpu_fixed_bytes: int = 0
    # cost of each CPU<->GPU hand-over inside a graph (synchronise + copy activations)
    split_latency_s: float = 30e-6
    # how much slower the CPU reads its weights while a copy to the GPU streams from the same
    # host memory (a pipelined decode overlaps the two): on the H200 host, 15 threads summing
    # 2 GB read 66 GB/s during a 54 GB/s pinned copy against 85 alone, and a decode whose FFNs
    # were all on the CPU took 1.30x as long under a copy running throughout (2026-12-01,
    # benchmarks/dma_contention.py). A profile measures it (tuning.measure.
    # cpu_slowdown_under_copy); this default stands for profiles from before that
    stream_cpu_slowdown: float = 0.25

    @property
    def key(self) -> str:
        blob = json.dumps(self.fingerprint, sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]

    def h2d_bps(self, pinned: bool) -> float:
        return self.h2d_pinned_bps if pinned else self.h2d_pageable_bps

    def stream_bps(self, pinned: bool) -> float:
        """Rate at which copy-compute streams CPU-resident weights to the GPU."""
        measured = self.stream_pinned_bps if pinned else self.stream_mapped_bps
        return measured or self.h2d_bps(pinned)

    def save(self, directory: Path | None = None) -> Path:
        d = directory or cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{self.key}.json"
        path.write_text(self.model_dump_json(indent=2))
        return path

    @classmethod
    def load(cls, path: Path) -> Profile:
        return cls.model_validate_json(Path(path).read_text())

    @classmethod
    def cached(cls, fingerprint: dict[str, str], directory: Path | None = None) -> Profile | None:
        probe = cls(fingerprint=fingerprint, cpu=DeviceProfile(name="", kind="cpu",
                                                               matmul_rate={"F16": {1: 1.0}}))
        path = (directory or cache_dir()) / f"{probe.key}.json"
        if not path.is_file():
            return None
        try:
            return cls.load(path)
        except (ValueError, OSError) as e:  # pydantic's ValidationError is a ValueError
            # a cache file that does not read back (cut short, or written by a release whose
            # profile it no longer validates) is measured again, not a failed start
            log.warning("the cached profile %s does not read back (%s): measuring again",
                        path.name, str(e).splitlines()[0])
            return None
