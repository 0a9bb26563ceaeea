"""Tool calls: the declared tools in the prompt, the grammar that holds a reply to them, and the
calls read back out of the reply's text.

A reply with tools is plain text or a run of calls, each written
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (the Hermes/Qwen form most
instruct models were tuned on). llguidance holds the reply to that form (:func:`lark_grammar`):
a call always names a declared tool and its arguments are valid against the tool's schema,
whatever the model. The engine keeps the call text in the conversation (the next line's
prefix matches the cache) and hands each call on as a typed event; nothing here touches the
engine's state.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from igi_sdk.errors import InvalidGrammarError, InvalidToolsError
from igi_sdk.events import ToolCall
from igi_sdk.runtime.grammar import bounded_strings, closed_objects, compile_lark, free_strings
from igi_sdk.runtime.sampling import check_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# a call's unbounded strings and arrays are held to these (grammar.bounded_strings): NPC
# actions take names and short phrases, and a call must close within the reply's tokens
ARG_CHARS = 96
ARG_ITEMS = 8
# ... and to what a reply's max_tokens leaves them (call_chars), never below this
MIN_ARG_CHARS = 4
MAX_CALLS = 8  # calls in one reply with parallel_tool_calls (protocol.MAX_CALLS)
CHOICES = ("auto", "none", "required")
# one optional space between JSON tokens, as json_schema replies allow (grammar.JSON_OPTIONS)
_JSON_OPTIONS = {"whitespace_pattern": " ?", "lenient": True}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: str  # the arguments' JSON schema, as JSON text


@dataclass(frozen=True)
class ToolSpec:
    """What a line declares: its tools, ``choice`` (auto, none, required or a tool's name)
    and whether a reply may make several calls."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True

    @staticmethod
    def of(tools: Sequence[tuple[str, str, object]], choice: str = "auto",
           parallel: bool = True) -> ToolSpec:
        """From (name, description, parameters as a map or JSON text)."""
        out = []
        for name, description, params in tools:
            text = params if isinstance(params, str) else json.dumps(params, ensure_ascii=False)
            out.append(Tool(name, description, text))
        return ToolSpec(tuple(out), choice, parallel)


@dataclass(frozen=True)
class ToolPlan:
    """A line's tools made ready (on the grammar worker): the system prompt's block and the
    compiled grammar (None: ``none``, the reply is not constrained)."""

    spec: ToolSpec
    block: str
    grammar: str | None
    # the fewest tokens another call takes (the smallest tool's markup, at least): a reply
    # with fewer left ends after its calls (0: never)
    call_tokens: int = 0


def prepare(spec: ToolSpec, max_tokens: int = 0) -> ToolPlan:
    """Check every schema within the JSON-schema limits, then compile the line's grammar
    (for a reply of at most ``max_tokens``, 0: unknown). InvalidToolsError (``invalid_body``)
    for a schema refused: by the limits, before any compile, or by llguidance."""
    names = [t.name for t in spec.tools]
    if len(set(names)) != len(names):
        raise InvalidToolsError("tool names must be unique")
    if spec.choice not in CHOICES and spec.choice not in names:
        raise InvalidToolsError(f"tool_choice '{spec.choice[:64]}' names no declared tool")
    schemas = []
    for t in spec.tools:
        try:
            tree = json.loads(t.parameters)
        except (ValueError, RecursionError):
            raise InvalidToolsError(f"tool '{t.name}': parameters are not JSON") from None
        if not isinstance(tree, dict):
            raise InvalidToolsError(f"tool '{t.name}': parameters must be a JSON object")
        try:
            check_schema(tree)
        except InvalidGrammarError as e:
            raise InvalidToolsError(f"tool '{t.name}': {e.message}") from None
        schemas.append(tree)
    block = system_block(spec.tools)
    if spec.choice == "none" or not spec.tools:
        return ToolPlan(spec, block, None)
    lark = lark_grammar(spec, schemas, max_tokens)
    try:
        return ToolPlan(spec, block, compile_lark(lark), call_tokens=_fewest_call_tokens(spec))
    except InvalidGrammarError as e:
        raise InvalidToolsError(f"the tools' schemas are refused: {e.message}") from None


# --- the prompt ----------------------------------------------------------------------------


def system_block(tools: Sequence[Tool]) -> str:
    """The tools as the system prompt's last block: one JSON line per tool, written the same
    way for the same tools (the KV cache keeps a conversation's prefix only while its text
    does not change)."""
    if not tools:
        return ""
    lines = []
    for t in tools:
        fn = {"name": t.name, "description": t.description,
              "parameters": json.loads(t.parameters)}
        lines.append(json.dumps({"type": "function", "function": fn}, ensure_ascii=False,
                                sort_keys=False))
    return ("# Tools\n\nYou may call one or more functions to act. The functions are listed "
            "within <tools></tools>:\n<tools>\n" + "\n".join(lines) + "\n</tools>\n\n"
            "To call a function, answer with nothing but, for each call:\n"
            f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}\n'
            "Otherwise answer in plain text.")


def with_tools(messages: list[dict[str, str]], block: str, tool_role: bool
               ) -> list[dict[str, str]]:
    """The messages the chat template renders: ``block`` closes the first system message (or
    is one, first), and tool results are ``tool`` messages where the template renders that
    role (``tool_role``), else user messages wrapped in <tool_response>. Contents stay data:
    the template's markup alone carries special tokens (runtime/text.py)."""
    out = [dict(m) for m in messages]
    if block:
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    if not tool_role:
        for m in out:
            if m["role"] == "tool":
                m["role"] = "user"
                m["content"] = f"<tool_response>\n{m['content']}\n</tool_response>"
    return out


def renders_tool_role(template: bytes) -> bool:
    """Whether llama.cpp's built-in template writes a ``tool`` message as one (ChatML writes
    any role; templates that map roles to their own names drop or refuse it)."""
    return template == b"chatml" or b"<|im_start|>" in template


def result_messages(results: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """A line's tool results as messages (the role is rewritten where the template needs it:
    :func:`with_tools`)."""
    return [{"role": "tool", "content": content} for _id, content in results]


def calls_text(calls: Sequence[tuple[str, str, str]]) -> str:
    """An earlier reply's calls (id, name, arguments JSON) as the reply text the model writes."""
    parts = []
    for _id, name, args in calls:
        try:
            arguments = json.loads(args)
        except ValueError:
            arguments = args  # kept as text: history is the client's, not checked here
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        parts.append(f"{OPEN}\n{body}\n{CLOSE}")
    return "\n".join(parts)


# --- the grammar ---------------------------------------------------------------------------


def call_chars(name: str, schema: dict[str, object], max_tokens: int) -> int:
    """The longest free string of a call of this tool such that the call closes within
    ``max_tokens`` (0: unknown): its markup counted at 2.5 characters a token (SmolLM2's
    vocabulary gives a call's markup 2.8, larger vocabularies more) and each free string at a
    token a character (characters of several tokens each, rare outside ASCII, may still
    run past it). A 64-token reply cut inside a call of two 96-character strings had neither
    a call nor text."""
    n = free_strings(json.dumps(schema))
    if max_tokens <= 0 or n == 0:
        return ARG_CHARS
    props = schema.get("properties")
    keys = list(props) if isinstance(props, dict) else []
    markup = len(f"{OPEN}\n\n{CLOSE}") + len(json.dumps(
        {"name": name, "arguments": dict.fromkeys(keys, "")}))
    left = max_tokens - (2 * markup + 4) // 5
    return max(MIN_ARG_CHARS, min(ARG_CHARS, left // n))


def _fewest_call_tokens(spec: ToolSpec) -> int:
    """The tokens the smallest call of ``spec`` takes at least (its markup with no arguments,
    at 2.5 characters a token, and the line between calls)."""
    sizes = [len(f"\n{OPEN}\n\n{CLOSE}") + len(json.dumps({"name": t.name, "arguments": {}}))
             for t in spec.tools if spec.choice in CHOICES or t.name == spec.choice]
    return (2 * min(sizes)) // 5 if sizes else 0


def lark_grammar(spec: ToolSpec, schemas: Sequence[dict[str, object]],
                 max_tokens: int = 0) -> str:
    """llguidance's Lark text for ``spec``: auto = text that holds no call tag, or calls;
    required = calls only; a tool's name = exactly one call of it. Each call is a JSON object
    {name: const, arguments: the tool's schema} (``%json``), its free strings bounded so that
    one call fits a reply of ``max_tokens`` (:func:`call_chars`)."""
    bodies = []
    for i, (t, schema) in enumerate(zip(spec.tools, schemas, strict=True)):
        if spec.choice not in CHOICES and t.name != spec.choice:
            continue
        chars = call_chars(t.name, schema, max_tokens)
        call = {"type": "object",
                "properties": {"name": {"const": t.name},
                               "arguments": json.loads(bounded_strings(
                                   closed_objects(json.dumps(schema)),
                                   chars, ARG_ITEMS))},
                "required": ["name", "arguments"], "additionalProperties": False,
                "x-guidance": _JSON_OPTIONS}
        bodies.append(f"call_{i}: %json {json.dumps(call, ensure_ascii=False)}")
    names = " | ".join(b.split(":", 1)[0] for b in bodies)
    most = 1 if not spec.parallel or spec.choice not in CHOICES else MAX_CALLS
    calls = "call" if most == 1 else f'call ("\\n" call){{0,{most - 1}}}'
    start = "TEXT | calls" if spec.choice == "auto" else "calls"
    return "\n".join([
        "%llguidance {}",
        f"start: {start}",
        f"calls: {calls}",
        f'call: "{OPEN}\\n" body "\\n{CLOSE}"',
        f"body: {names}",
        # text: something besides white space, and no call tag anywhere in it
        r"TEXT: /(?s:\s*\S.*)/ & ~/(?s:.*<tool_call>.*)/",
        *bodies,
    ]) + "\n"


# --- reading a reply -----------------------------------------------------------------------


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse_call(text: str) -> tuple[str, str]:
    """(name, arguments as compact JSON) of one call's text between the tags; ValueError for
    text that is not a call (the grammar makes that impossible for constrained replies)."""
    tree = json.loads(text)
    if not isinstance(tree, dict) or not isinstance(tree.get("name"), str):
        raise ValueError("a call is an object with a name")
    args = tree.get("arguments", {})
    if isinstance(args, str):  # a model that wrote the arguments as JSON text
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError("a call's arguments are an object")
    return tree["name"], json.dumps(args, ensure_ascii=False)


_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


@dataclass
class CallReader:
    """One reply's calls as its text grows: whether it is (or may still be) calls, how much of
    it may be shown as text, and each call once its closing tag is read."""

    calls: list[ToolCall] = field(default_factory=list)
    _read_to: int = 0  # where the next call's text may start

    @staticmethod
    def state(raw: str) -> str:
        """"calls", "text", or "open" (still a prefix of a call tag: held back)."""
        head = raw.lstrip()
        if head.startswith(OPEN):
            return "calls"
        if OPEN.startswith(head):
            return "open"
        return "text"

    def shown(self, raw: str, end: int) -> int:
        """How much of ``raw`` (up to ``end``) may go out as text now."""
        return end if self.state(raw) == "text" else 0

    def read(self, raw: str) -> list[ToolCall]:
        """The calls completed since the last read."""
        if self.state(raw) != "calls":
            return []
        found = []
        for m in _CALL.finditer(raw, self._read_to):
            self._read_to = m.end()
            try:
                name, args = parse_call(m.group(1))
            except ValueError:
                continue  # an unconstrained reply (tool_choice none) that wrote a bad call
            call = ToolCall(len(self.calls), new_call_id(), name, args)
            self.calls.append(call)
            found.append(call)
        return found
