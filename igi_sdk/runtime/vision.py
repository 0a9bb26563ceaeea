"""Image input through llama.cpp's multimodal library (mtmd): a typed, thin shell over the
``llama_cpp.mtmd_cpp`` bindings.

``VisionContext`` opens an mmproj (vision tower + projector) beside a loaded language model with
explicit options, makes images from PNG/JPEG bytes or raw RGB/RGBA pixels, tokenizes a prompt
with media markers into chunks (text runs and images) and evaluates them into a llama.cpp
context's sequence, returning the new ``n_past``. Everything native it creates (the mtmd context,
bitmaps, chunk lists) is freed by ``close()``, at the latest when the context closes.

What mtmd decides and this module cannot change (tools/mtmd/clip.cpp of this build; see
docs/architecture.md, "Image input"):

* the vision weights live in one buffer of the encoder's backend: VRAM when ``use_gpu`` finds a
  GPU, host memory otherwise; there is no per-tensor placement (no ``tensor_buft_overrides``);
* its compute buffer lives on that backend, sized by the warmup image (``warmup=True``: for
  Qwen2.5-VL 1288x1288 whatever ``image_max_tokens`` says, hundreds of MiB) or by the first
  image encoded, and grows when a larger image comes; hence no warmup by default;
* ``flash_attn`` applies to the encoder too; ``auto`` probes the backend when the compute buffer
  is first reserved.

Like every llama.cpp object it is not thread-safe: the engine thread owns it. The language model
must outlive it (mtmd keeps the model's vocabulary).
"""

from __future__ import annotations

import ctypes
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import llama_cpp
from llama_cpp import mtmd_cpp

from igi_sdk.errors import (
    ContextFullError,
    EngineClosedError,
    InferenceError,
    InvalidImageError,
    ModelFileNotFoundError,
    ModelLoadError,
    PromptTooLongError,
)
from igi_sdk.runtime import _native
from igi_sdk.runtime.image_decode import (
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIDE,
    ImageBudget,
    check_size,
    shared_decoder,
)
from igi_sdk.runtime.loader import default_threads

log = logging.getLogger("igi_sdk.runtime")

DEFAULT_MARKER = "<__media__>"

FlashAttn = Literal["auto", "on", "off"]
_FLASH = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
_CHUNK_KINDS = {
    mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_TEXT: "text",
    mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE: "image",
    mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_AUDIO: "audio",
}
_NO_CALLBACK = mtmd_cpp.mtmd_helper_post_decode_callback()  # a NULL function pointer


# --- errors (InvalidImageError lives in igi_sdk.errors: a wire code) -----------------------------

__all__ = [
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE",
    "ChunkInfo",
    "Chunks",
    "EvalResult",
    "Image",
    "InvalidImageError",
    "VisionClosedError",
    "VisionContext",
    "VisionLoadError",
    "VisionOptions",
    "VisionPromptError",
]


class VisionLoadError(ModelLoadError):
    """The mmproj could not be opened for this language model (not a projector, corrupt, or
    made for a model of another width). On the wire: ``model_load_failed``."""


class VisionPromptError(InvalidImageError):
    """A prompt whose media markers do not match the images given with it (on the wire:
    ``invalid_image``)."""


class VisionClosedError(EngineClosedError):
    """The vision context (or the image/chunks) was closed."""


# --- options -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionOptions:
    """How mtmd runs the encoder. Nothing is left to mtmd's defaults (which use the GPU, warm
    up with the largest image and print timings).

    ``n_threads`` 0 means the runtime's default (the usable cores). ``image_min_tokens`` /
    ``image_max_tokens`` 0 keep the model's limits (Qwen2.5-VL: 8..4096 tokens per image); the
    maximum also bounds the encoder's compute buffer.
    """

    use_gpu: bool = False
    flash_attn: FlashAttn = "auto"
    n_threads: int = 0
    warmup: bool = False
    image_min_tokens: int = 0
    image_max_tokens: int = 0
    media_marker: str = DEFAULT_MARKER
    print_timings: bool = False

    def __post_init__(self) -> None:
        if self.flash_attn not in _FLASH:
            raise ValueError(f"flash_attn must be one of {sorted(_FLASH)}")
        if min(self.n_threads, self.image_min_tokens, self.image_max_tokens) < 0:
            raise ValueError("n_threads and image token limits must be >= 0")
        if self.image_max_tokens and self.image_min_tokens > self.image_max_tokens:
            raise ValueError("image_min_tokens must be <= image_max_tokens")
        if not self.media_marker:
            raise ValueError("media_marker must not be empty")


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk of a tokenized prompt: ``n_tokens`` KV cells, ``n_pos`` positions (they differ
    for an image under M-RoPE: a 2-D grid takes max(nx, ny) positions), the grid for images."""

    kind: str
    n_tokens: int
    n_pos: int
    nx: int = 0
    ny: int = 0


@dataclass(frozen=True)
class EvalResult:
    n_past: int  # the position after the last evaluated token
    n_tokens: int  # KV cells written
    encode_s: tuple[float, ...]  # wall time of each image's encoder pass


# --- native handles ------------------------------------------------------------------------------


class _Handle:
    """A native pointer with one owner and one ``free``; later uses raise VisionClosedError."""

    _what = "object"

    def __init__(self, ptr: Any, free: Any) -> None:
        self._ptr, self._free = ptr, free

    @property
    def ptr(self) -> Any:
        if not self._ptr:
            raise VisionClosedError(f"the {self._what} was closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return not self._ptr

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._free(ptr)

    def __enter__(self) -> Any:
        return self

    def __del__(self) -> None:  # a safety net only: close() is the deterministic way
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the bindings may be gone
            pass

    def __exit__(self, *exc: object) -> None:
        self.close()


class Image(_Handle):
    """An RGB bitmap in mtmd (a copy: the caller's buffer is free once this exists)."""

    _what = "image"

    def __init__(self, ptr: Any) -> None:
        super().__init__(ptr, mtmd_cpp.mtmd_bitmap_free)
        self.width = int(mtmd_cpp.mtmd_bitmap_get_nx(ptr))
        self.height = int(mtmd_cpp.mtmd_bitmap_get_ny(ptr))


class Chunks(_Handle):
    """A tokenized prompt: text runs and preprocessed images (independent of the bitmaps)."""

    _what = "chunks"

    def __init__(self, ptr: Any) -> None:
        super().__init__(ptr, mtmd_cpp.mtmd_input_chunks_free)
        self.info: tuple[ChunkInfo, ...] = ()

    def _read_info(self) -> None:
        self.info = tuple(_chunk_info(self._chunk(i)) for i in range(len(self)))

    def __len__(self) -> int:
        return int(mtmd_cpp.mtmd_input_chunks_size(self.ptr))

    def _chunk(self, i: int) -> Any:
        return mtmd_cpp.mtmd_input_chunks_get(self.ptr, i)

    def text_tokens(self, i: int) -> list[int]:
        """The token ids of text chunk ``i`` (e.g. the delimiters mtmd puts around an image)."""
        n = ctypes.c_size_t(0)
        toks = mtmd_cpp.mtmd_input_chunk_get_tokens_text(self._chunk(i), ctypes.byref(n))
        return [int(toks[k]) for k in range(n.value)]

    @property
    def n_tokens(self) -> int:
        return sum(c.n_tokens for c in self.info)

    @property
    def n_pos(self) -> int:
        return sum(c.n_pos for c in self.info)

    @property
    def image_tokens(self) -> tuple[int, ...]:
        return tuple(c.n_tokens for c in self.info if c.kind == "image")


def _chunk_info(chunk: Any) -> ChunkInfo:
    kind = _CHUNK_KINDS.get(mtmd_cpp.mtmd_input_chunk_get_type(chunk), "unknown")
    n_tokens = int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk))
    n_pos = int(mtmd_cpp.mtmd_input_chunk_get_n_pos(chunk))
    if kind != "image":
        return ChunkInfo(kind, n_tokens, n_pos)
    img = mtmd_cpp.mtmd_input_chunk_get_tokens_image(chunk)
    nx, ny = mtmd_cpp.mtmd_image_tokens_get_nx(img), mtmd_cpp.mtmd_image_tokens_get_ny(img)
    return ChunkInfo(kind, n_tokens, n_pos, int(nx), int(ny))


# --- the context ---------------------------------------------------------------------------------


class VisionContext(_Handle):
    """mtmd for one language model: ``model`` is a loaded ``llama_model`` pointer that must
    outlive this context."""

    _what = "vision context"
    # native mtmd contexts made and still open in this process (observable in tests and
    # benchmarks: the engine frees a non-resident encoder between images)
    opened = 0
    live = 0

    def __init__(self, model: Any, mmproj: str | Path, options: VisionOptions | None = None):
        self.options = options or VisionOptions()
        self.path = Path(mmproj)
        if not self.path.is_file():
            raise ModelFileNotFoundError(f"projector file {self.path} does not exist")
        if not model:
            raise VisionLoadError("a vision context needs a loaded language model")
        _native.route_mtmd_log()
        self._params = self._context_params()  # its marker string must outlive the init call
        with _native.capture_log() as lines:
            ptr = mtmd_cpp.mtmd_init_from_file(str(self.path).encode(), model, self._params)
        if not ptr:
            raise VisionLoadError(
                f"llama.cpp could not open projector {self.path} for this model: "
                f"{_reason(lines)}"
            )
        super().__init__(ptr, mtmd_cpp.mtmd_free)
        VisionContext.opened += 1
        VisionContext.live += 1
        self._children: weakref.WeakSet[_Handle] = weakref.WeakSet()
        if not mtmd_cpp.mtmd_support_vision(ptr):
            self.close()
            raise VisionLoadError(f"projector {self.path} has no vision encoder (audio only?)")
        self.uses_mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(ptr))

    def _context_params(self) -> Any:
        o = self.options
        p = mtmd_cpp.mtmd_context_params_default()
        p.use_gpu = o.use_gpu
        p.flash_attn_type = _FLASH[o.flash_attn]
        p.n_threads = o.n_threads or default_threads()
        p.warmup = o.warmup
        p.print_timings = o.print_timings
        p.image_min_tokens = o.image_min_tokens or -1  # mtmd: <= 0 keeps the model's value
        p.image_max_tokens = o.image_max_tokens or -1
        p.media_marker = o.media_marker.encode()
        return p

    def close(self) -> None:
        """Free every image and chunk list made here, then the mtmd context. Idempotent."""
        for child in list(getattr(self, "_children", ())):
            child.close()
        if not self.closed:
            VisionContext.live -= 1
            super().close()
            # llama.cpp logs every buffer it reserves but not the frees: this line completes
            # the record that shows when the encoder's memory was gone
            log.debug("vision context freed (weights and compute buffer)")

    def _own(self, handle: Any) -> Any:
        self._children.add(handle)
        return handle

    # --- images ----------------------------------------------------------------------------------

    def image_from_bytes(self, data: bytes | bytearray | memoryview,
                         budget: ImageBudget | None = None) -> Image:
        """An image from PNG or JPEG file bytes, decoded by Pillow in a worker process with
        its costs capped (runtime/image_decode.py) and scaled down to ``budget``. Blocks the
        calling thread for the decode: the sidecar decodes before a line reaches the engine
        (``image_turn.prepare``) and hands it pixels instead."""
        _ = self.ptr  # a closed context refuses before decoding
        decoded = shared_decoder().decode(bytes(data), budget)
        return self.image_from_pixels(decoded.pixels, decoded.width, decoded.height)

    def image_from_pixels(
        self, pixels: bytes | bytearray | memoryview, width: int, height: int, channels: int = 3
    ) -> Image:
        """An image from raw 8-bit pixels, rows top to bottom: RGB (``channels=3``) or RGBA
        (``channels=4``, whose alpha is dropped as llama.cpp's own decoder drops it)."""
        if channels not in (3, 4):
            raise InvalidImageError(f"channels must be 3 (RGB) or 4 (RGBA), not {channels}")
        check_size(width, height)
        view = memoryview(pixels).cast("B")
        expected = width * height * channels
        if view.nbytes != expected:
            raise InvalidImageError(
                f"{width}x{height} {('RGB', 'RGBA')[channels - 3]} needs {expected} bytes, "
                f"got {view.nbytes}"
            )
        rgb = _rgb(view, channels)
        buf = (ctypes.c_uint8 * len(rgb)).from_buffer(rgb)  # mtmd copies it during the call
        ptr = mtmd_cpp.mtmd_bitmap_init(width, height, buf)
        if not ptr:
            raise InvalidImageError(f"llama.cpp refused a {width}x{height} image")
        return self._own(Image(ptr))

    # --- prompts ---------------------------------------------------------------------------------

    def tokenize(
        self,
        prompt: str,
        images: Sequence[Image] = (),
        *,
        add_special: bool = False,
        parse_special: bool = True,
    ) -> Chunks:
        """Split ``prompt`` at its media markers, one per image in order; mtmd adds the model's
        image delimiters (Qwen: ``<|vision_start|>`` ... ``<|vision_end|>``) itself."""
        n_markers = prompt.count(self.options.media_marker)
        if n_markers != len(images):
            raise VisionPromptError(
                f"the prompt has {n_markers} media markers ({self.options.media_marker!r}) "
                f"but {len(images)} images were given"
            )
        text = prompt.encode()
        inp = mtmd_cpp.mtmd_input_text(text, len(text), add_special, parse_special)
        bitmaps = (mtmd_cpp.mtmd_bitmap_p_ctypes * max(1, len(images)))(
            *(image.ptr for image in images)
        )
        out = mtmd_cpp.mtmd_input_chunks_init()
        if not out:
            raise MemoryError("mtmd could not allocate a chunk list")
        chunks = self._own(Chunks(out))
        with _native.capture_log() as lines:
            ret = mtmd_cpp.mtmd_tokenize(self.ptr, out, ctypes.byref(inp), bitmaps, len(images))
        if ret != 0:
            chunks.close()
            reason = _reason(lines)
            cls = VisionPromptError if "marker" in reason else InvalidImageError
            raise cls(f"mtmd could not tokenize the prompt (code {ret}): {reason}")
        chunks._read_info()
        return chunks

    def eval(
        self,
        lctx: Any,
        chunks: Chunks,
        n_past: int,
        *,
        seq_id: int = 0,
        n_batch: int | None = None,
        logits_last: bool = True,
    ) -> EvalResult:
        """Evaluate ``chunks`` into ``lctx``'s sequence ``seq_id`` from position ``n_past``.

        Text is decoded in batches of ``n_batch`` (default: the context's), each image is encoded
        then its embeddings decoded. On a failure the sequence is cut back to ``n_past``, so the
        context is as it was, and a typed error says why.
        """
        n_ctx = int(llama_cpp.llama_n_ctx(lctx))
        if chunks.n_tokens > n_ctx:
            raise PromptTooLongError(
                f"the prompt takes {chunks.n_tokens} tokens, the context holds {n_ctx}"
            )
        n_batch = n_batch or int(llama_cpp.llama_n_batch(lctx))
        pos = llama_cpp.llama_pos(n_past)
        encode_s: list[float] = []
        try:
            for i, info in enumerate(chunks.info):
                last = logits_last and i == len(chunks.info) - 1
                chunk = chunks._chunk(i)
                if info.kind == "text":
                    ret = mtmd_cpp.mtmd_helper_eval_chunk_single(
                        self.ptr, lctx, chunk, pos.value, seq_id, n_batch, last, ctypes.byref(pos)
                    )
                    _check(ret, "decoding text")
                    continue
                encode_s.append(self._encode_decode(lctx, chunk, info, pos, seq_id, n_batch))
        except BaseException:
            mem = llama_cpp.llama_get_memory(lctx)
            llama_cpp.llama_memory_seq_rm(mem, seq_id, n_past, -1)
            raise
        return EvalResult(int(pos.value), chunks.n_tokens, tuple(encode_s))

    def eval_media(
        self, lctx: Any, chunks: Chunks, index: int, n_past: int, *, seq_id: int = 0,
        n_batch: int | None = None,
    ) -> EvalResult:
        """Encode chunk ``index`` of ``chunks`` (an image) and decode its embeddings into
        ``seq_id`` from ``n_past``, without logits: the caller feeds the text around it itself
        (the engine, in its own batches). Cut back to ``n_past`` on failure, as :meth:`eval`."""
        info = chunks.info[index]
        if info.kind == "text":
            raise ValueError(f"chunk {index} is text, not media")
        n_ctx = int(llama_cpp.llama_n_ctx(lctx))
        if info.n_tokens > n_ctx:
            raise PromptTooLongError(
                f"the image takes {info.n_tokens} tokens, the context holds {n_ctx}")
        pos = llama_cpp.llama_pos(n_past)
        try:
            encode_s = self._encode_decode(lctx, chunks._chunk(index), info, pos, seq_id,
                                           n_batch or int(llama_cpp.llama_n_batch(lctx)))
        except BaseException:
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(lctx), seq_id, n_past, -1)
            raise
        return EvalResult(int(pos.value), info.n_tokens, (encode_s,))

    def _encode_decode(self, lctx: Any, chunk: Any, info: ChunkInfo, pos: Any, seq_id: int,
                       n_batch: int) -> float:
        """Run the encoder on one media chunk and decode its embeddings from ``pos`` (advanced
        in place); the encoder's wall time."""
        t0 = time.perf_counter()
        _check(mtmd_cpp.mtmd_encode_chunk(self.ptr, chunk), f"encoding an {info.kind}")
        encode_s = time.perf_counter() - t0
        embd = mtmd_cpp.mtmd_get_output_embd(self.ptr)
        ret = mtmd_cpp.mtmd_helper_decode_image_chunk(
            self.ptr, lctx, chunk, embd, pos.value, seq_id, n_batch, ctypes.byref(pos),
            _NO_CALLBACK, None,
        )
        _check(ret, f"decoding an {info.kind}'s embeddings")
        return encode_s


# --- helpers -------------------------------------------------------------------------------------


def _check(ret: int, what: str) -> None:
    if ret == 0:
        return
    if ret == 1:  # llama_decode: no KV slot for the batch
        raise ContextFullError(f"the context is full ({what})")
    raise InferenceError(f"llama.cpp failed {what} (code {ret})")


def _rgb(view: memoryview, channels: int) -> bytearray:
    if channels == 3:
        return bytearray(view)
    rgba = bytes(view)
    out = bytearray(len(rgba) // 4 * 3)
    for c in range(3):  # strided copies: C speed, no numpy round trip
        out[c::3] = rgba[c::4]
    return out


def _reason(lines: list[str]) -> str:
    errs = [ln.strip() for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    return errs[-1] if errs else "see the log for details"
