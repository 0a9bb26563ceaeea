"""The image decoding process: PNG/JPEG bytes in, RGB pixels out, one image at a time.

Run as a script by path (``python -I _image_worker.py MEMORY_BYTES``), never imported by the
SDK: it must not load the package (whose ``__init__`` maps llama.cpp), only the standard
library and Pillow, so that it starts fast and holds little. Its parent
(:mod:`igi_sdk.runtime.image_decode`) checks the header, scans and size before sending
anything, caps this process's address space, and kills it when a decode runs too long; so a
hostile image can at worst fail here, never in the process that runs the model.

Framing on stdin/stdout (big-endian): once Pillow is loaded the worker writes :data:`READY`;
a request is :data:`REQUEST` followed by the file bytes; a reply is :data:`REPLY` followed by
RGB rows (status 0) or a UTF-8 message (status 1).
"""

from __future__ import annotations

import io
import math
import os
import struct
import sys
import warnings
from typing import BinaryIO

# max_side, max_pixels, max_tokens, tile, data length
REQUEST = struct.Struct(">IIIII")
# status, width, height, payload length
REPLY = struct.Struct(">BIII")
OK, REFUSED = 0, 1
READY = b"R"
# text chunks (tEXt/zTXt/iTXt) are metadata nobody here reads: a small cap on what one may
# inflate to, and on all of them together, shuts the text-chunk bomb
MAX_TEXT_CHUNK = 256 << 10
MAX_TEXT_MEMORY = 1 << 20


def fit(width: int, height: int, max_tokens: int, tile: int) -> tuple[int, int]:
    """The size an image is scaled down to so that it takes at most ``max_tokens`` tiles of
    ``tile`` x ``tile`` pixels (the encoder's patch times its merge: one image token each),
    aspect kept, both sides whole tiles; the size itself where it already fits (0: no cap)."""
    if max_tokens <= 0 or tile <= 0:
        return width, height
    if math.ceil(width / tile) * math.ceil(height / tile) <= max_tokens:
        return width, height
    scale = math.sqrt(max_tokens * tile * tile / (width * height))
    rows = max(1, min(max_tokens, math.floor(height * scale / tile)))
    cols = max(1, min(max_tokens // rows, math.floor(width * scale / tile)))
    return cols * tile, rows * tile


def _read(stream: BinaryIO, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        piece = stream.read(n - len(buf))
        if not piece:
            return None
        buf += piece
    return bytes(buf)


def _decode(data: bytes, max_side: int, max_pixels: int, max_tokens: int,
            tile: int) -> tuple[int, int, bytes]:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = max_pixels  # Pillow's own bomb check, beside the header check
    with Image.open(io.BytesIO(data), formats=["PNG", "JPEG"]) as im:
        width, height = im.size
        if max(width, height) > max_side or width * height > max_pixels:
            raise ValueError(f"a {width}x{height} image is larger than accepted")
        target = fit(width, height, max_tokens, tile)
        if im.format == "JPEG":  # libjpeg scales by 1/2..1/8 while decoding: less work, memory
            im.draft("RGB", target)
        im.load()  # every byte decoded here; truncated data raises (LOAD_TRUNCATED_IMAGES)
        rgb = im if im.mode == "RGB" else im.convert("RGB")
        if rgb.size != target:
            rgb = rgb.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
        return rgb.width, rgb.height, rgb.tobytes()


def _limit(memory_bytes: int) -> None:
    # igi_sdk.worker_process.lower_priority's cap, written again here: this script runs without
    # the package (see the module's docstring), so it cannot import it
    try:
        import resource  # POSIX only: elsewhere the wall-time cap is what bounds a decode
    except ImportError:
        return
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if hasattr(os, "nice"):
        os.nice(10)  # decoding gives way to the game and the model


def main() -> int:
    memory = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    from PIL import ImageFile, PngImagePlugin

    ImageFile.LOAD_TRUNCATED_IMAGES = False
    PngImagePlugin.MAX_TEXT_CHUNK = MAX_TEXT_CHUNK
    PngImagePlugin.MAX_TEXT_MEMORY = MAX_TEXT_MEMORY
    warnings.simplefilter("ignore")  # nothing on stderr: the parent reads only the replies
    _limit(memory)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(READY)  # Pillow is loaded: the parent's time cap starts with the request
    stdout.flush()
    while True:
        head = _read(stdin, REQUEST.size)
        if head is None:
            return 0
        max_side, max_pixels, max_tokens, tile, n = REQUEST.unpack(head)
        data = _read(stdin, n)
        if data is None:
            return 0
        try:
            width, height, rgb = _decode(data, max_side, max_pixels, max_tokens, tile)
            reply = REPLY.pack(OK, width, height, len(rgb)), rgb
        except MemoryError:
            msg = b"the image needs more memory to decode than is allowed"
            reply = REPLY.pack(REFUSED, 0, 0, len(msg)), msg
        except Exception as e:  # noqa: BLE001 - every decoder failure is a refused image
            msg = f"the image data is corrupt ({type(e).__name__}: {e})"[:500].encode()
            reply = REPLY.pack(REFUSED, 0, 0, len(msg)), msg
        del data
        stdout.write(reply[0])
        stdout.write(reply[1])
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
