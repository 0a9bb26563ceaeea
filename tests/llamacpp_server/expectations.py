"""The expected outcome of each of llama.cpp's server tests against the sidecar's HTTP face.

File format (``expected.txt``): sections, each a header line ``[outcome] reason`` followed by
test ids, one a line (pytest node ids relative to their ``tools/server/tests``). ``#`` starts a
comment line. Outcomes:

- ``pass``: must pass;
- ``partial``: the reason starts with a backquoted piece of source, ``[partial] `PIECE` why``:
  the test must fail, at a line holding PIECE: every check before it passed, and the check that
  fails asserts what only llama-server or its test model gives (its build number as
  ``system_fingerprint``, its debug echo of the prompt, token counts of its tokenizer);
- ``incompatible``: a known incompatibility: must fail (when it passes, the list is stale);
- ``skip``: not run (a llama-server-only extension, text only their test model produces, or the
  same request to the sidecar as another test's: the parameters differ only in llama-server's
  own options, which the sidecar does not have).

An id ending in ``*`` covers every test id it begins; an exact id wins over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OUTCOMES = ("pass", "partial", "incompatible", "skip")


@dataclass(frozen=True)
class Expected:
    outcome: str
    reason: str
    at: str = ""  # partial: a piece of the source line where the test fails


def parse(text: str) -> dict[str, Expected]:
    out: dict[str, Expected] = {}
    current: Expected | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            outcome, sep, reason = line[1:].partition("]")
            if not sep or outcome not in OUTCOMES:
                raise ValueError(f"line {n}: a header is [{'|'.join(OUTCOMES)}] reason")
            reason = reason.strip()
            if outcome != "pass" and not reason:
                raise ValueError(f"line {n}: a {outcome} section says why")
            at = ""
            if outcome == "partial":
                piece, sep, _ = reason[1:].partition("`")
                if not reason.startswith("`") or not sep or not piece:
                    raise ValueError(f"line {n}: a partial section begins with `source piece`")
                at = piece
            current = Expected(outcome, reason, at)
            continue
        if current is None:
            raise ValueError(f"line {n}: a test id before any [outcome] header")
        if line in out:
            raise ValueError(f"line {n}: {line} is listed twice")
        out[line] = current
    return out


def match(expected: dict[str, Expected], nodeid: str) -> Expected | None:
    """An exact id, else the longest ``prefix*`` entry that begins it."""
    if nodeid in expected:
        return expected[nodeid]
    best: tuple[int, Expected] | None = None
    for key, exp in expected.items():
        if key.endswith("*") and nodeid.startswith(key[:-1]):
            if best is None or len(key) > best[0]:
                best = (len(key), exp)
    return best[1] if best else None


def load(path: Path) -> dict[str, Expected]:
    return parse(path.read_text(encoding="utf-8"))
