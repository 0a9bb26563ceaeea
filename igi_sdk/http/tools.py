"""OpenAI's function calling on the HTTP face: ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``tool`` messages and assistant ``tool_calls`` in transcripts, the
calls in replies (``message.tool_calls``, streamed ``delta.tool_calls``), mapped to protocol
1.3's tool fields (bridge/PROTOCOL.md, "Tools"). Pure: no sockets, no model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from igi_sdk.http.conversations import Turn
from igi_sdk.http.errors import HttpError
from igi_sdk.http.schema import ChatCompletionRequest, ChatOptions, Message
from igi_sdk.wire import protocol as P


@dataclass(frozen=True)
class CallPiece:
    """A call of the reply as its ``tool_call`` event came (streamed as a delta)."""

    index: int
    id: str
    name: str
    arguments: str


def check(req: ChatCompletionRequest) -> None:
    """What the protocol would refuse, refused here with OpenAI's words (400): nesting before
    anything walks the schemas, names, a tool_choice naming no declared tool."""
    tools = req.tools or []
    for t in tools:
        if P.nesting(t.function.parameters, P.MAX_NESTING) > P.MAX_NESTING:
            raise HttpError(400, "invalid_body", f"tools[].function.parameters nests more "
                            f"than {P.MAX_NESTING} objects/arrays deep")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise HttpError(400, "invalid_body", "tools: function names must be unique")
    choice = choice_of(req)
    if choice is not None and choice not in P.TOOL_CHOICES and choice not in names:
        raise HttpError(400, "invalid_argument", f"tool_choice names '{choice}', which is not "
                        "among the request's tools")
    if choice == "required" and not tools:
        raise HttpError(400, "invalid_argument", "tool_choice 'required' needs tools")
    answers_calls(req.messages)


def answers_calls(messages: list[Message]) -> None:
    """Every ``tool`` message answers a call of the assistant message that its run of tool
    messages follows, by the call's id (a transcript is the whole conversation: the calls are
    in it). OpenAI refuses anything else, with the same 400."""
    calls: set[str] | None = None  # those of the assistant message the run follows
    for k, m in enumerate(messages):
        if m.role != "tool":
            calls = ({c.id for c in m.tool_calls} if m.role == "assistant" and m.tool_calls
                     else None)
        elif calls is None:
            raise HttpError(400, "invalid_argument", f"messages[{k}]: messages with role "
                            "'tool' must be a response to a preceding message with "
                            "'tool_calls'")
        elif (m.tool_call_id or "") not in calls:
            raise HttpError(400, "invalid_argument", f"messages[{k}]: tool_call_id "
                            f"'{m.tool_call_id or ''}' is not among the tool_calls of the "
                            "assistant message it follows")


def choice_of(req: ChatOptions) -> str | None:
    c = req.tool_choice
    if c is None:
        return None
    return c if isinstance(c, str) else c.function.name


def chat_options(req: ChatOptions) -> dict[str, Any]:
    """The line's tool fields for the protocol's ``chat``."""
    if not req.tools:
        return {}
    options: dict[str, Any] = {"tools": [
        {"name": t.function.name, "description": t.function.description or "",
         "parameters": t.function.parameters if t.function.parameters is not None
         else {"type": "object", "properties": {}}}
        for t in req.tools]}
    choice = choice_of(req)
    if choice is not None:
        options["tool_choice"] = choice
    if req.parallel_tool_calls is not None:
        options["parallel_tool_calls"] = req.parallel_tool_calls
    return options


def trailing_results(req: ChatCompletionRequest
                     ) -> tuple[ChatCompletionRequest, tuple[tuple[str, str], ...]]:
    """A transcript that ends with ``tool`` messages: the results of the last reply's calls,
    and the request with an empty user line in their place (the line is the results)."""
    msgs = list(req.messages)
    results: list[tuple[str, str]] = []
    while msgs and msgs[-1].role == "tool":
        m = msgs.pop()
        results.insert(0, (m.tool_call_id or "", m.text()))
    if not results:
        return req, ()
    if len(results) > P.MAX_TOOL_RESULTS:
        raise HttpError(400, "invalid_argument", f"at most {P.MAX_TOOL_RESULTS} tool results "
                        "answer one reply")
    for call_id, _ in results:
        if not 1 <= len(call_id) <= 64:
            raise HttpError(400, "invalid_argument", "a tool message needs its tool_call_id "
                            "(1 to 64 characters)")
    line = Message.model_construct(role="user", content="")
    return req.model_copy(update={"messages": [*msgs, line]}), tuple(results)


def turn_of(m: Message) -> Turn:
    """A transcript message as the conversation table keeps it: a tool result carries its
    call's id, an assistant turn with calls carries them (as JSON, so turns compare)."""
    if m.role == "tool":
        return ("tool", m.text(), m.tool_call_id or "")
    if m.role == "assistant" and m.tool_calls:
        calls = [[c.id, c.function.name, c.function.arguments] for c in m.tool_calls]
        return ("assistant", m.text(), json.dumps(calls))
    return (m.role, m.text())


def wire_turn(turn: Turn) -> dict[str, Any]:
    """A table turn as an ``open_session`` history turn."""
    role, text = turn[0], turn[1]
    out: dict[str, Any] = {"role": role, "content": text}
    if len(turn) > 2 and role == "tool":
        out["tool_call_id"] = turn[2] or "call_unknown"
    elif len(turn) > 2 and role == "assistant":
        out["tool_calls"] = [{"id": i, "name": n, "arguments": a}
                             for i, n, a in json.loads(turn[2])]
    return out


def line_turns(line: str, results: tuple[tuple[str, str], ...]) -> list[Turn]:
    """The turns a line adds to the transcript: its tool results, its user text."""
    turns: list[Turn] = [("tool", content, call_id) for call_id, content in results]
    if line or not results:
        turns.append(("user", line))
    return turns


def reply_turn(done: dict[str, Any]) -> Turn:
    """The reply as the client will send it back: its text, its calls."""
    calls = done.get("tool_calls") or []
    if not calls:
        return ("assistant", done.get("text", ""))
    return ("assistant", done.get("text", ""),
            json.dumps([[c["id"], c["name"], c["arguments"]] for c in calls]))


def message(done: dict[str, Any]) -> dict[str, Any]:
    """The non-streamed ``choices[0].message``: content null when the reply is calls."""
    calls = done.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": done["text"]}
    return {"role": "assistant", "content": done["text"] or None,
            "tool_calls": [{"id": c["id"], "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]}}
                           for c in calls]}


def call_delta(piece: CallPiece) -> dict[str, Any]:
    """A streamed call, whole in one chunk (OpenAI's clients join a call's chunks by index)."""
    return {"tool_calls": [{"index": piece.index, "id": piece.id, "type": "function",
                            "function": {"name": piece.name, "arguments": piece.arguments}}]}


def piece_of(body: dict[str, Any]) -> CallPiece:
    return CallPiece(int(body["index"]), str(body["id"]), str(body["name"]),
                     str(body["arguments"]))
