"""A Chat Completions body read into what the face acts on (:class:`Parsed`), every bound checked
before the parse that would cost more: no sockets, no sidecar, no event loop. Run in the face's
process for a small body and in its body parsing process for a large one
(http/body_parser.py)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from pydantic import ValidationError

from igi_sdk.http import sampling_options
from igi_sdk.http import tools as http_tools
from igi_sdk.http.conversations import Turn
from igi_sdk.http.errors import HttpError
from igi_sdk.http.json_bound import refuse_unbounded
from igi_sdk.http.schema import ChatCompletionRequest, ChatOptions
from igi_sdk.wire import protocol as P

DATA_URL_PREFIXES = ("data:image/png;base64,", "data:image/jpeg;base64,",
                     "data:image/jpg;base64,")


@dataclass(frozen=True)
class Parsed:
    """A request body read: its options, the system prompt, the earlier turns, the new line
    and that line's images (decoded from base64). ``prefill``: the transcript ends with an
    assistant message, the last of ``history``, which the reply continues (``line`` is "")."""

    options: ChatOptions
    system: str
    history: list[Turn]
    line: str
    images: list[bytes]
    prefill: bool = False
    # the results of the last reply's calls (call id, content): the tool messages that end
    # the transcript (the line is then "")
    results: tuple[tuple[str, str], ...] = ()


def read(body: bytes | bytearray) -> Parsed:
    """The request in ``body``, every bound checked; HttpError when it is refused."""
    req = _parse(body)
    http_tools.check(req)
    req, results = http_tools.trailing_results(req)
    system, history, line, images = _split(req)
    prefill = req.messages[-1].role == "assistant"
    return Parsed(req.options(), system, history, line, images, prefill=prefill, results=results)


def _parse(body: bytes | bytearray) -> ChatCompletionRequest:
    # pydantic parses in one call that holds the GIL, for as long as the body has values
    refuse_unbounded(body, "messages, parts and fields together")
    try:
        # pydantic's JSON reader refuses nesting past its own recursion limit (a 400 here),
        # so the body is not scanned for nesting first: that walk held the GIL for seconds
        # on a body with a large image. It reads the bytes (checking UTF-8 as it goes): a
        # decode to str first was one more GIL-long call over the whole body
        req = ChatCompletionRequest.model_validate_json(body)
    except ValidationError as e:
        # the deepest error says the most: a content that is neither a string nor a valid
        # list of parts fails both, and "should be a valid string" hid "the image's URL is too
        # long" (the first error of the first field, in its union's order)
        first = max(e.errors(include_url=False), key=lambda err: len(err.get("loc", ())))
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise HttpError(400, "invalid_body", f"{where}: {first.get('msg')}") from None
    sampling_options.check(req)
    fmt = req.response_format
    schema = fmt.json_schema.schema_ if fmt is not None and fmt.json_schema is not None else None
    if schema is not None and P.nesting(schema, P.MAX_NESTING) > P.MAX_NESTING:
        raise HttpError(400, "invalid_body", "response_format.json_schema.schema nests more "
                        f"than {P.MAX_NESTING} objects/arrays deep")
    return req


def _split(req: ChatCompletionRequest) -> tuple[str, list[Turn], str, list[bytes]]:
    """(system prompt, earlier turns, the new line, its images). System (and developer)
    messages after the first other one stay where they stand, as system turns; a transcript
    that ends with an assistant message is continued: that message is the last turn and the
    line is empty."""
    msgs = list(req.messages)
    system_parts = []
    while msgs and msgs[0].role in ("system", "developer"):
        system_parts.append(msgs.pop(0).text())
    if not msgs or msgs[-1].role not in ("user", "assistant"):
        raise HttpError(400, "invalid_argument", "the last message must be the user's line, "
                        "or an assistant message for the reply to continue")
    prefill = msgs[-1].role == "assistant"
    if prefill and len(msgs) > 1 and msgs[-2].role == "assistant":
        # one assistant message is the reply to continue; two have no line between them to
        # answer (llama-server refuses them alike)
        raise HttpError(400, "invalid_argument", "Cannot have 2 or more assistant messages at "
                        "the end of the list: one is continued as the reply's beginning")
    turns: list[Turn] = []
    for m in msgs if prefill else msgs[:-1]:
        if m.role not in ("user", "assistant", "tool", "system", "developer"):
            raise HttpError(400, "invalid_argument", f"messages of role '{m.role}' are not "
                            "read in a transcript")
        if m.image_urls():
            raise HttpError(400, "invalid_argument", "images are read with the newest line only")
        turns.append(("system", m.text()) if m.role in ("system", "developer")
                     else http_tools.turn_of(m))
    system = "\n\n".join(system_parts)
    if prefill:  # the line is the continued assistant message, already a turn
        _fits(len(system.encode()) + sum(len("".join(t).encode()) for t in turns),
              "the transcript")
        return system, turns, "", []
    last = msgs[-1]
    # a transcript opens a session in one protocol message (its history)
    _fits(len(system.encode()) + sum(len("".join(t).encode()) for t in turns), "the transcript")
    images = _images(last.image_urls())
    schema = _schema_size(req)
    _fits(len(last.text().encode()) + sum(map(len, images)) + schema, "the line with its images")
    return system, turns, last.text(), images


# what one protocol message holds beside its texts and images: the envelope and options
_ROOM = 64 << 10


def _fits(size: int, what: str) -> None:
    """Refuse what the sidecar's socket would drop unanswered (MAX_MESSAGE_BYTES)."""
    if size > P.MAX_MESSAGE_BYTES - _ROOM:
        raise HttpError(413, "request_too_large", f"{what} is over the "
                        f"{P.MAX_MESSAGE_BYTES - _ROOM} bytes one request to the sidecar holds")


def rewrite_fits(history: tuple[Turn, ...], line: str, images: list[bytes]) -> None:
    """A line sent with its transcript (``chat.history``) is one protocol message: 413 when
    the two together are over what one carries (each alone was checked by :func:`read`)."""
    _fits(sum(len("".join(t).encode()) for t in history) + len(line.encode())
          + sum(map(len, images)), "the transcript with the line and its images")


def _schema_size(req: ChatCompletionRequest) -> int:
    fmt = req.response_format
    if fmt is None or fmt.json_schema is None or fmt.json_schema.schema_ is None:
        return 0
    return len(json.dumps(fmt.json_schema.schema_).encode())


def _images(urls: list[str]) -> list[bytes]:
    """The line's data URLs decoded, once their count and size are known to fit."""
    if len(urls) > P.MAX_IMAGES:
        raise HttpError(400, "invalid_image", f"a line carries at most {P.MAX_IMAGES} images")
    payloads = []
    for url in urls:
        if not url.startswith(DATA_URL_PREFIXES):
            raise HttpError(400, "invalid_image", "images must be PNG or JPEG data URLs "
                            "(data:image/png;base64,...): the sidecar fetches nothing")
        payloads.append(url[url.index(",") + 1:])
    # checked on the encoded length, before anything is decoded: base64 is 4 chars a 3 bytes
    if sum(len(p) * 3 // 4 for p in payloads) > P.MAX_IMAGE_BYTES:
        raise HttpError(413, "request_too_large", f"a line's images together are over "
                        f"{P.MAX_IMAGE_BYTES} bytes")
    return [_decode(p) for p in payloads]


_SLICE = 1 << 20  # base64 characters decoded at a time (a multiple of 4)


def _decode(b64: str) -> bytes:
    """Strict base64 (no padding inside, nothing outside the alphabet), a slice at a time:
    the decoder holds the GIL, and between slices the event loop's thread runs."""
    out = []
    try:
        for i in range(0, len(b64), _SLICE):
            part = b64[i:i + _SLICE]
            if i + _SLICE < len(b64) and part.endswith("="):
                raise binascii.Error("padding inside the data")
            # validate: nothing outside the alphabet, padding only at the end (a2b_base64's
            # strict_mode says the same, from Python 3.11 on)
            out.append(base64.b64decode(part, validate=True))
    except (binascii.Error, ValueError):  # ValueError: characters outside ASCII
        raise HttpError(400, "invalid_image", "the image's base64 does not decode") from None
    data = b"".join(out)
    if not data:
        raise HttpError(400, "invalid_image", "the image is empty")
    return data
