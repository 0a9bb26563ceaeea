"""The engine's settings (:class:`EngineConfig`): fixed for an engine's life, plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from igi_sdk.planner import Plan
from igi_sdk.runtime.speculative import SpeculativeConfig
from igi_sdk.runtime.vision import FlashAttn

LaunchAhead = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = 4096  # KV cells shared by all sessions
    max_sessions: int = 8  # llama.cpp sequences
    # replies the plan expects to decode together (serve --talking): the engine tells once when
    # its decode steps keep carrying a larger crowd (runtime/crowd.py)
    talking: int = 1
    n_batch: int = 512  # tokens per llama_decode across all sessions
    n_threads: int = 0  # 0 = leave the game cores (loader.default_threads, IGI_SDK_THREADS)
    # how idle CPU threads wait between steps: "auto" (chosen while running), "spin", "poll",
    # "sleep" (runtime/threadpool.py; a build of llama.cpp with OpenMP keeps libgomp's policy)
    thread_wait: str = "auto"
    # the thread count follows the host's load and the game's reports (None: when n_threads
    # is 0), never above the runtime's default; n_threads is where it starts
    adapt_threads: bool | None = None
    # hold the count at n_threads whatever the host's load and the game's reports say (the wait
    # still adapts): llama.cpp's flash-attention decode of a single token splits the KV cells
    # among the threads once the context passes 256 cells, so a count that moves changes the
    # last bits of the logits, and a seeded reply (with prefill_chunk) then reads differently
    # from run to run, and across a reshard. Where libgomp spins (igi_sdk's default wait), a
    # held thread beside a busy core stalls the others at every barrier: hold a count the
    # host can spare
    exact_threads: bool = False
    max_prompt_tokens: int = 0  # per chat turn; 0 = limited by the context only
    # KV cells guaranteed to every session slot (runtime/context_share.py): a session grows
    # past it only into cells no other slot's floor needs. -1 = n_ctx // (2 * max_sessions)
    # (half the context as floors, half a pool shared first come, first served); 0 = none
    context_floor: int = -1
    # the most KV cells one session may hold (0: what the floors leave it): a prompt longer
    # than that is refused (PromptTooLongError), a reply ends when its session reaches it. The
    # game's own per-NPC budget, as llama-server's per-slot context (n_ctx / --parallel)
    session_ctx: int = 0
    # a session whose cache is empty shares the cells of the longest prompt prefix another
    # session holds (a crowd's one system prompt is read once); off: each reads its own.
    # Not with prefill_chunk > 0: every prompt is then read alike, for seeded replies to repeat
    share_prefixes: bool = True
    # one decode step's target duration: prompts are fed in chunks that take about this long,
    # so commands wait at most about one such step (copy-compute plans feed at least a whole
    # ubatch, since each chunk streams the CPU-resident weights once)
    max_step_s: float = 0.05
    # while a prompt of no lower priority waits for its first token beside decoding replies,
    # steps may last as long as keeps each talking NPC ahead of a reader at this many tokens a
    # second from its first token (scheduler.step_target; about 5 is read, 3 spoken); 0 = off
    reading_tps: float = 8.0
    # fixed prompt tokens per step instead (0 = sized from max_step_s). llama.cpp's kernels sum
    # in an order that depends on the batch size, so a split that follows the measured speed can
    # change the last bits of the logits from run to run; a fixed split makes seeded replies
    # reproducible on one machine and plan (with exact_threads: a thread count that stays)
    prefill_chunk: int = 0
    # the next decode step is queued before this one's tokens are taken (their text, stop
    # strings and events), so the device computes while the host does a step's bookkeeping:
    # "auto" where a llama_decode call only queues the device's work (a model wholly on the
    # GPU), "on" everywhere (the same replies, nothing gained where the call computes), "off"
    launch_ahead: LaunchAhead = "auto"
    # a reply's text made sooner than this after its last piece went waits to go with the
    # next one (never past this long, nor past a step or a wait that would outlast it): a
    # reader that shows text once a frame sees no difference, and each piece it saves is a
    # wake-up of the threads between the engine and the reader (on a busy CPU, time out of
    # a decode step). 0 = every token's text as it comes
    stream_every_s: float = 0.0
    # speculative decoding: a draft GGUF with the model's vocabulary (None: no drafting)
    draft_model: str | None = None
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # load the model without CPU weight repacking (llama.cpp's extra buffer types): repacked
    # kernels round a multi-token verify batch differently from one-token steps, so a greedy
    # reply with drafting could differ from one without; off, the two are bit-identical
    exact_verify: bool = False
    # the model's vision projector (mmproj GGUF): chat turns may then carry images (None: text
    # only, an image is VisionUnavailableError).
    mmproj: str | None = None
    # the encoder on the GPU (all its weights in VRAM: mtmd has no per-tensor placement; see
    # planner/vision.py for when that fits), its flash attention, and whether its context stays
    # open between images. False: opened for an image turn's encodes and freed once its
    # embeddings are in the KV cache, so its weights and compute buffer never sit beside the
    # LM's for longer than the image steps (each reopen reads the mmproj again). None: freed
    # when the encoder is on the GPU (its VRAM goes back to the game), kept on the CPU (host
    # memory is not what the game is short of, and rereading a 1.3 GB tower costs every turn)
    vision_gpu: bool = False
    vision_flash_attn: FlashAttn = "auto"
    vision_resident: bool | None = None
    vision_warmup: bool = False  # mtmd's warmup reserves for its largest image (Qwen: 1288 px)
    vision_max_tokens: int = 0  # per image, 0 = the model's limit; bounds the compute buffer
    # the all-CPU placement kept open beside a GPU one (the arbiter's CPU rung; None: none).
    # A reshard then gives the GPU placement back at once and the sessions decode on this one
    # while the next placement loads behind them (runtime/background_load.py): the NPCs never
    # stop for a load. It costs host memory for its KV cache and compute buffer (its weights
    # are the file's memory-mapped pages, shared with the GPU placement's host part)
    standby: Plan | None = None

    @property
    def keeps_vision(self) -> bool:
        """Whether the vision context stays open between image turns (``vision_resident``)."""
        return self.vision_resident if self.vision_resident is not None else not self.vision_gpu

    @property
    def drafts_per_step(self) -> int:
        """Drafted tokens a session's verify step carries (0 without drafting)."""
        return self.speculative.k if (self.draft_model or self.speculative.ngram) else 0

    @property
    def outputs_per_step(self) -> int:
        """Logits rows one step may ask for: one per session, plus the drafts it verifies
        (the planner's ``Workload.n_outputs``)."""
        return self.max_sessions * (1 + self.drafts_per_step)
