"""The body parsing process: a large Chat Completions body in, what the face acts on out.

Started by :mod:`igi_sdk.http.body_parser` as ``python -m igi_sdk.http._body_worker
MEMORY_BYTES`` (the bundle runs it the same way), with IGI_SDK_CLIENT_ONLY=1 so that the package
never maps llama.cpp here. pydantic's JSON parse is one native call that holds its process's GIL
for as long as the body lasts (tens of milliseconds for a body of tens of MiB): here it is
this process's, at a lower priority than the game, and the sidecar's threads run on.

Framing on stdin/stdout (big-endian): once its imports are done the worker writes
:data:`READY`; a request is :data:`REQUEST` (the body's length) followed by the body; a reply
is :data:`REPLY` (status, header length, images' length) followed by a msgpack header and the
images' bytes, one after another. Status :data:`OK`: the header is the parsed request
(``options``, ``system``, ``history``, ``line``, ``images``: the images' sizes); :data:`REFUSED`:
it is ``[status, code, message]`` of the HTTP error.
"""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO

import msgpack

from igi_sdk.http.errors import HttpError
from igi_sdk.http.parse import Parsed, read
from igi_sdk.worker_process import lower_priority

MODULE = "igi_sdk.http._body_worker"
REQUEST = struct.Struct(">I")  # body length
REPLY = struct.Struct(">BII")  # status, header length, images' length
OK, REFUSED = 0, 1
READY = b"R"


def header(parsed: Parsed) -> bytes:
    return msgpack.packb({
        "options": parsed.options.model_dump_json(by_alias=True),
        "system": parsed.system, "history": parsed.history, "line": parsed.line,
        "prefill": parsed.prefill,
        "results": parsed.results,
        "images": [len(i) for i in parsed.images]})


def _read_into(stream: BinaryIO, buf: bytearray) -> bool:
    view, got = memoryview(buf), 0
    while got < len(buf):
        n = stream.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            return False
        got += n
    return True


def answer(body: bytearray) -> list[bytes]:
    """The reply's parts for one body."""
    try:
        parsed = read(body)
    except HttpError as e:
        refusal = msgpack.packb([e.status, e.code, e.message])
        return [REPLY.pack(REFUSED, len(refusal), 0), refusal]
    except MemoryError:
        refusal = msgpack.packb([413, "request_too_large", "the body needs more memory to read "
                                 "than a request is allowed"])
        return [REPLY.pack(REFUSED, len(refusal), 0), refusal]
    except Exception as e:  # noqa: BLE001 - whatever else the parse raised: a refused body
        refusal = msgpack.packb([400, "invalid_body", f"the body could not be read "
                                 f"({type(e).__name__})"])
        return [REPLY.pack(REFUSED, len(refusal), 0), refusal]
    head = header(parsed)
    return [REPLY.pack(OK, len(head), sum(map(len, parsed.images))), head, *parsed.images]


def main() -> int:
    memory = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    lower_priority(memory)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(READY)
    stdout.flush()
    size = bytearray(REQUEST.size)
    while _read_into(stdin, size):
        (n,) = REQUEST.unpack(size)
        body = bytearray(n)
        if not _read_into(stdin, body):
            return 0
        parts = answer(body)
        del body
        for part in parts:
            stdout.write(part)
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
