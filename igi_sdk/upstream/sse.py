"""Server-sent events read with a bound: an upstream's stream is split into lines by this
reader, which refuses a line longer than its limit before holding it (httpx's own line iterator
would keep growing one line without end)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from igi_sdk.errors import UpstreamUnavailableError


def data_lines(chunks: Iterable[bytes], max_line: int) -> Iterator[bytes]:
    """The payload of each ``data:`` line of an event stream (comments, ``event:``/``id:``
    lines and blank lines skipped); UpstreamUnavailableError for a line over ``max_line``."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        while True:
            end = pending.find(b"\n")
            if end < 0:
                break
            if end > max_line:
                raise UpstreamUnavailableError(
                    f"the upstream sent an event line longer than {max_line} bytes")
            line = bytes(pending[:end]).rstrip(b"\r")
            del pending[:end + 1]
            if line.startswith(b"data:"):
                yield line[5:].lstrip(b" ")
        if len(pending) > max_line:
            raise UpstreamUnavailableError(
                f"the upstream sent an event line longer than {max_line} bytes")
    line = bytes(pending).rstrip(b"\r")
    if line.startswith(b"data:"):
        yield line[5:].lstrip(b" ")
