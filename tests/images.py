"""Test images made without an image library: a test card and a minimal PNG encoder."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def card(seed: int = 0, width: int = 64, height: int = 64) -> np.ndarray:
    """An RGB test card: smooth gradients plus noise (something for an encoder to see)."""
    y, x = np.mgrid[0:height, 0:width]
    noise = np.random.default_rng(seed).integers(0, 64, (height, width))
    rgb = np.stack([x * 4, y * 4, (x + y) * 2 + noise], axis=-1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def png(rgb: np.ndarray) -> bytes:
    """A minimal 8-bit RGB PNG (no filter on every row), with zlib only."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\0" + rgb[r].tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))
