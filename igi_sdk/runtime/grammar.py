"""Constrained replies: a GBNF grammar compiled by llguidance and applied as a token mask.

Not llama.cpp's grammar sampler: that one keeps a parse stack per way of skipping the nullable
elements in reach, so nested optional rules make it exponential, inside one native call per
token on the engine thread (a 127-byte grammar of nested optionals took 44 s for 8 tokens, a
142-byte one did not end in 200 s, and no cancel could stop it). llguidance runs an Earley
parser over a lexer, with fuel limits on each step (:data:`LIMITS`): the work of one token is
bounded whatever the grammar, and a grammar that needs more is refused when it is compiled or
ends its reply with :class:`InvalidGrammarError`.

GBNF is turned into llguidance's Lark dialect by llguidance's own converter: a rule made only
of literals, character classes and other such rules becomes a lexeme (a regular expression),
matched greedily, as lexers do.
"""

from __future__ import annotations

import ctypes
import functools
import json
import re
import threading
from typing import Any

import llama_cpp
import llguidance
import numpy as np
from llguidance import gbnf_to_lark as _g2l

from igi_sdk.errors import InvalidGrammarError

# Per-step fuel (llguidance's speeds: ~20 000 Earley items and ~14 000 lexer fuel per ms): a
# token's mask or acceptance costs at most a few tens of ms on a slow core, however the grammar
# is built; a grammar's lexer and size are bounded when it is compiled.
LIMITS = dict(
    step_max_items=50_000,  # Earley items per step (llguidance's default)
    step_lexer_fuel=200_000,  # lexer work per step (default)
    initial_lexer_fuel=1_000_000,  # building the lexer's regexes (default)
    max_items_in_row=2_000,  # ambiguity of one row (default)
    max_lexer_states=20_000,  # 1-2 kB each: about 40 MB at most (default 250 000)
    max_grammar_size=200_000,  # symbols after conversion (default 500 000)
    verbose_errors=False,  # errors must not echo the grammar or the reply: they reach logs
)
ERROR_CHARS = 300  # an error (or a grammar) is player/mod data: at most this much of it is shown


def _limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**LIMITS)  # type: ignore[arg-type]


def clip(text: str, n: int = ERROR_CHARS) -> str:
    return text if len(text) <= n else text[:n] + f"... [{len(text) - n} more characters]"


# The converter writes a repetition of a repetition without parentheses ("x??" for GBNF
# `("x"?)?`), which its own Lark parser then refuses: a repetition is not an atom.
_g2l.RepetitionNode.is_atomic = lambda self: False  # type: ignore[method-assign]


# ... and writes \u00e9 as "\ue9", which no parser reads: a \u or \U escape goes in as the
# character itself (never GBNF syntax past ASCII) or, in ASCII, as \xHH, which it keeps.
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.S)


def _plain_escape(m: re.Match[str]) -> str:
    code = m.group(1)
    if len(code) == 1:
        return m.group(0)
    cp = int(code[1:], 16)
    if cp < 0x80:
        return f"\\x{cp:02x}"
    if cp > 0x10FFFF or 0xD800 <= cp < 0xE000:
        return m.group(0)  # refused by the converter as before
    return chr(cp)


def _to_lark(gbnf: str) -> str:
    """The converter's gbnf_to_lark, with every rule but root renamed r<i>_<name>: its own
    renaming (- to _, lower/upper case) makes names Lark refuses ("--kv" for a JSON property
    "é") or two rules of one name ("a-b" and "a_b")."""
    rules = _g2l.GrammarParser().parse(gbnf)
    names = {n: n if n == "root" else f"r{i}_{_UNSAFE.sub('_', n.lower())[:40]}"
             for i, n in enumerate(rules)}
    for name, rule in rules.items():
        rule.name = names[name]
        todo: list[_g2l.ASTNode] = [rule.alternatives]
        while todo:
            node = todo.pop()
            if isinstance(node, _g2l.RuleRefNode) and node.name in names:
                node.name = names[node.name]
            todo.extend(node.children())
    renamed = {r.name: r for r in rules.values()}
    _g2l.resolve(renamed)
    out = ["%llguidance {}\n"]
    out.extend(str(r) for r in sorted(renamed.values(), key=lambda r: r.order))
    return "\n".join(out) + "\n"


_UNSAFE = re.compile(r"[^a-z0-9]")


@functools.lru_cache(maxsize=64)  # a chain is rebuilt on every reshard: convert a grammar once
def compile_gbnf(gbnf: str) -> str:
    """llguidance's grammar for the GBNF ``gbnf`` (checked against :data:`LIMITS`, without a
    vocabulary: what depends on one is checked by :class:`GrammarMatcher`)."""
    try:
        lark = _to_lark(_ESCAPE.sub(_plain_escape, gbnf))
    except RecursionError:
        raise InvalidGrammarError("the grammar nests too deep to convert") from None
    except Exception as e:  # noqa: BLE001 - the converter raises bare Exceptions on bad input
        raise InvalidGrammarError(f"the grammar does not parse as GBNF: {clip(str(e))}") from None
    return _validated(llguidance.LLMatcher.grammar_from_lark(lark))


# a JSON schema goes to llguidance's own compiler (not via GBNF: llama.cpp's converter writes
# maxLength n as n nested groups, deeper than Lark nests); one optional space between tokens,
# as llama.cpp's converter allows; keywords it does not implement are ignored, as there
JSON_OPTIONS = {"whitespace_pattern": " ?", "lenient": True}
COMPILED_PREFIX = '{"grammars":'  # llguidance's grammar JSON; GBNF never starts so


@functools.lru_cache(maxsize=64)
def compile_json_schema(schema_json: str) -> str:
    """llguidance's grammar for a JSON schema (as JSON text, checked by the caller's limits)."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            _closed_objects(schema_json), defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    except ValueError as e:
        raise InvalidGrammarError(f"the JSON schema is refused: {clip(str(e))}") from None
    return _validated(grammar)


@functools.lru_cache(maxsize=64)
def compile_lark(lark: str) -> str:
    """llguidance's grammar for Lark text written by the SDK itself (runtime/tools.py: text or
    calls of declared tools, with ``%json`` schemas inline), checked against :data:`LIMITS`
    as a GBNF grammar is."""
    # llguidance's grammar JSON (what GrammarMatcher takes as compiled, COMPILED_PREFIX)
    return _validated(json.dumps({"grammars": [{"lark_grammar": lark}]}))


def closed_objects(schema_json: str) -> str:
    """:func:`_closed_objects`, for schemas compiled inside another grammar (tools)."""
    return _closed_objects(schema_json)


def bounded_strings(schema_json: str, chars: int, items: int) -> str:
    """The schema with ``maxLength: chars`` on every string it leaves unbounded (no maxLength,
    enum, const or pattern) and ``maxItems: items`` on every such array: a tool call must close
    within a reply's tokens, and a small model at a high temperature filled one unbounded
    string until ``max_tokens`` cut the call (a reply with neither a call nor text)."""
    tree = json.loads(schema_json)
    for node in _schema_nodes(tree):
        kind = node.get("type")
        free = not any(k in node for k in ("enum", "const", "pattern"))
        if kind == "string" and free and "maxLength" not in node:
            node["maxLength"] = chars
        elif kind == "array" and "maxItems" not in node:
            node["maxItems"] = items
    return json.dumps(tree)


def free_strings(schema_json: str) -> int:
    """How many strings :func:`bounded_strings` bounds in the schema (a free string inside an
    array counts once: the array is bounded by items, its strings by characters)."""
    return sum(1 for node in _schema_nodes(json.loads(schema_json))
               if node.get("type") == "string" and "maxLength" not in node
               and not any(k in node for k in ("enum", "const", "pattern")))


def _schema_nodes(tree: object) -> list[dict[str, Any]]:
    """Every sub-schema of ``tree`` (maps only), found without recursion."""
    out, todo = [], [tree]
    while todo:  # schemas only: a property *named* "properties" is not a keyword
        node = todo.pop()
        if not isinstance(node, dict):
            continue
        out.append(node)
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                todo.extend(node[key].values())
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                todo.extend(node[key])
        todo.extend(node.get(key) for key in _SCHEMA_ONE)
    return out


def _closed_objects(schema_json: str) -> str:
    """The schema with ``additionalProperties: false`` wherever an object lists ``properties``
    and says nothing of others: what a game means by {"price": integer} (and what llama.cpp's
    own schema converter does), where the JSON Schema default would let a small model add
    properties until its tokens run out mid-string. Iterative: the depth is bounded already."""
    tree = json.loads(schema_json)
    todo: list[object] = [tree]
    while todo:  # schemas only: a property *named* "properties" is not a keyword
        node = todo.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("properties"), dict) and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                todo.extend(node[key].values())
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                todo.extend(node[key])
        todo.extend(node.get(key) for key in _SCHEMA_ONE)
    return json.dumps(tree)


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames", "unevaluatedProperties", "additionalItems")


def _validated(grammar: str) -> str:
    err = llguidance.LLMatcher.validate_grammar(grammar, None, limits=_limits())
    if err and not err.startswith("WARNING"):
        raise InvalidGrammarError(f"the grammar is refused: {clip(err)}")
    return grammar


# llguidance's view of a vocabulary (its token trie; ~0.5 s to build for 49k tokens), kept per
# token table: a reshard or a reload of the same model finds it again. Built from the pieces
# alone (no pointer into llama.cpp is kept: the model it came from may be freed).
_TOKENIZERS_KEPT = 4
_tokenizers: dict[tuple[object, ...], tuple[llguidance.LLTokenizer, np.ndarray]] = {}
_tokenizers_lock = threading.Lock()


def _piece(vocab: llama_cpp.llama_vocab_p, token: int, buf: ctypes.Array[ctypes.c_char]) -> bytes:
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    piece = buf.raw[:n]
    # control tokens are special to llguidance (b"\xff" first): grammar text never spells one
    if llama_cpp.llama_vocab_get_attr(vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
        return b"\xff" + piece
    return piece


def _fingerprint(vocab: llama_cpp.llama_vocab_p) -> tuple[object, ...]:
    """A cheap key of the token table: its size, its first and last 64 pieces and 256 spread
    over it (models that share it share a tokenizer)."""
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(256)
    ids = sorted({*range(min(n, 64)), *range(max(0, n - 64), n), *range(0, n, max(1, n // 256))})
    return (n, *(_piece(vocab, t, buf) for t in ids))


class _Pieces:
    """What llguidance.TokenizerWrapper reads: the token table, and a tokenizer over it
    (greedy longest match: llguidance asks it for the tokens of text a grammar forces)."""

    def __init__(self, tokens: list[bytes], eos: int) -> None:
        self.tokens, self.eos_token_id = tokens, eos
        self.bos_token_id: int | None = None
        self.special_token_ids: list[int] = []
        self._ids: dict[bytes, int] = {}
        for i, t in enumerate(tokens):
            if t and not t.startswith(b"\xff"):
                self._ids.setdefault(t, i)
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: bytes) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            for j in range(min(len(text), i + self._longest), i, -1):
                tok = self._ids.get(text[i:j])
                if tok is not None:
                    out.append(tok)
                    i = j
                    break
            else:  # a byte no token spells (byte-level vocabularies have every one)
                i += 1
        return out


def tokenizer_for(vocab: llama_cpp.llama_vocab_p) -> tuple[llguidance.LLTokenizer, np.ndarray]:
    """The llguidance tokenizer of ``vocab`` and its end-of-generation token ids."""
    key = _fingerprint(vocab)
    with _tokenizers_lock:
        hit = _tokenizers.get(key)
        if hit is not None:
            return hit
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        buf = ctypes.create_string_buffer(256)
        pieces = [_piece(vocab, t, buf) for t in range(n)]
        # every end-of-generation token ends a reply the grammar accepts, as with llama.cpp's
        # grammar sampler
        eog = [t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        if not eog:
            eog = [llama_cpp.llama_vocab_eos(vocab)]
        tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Pieces(pieces, eog[0])),
                                     eos_token=eog)
        while len(_tokenizers) >= _TOKENIZERS_KEPT:
            del _tokenizers[next(iter(_tokenizers))]
        hit = _tokenizers[key] = (tok, np.array(eog, dtype=np.int64))
        return hit


class GrammarMatcher:
    """One reply's grammar state: which tokens may come next, and the tokens taken so far."""

    def __init__(self, grammar: str, vocab: llama_cpp.llama_vocab_p) -> None:
        """``grammar``: GBNF, or what :func:`compile_json_schema` made."""
        compiled = grammar if grammar.startswith(COMPILED_PREFIX) else compile_gbnf(grammar)
        tok, self._eog = tokenizer_for(vocab)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self._m = llguidance.LLMatcher(tok, compiled, log_level=0, limits=_limits())
        self._check("the grammar is refused")
        self._words = np.zeros((tok.vocab_size + 31) // 32, dtype=np.int32)
        self.taken = 0
        self._ended = False  # an end token was taken: the grammar is done with this reply

    def _check(self, what: str) -> None:
        if self._m.is_error():
            raise InvalidGrammarError(f"{what}: {clip(self._m.get_error())}")

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows next (bool per token id)."""
        if self._ended:  # a reply that goes on past an end token (ignore_eos): ends only
            ok = np.zeros(self.n_vocab, dtype=bool)
            ok[self._eog] = True
            return ok
        w = self._words
        self._m.unsafe_compute_mask_ptr(w.ctypes.data, w.nbytes)
        self._check(f"the grammar needed more work than a step allows at token {self.taken}")
        return np.unpackbits(w.view(np.uint8), bitorder="little")[: self.n_vocab].astype(bool)

    def accept(self, token: int) -> None:
        if not self._ended:
            self._ended = token in self._eog
            if not self._m.consume_token(token):
                self._check(f"the grammar refused token {self.taken}")
        self.taken += 1

    def replay(self, tokens: list[int]) -> None:
        """The state after ``tokens`` (a reply so far, replayed after a reshard)."""
        for t in tokens:
            self.accept(t)
