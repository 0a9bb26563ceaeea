"""How many JSON values a request body holds, bounded before it is parsed.

pydantic parses and validates a body in one call that holds the GIL: a body of millions of
tiny values (``[{"type":"text","text":"a"}, ...]`` to the 32 MiB cap) held it for over a
second, and every thread of the sidecar (its control plane included) waited. The size of a
body says little (a 16 MiB image is one string); what a parse costs follows the number of
values, and a value past the first needs a ``,``, ``[`` or ``{`` before it. Those are counted
outside strings here, with ``bytes.count`` and ``bytes.find`` (each a short C call), and in
the rare body where commas inside its text could matter, a string at a time, with a budget
of steps so that no body costs more than a bounded walk.
"""

from __future__ import annotations

from igi_sdk.http.errors import HttpError

# what a request within the schema's caps needs at most (256 turns of 20 parts, each part a
# few values: ~16k), with room for the fields an OpenAI client adds that the face ignores
MAX_VALUES = 1 << 15
# steps of the walk at most (a string, an escaped quote, 64 backslashes): a transcript of 256
# long turns of dialogue has ~250k escaped quotes; a step costs about a microsecond
MAX_STEPS = 1 << 20
_SEPARATORS = (b",", b"[", b"{")
_RUN = 64  # backslashes looked at per step


_SLICE = 1 << 20  # bytes counted per call: the GIL changes hands between calls


def _separators(body: bytes | bytearray, start: int, end: int) -> int:
    return sum(body.count(c, i, min(i + _SLICE, end))
               for i in range(start, end, _SLICE) for c in _SEPARATORS)


# escaped characters (``\n``, ``\"``, ``\u00e9`` ...) at most: pydantic decodes each one in
# its GIL-holding parse (a 30 MiB body of ``\u00e9`` held the GIL 0.55-0.73 s and put the
# ZeroMQ face's ping at p99 322 ms on the 2-core machine). 512k escapes parse in 7-25 ms, and a
# legal transcript has fewer (256 turns of dialogue at the text cap: ~310k escaped quotes); as
# ``\u`` escapes of non-ASCII text they are more than any model's context reads (~200k tokens)
MAX_ESCAPES = 1 << 19


def over_escapes(body: bytes | bytearray, limit: int = MAX_ESCAPES) -> bool:
    """Whether ``body`` holds more than ``limit`` backslashes (an upper bound on its escaped
    characters), counted a slice at a time so that the GIL changes hands between calls."""
    found = 0
    for i in range(0, len(body), _SLICE):
        found += body.count(b"\\", i, i + _SLICE)
        if found > limit:
            return True
    return False


def over_values(body: bytes | bytearray, limit: int = MAX_VALUES,
                max_steps: int = MAX_STEPS) -> bool:
    """Whether ``body`` holds more than ``limit`` JSON values (True also when it cannot be
    told within ``max_steps``, which no body within the schema's caps needs)."""
    if _separators(body, 0, len(body)) <= limit:
        return False  # counted inside strings too: an upper bound, and the usual answer
    found, pos, steps = 0, 0, 0
    while True:
        quote = body.find(b'"', pos)
        found += _separators(body, pos, len(body) if quote < 0 else quote)
        steps += 1
        if found > limit or steps > max_steps:
            return True
        if quote < 0:
            return False
        end = quote  # the string's closing quote: the next one not escaped
        while True:
            end = body.find(b'"', end + 1)
            if end < 0:
                return False  # an unterminated string: the parser refuses it at once
            backslashes, at = 0, end
            while True:  # the run of backslashes before the quote (the opening quote ends it)
                window = body[max(quote + 1, at - _RUN):at]
                run = len(window) - len(window.rstrip(b"\\"))
                backslashes, at, steps = backslashes + run, at - run, steps + 1
                if run < _RUN or steps > max_steps:
                    break
            if steps > max_steps:
                return True
            if backslashes % 2 == 0:  # an odd run escapes the quote
                break
        pos = end + 1


def refuse_unbounded(body: bytes | bytearray, values_are: str = "") -> None:
    """A 413 for a body with more JSON values or escaped characters than a parse may take:
    checked before pydantic's parse, which holds the GIL for as long as the body has them.
    ``values_are``: what the values of this route's body are, for the message."""
    if over_values(body):
        note = f" ({values_are})" if values_are else ""
        raise HttpError(413, "request_too_large", f"the body holds more than {MAX_VALUES} "
                        f"JSON values{note}")
    if over_escapes(body):
        raise HttpError(413, "request_too_large", f"the body holds more than {MAX_ESCAPES} "
                        "escaped characters (send its text as UTF-8, not \\u escapes)")
