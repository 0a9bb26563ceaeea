"""Tool calls without a model: the protocol's tool fields, the prompt block, the grammar (run
over text with llguidance's own matcher), reading calls back, and the HTTP face's mapping."""

from __future__ import annotations

import json

import llguidance
import pytest
from pydantic import ValidationError

from igi_sdk.errors import InvalidToolsError, UnknownToolCallError
from igi_sdk.http import tools as http_tools
from igi_sdk.http.conversations import Conversations
from igi_sdk.http.errors import HttpError
from igi_sdk.http.parse import read
from igi_sdk.runtime import tools
from igi_sdk.runtime.grammar import LIMITS
from igi_sdk.serving import tool_results
from igi_sdk.wire import protocol as P

FOLLOW = ("follow", "Follow the player.", {"type": "object", "properties": {
    "distance": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["distance"]})
ATTACK = ("attack", "Attack a target.", {"type": "object", "properties": {
    "target": {"type": "string", "enum": ["wolf", "bandit"]}}, "required": ["target"]})


def chat(**body: object) -> P.Chat:
    return P.Chat.model_validate({"session": "s", "text": "hi", **body})


# --- protocol ------------------------------------------------------------------------------------


def test_the_protocol_takes_tools_and_refuses_what_cannot_be_honoured() -> None:
    c = chat(tools=[{"name": "follow", "parameters": json.dumps(FOLLOW[2])}],
             tool_choice="follow", parallel_tool_calls=False)
    assert c.tools[0].parameters == FOLLOW[2] and c.tools[0].description == ""
    assert chat(tools=[{"name": "x"}]).tools[0].parameters == {"type": "object"}
    bad = [
        {"tools": [{"name": "a"}, {"name": "a"}]},  # names unique
        {"tools": [{"name": "a"}], "tool_choice": "b"},  # an undeclared tool
        {"tool_choice": "required"},  # required without tools
        {"tools": [{"name": "auto"}]},  # a choice keyword
        {"tools": [{"name": "bad name"}]},
        {"tools": [{"name": "a", "parameters": "[1]"}]},
        {"tools": [{"name": "a", "parameters": {"type": "string"}}]},
        {"tools": [{"name": "a"}], "json_schema": {"type": "object"}},
        {"tools": [{"name": "a"}], "grammar": 'root ::= "x"'},
        {"tools": [{"name": f"t{i}"} for i in range(P.MAX_TOOLS + 1)]},
        {"tool_results": [{"id": "x" * 65, "content": "r"}]},
        {"tools": [{"name": "a", "parameters": "[" * (P.MAX_NESTING + 1)}]},
    ]
    for body in bad:
        with pytest.raises(ValidationError):
            chat(**body)


def test_history_roles_and_their_tool_fields() -> None:
    ok = P.OpenSession.model_validate({"history": [
        {"role": "system", "content": "Lydia joins."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "name": "follow", "arguments": "{}"}]},
        {"role": "tool", "content": "ok", "tool_call_id": "call_1"}]})
    assert [t.role for t in ok.history] == ["system", "assistant", "tool"]
    for turn in [{"role": "tool", "content": "ok"},
                 {"role": "user", "content": "x", "tool_call_id": "call_1"},
                 {"role": "user", "content": "x", "tool_calls": [
                     {"id": "c", "name": "f", "arguments": "{}"}]}]:
        with pytest.raises(ValidationError):
            P.OpenSession.model_validate({"history": [turn]})
    assert "tools" in P.FEATURES and "history_roles" in P.FEATURES and P.PROTOCOL_MINOR >= 3


# --- prompt --------------------------------------------------------------------------------------


def test_the_tools_block_is_the_same_text_for_the_same_tools() -> None:
    a = tools.ToolSpec.of([FOLLOW, ATTACK])
    b = tools.ToolSpec.of([FOLLOW, ATTACK], "required", parallel=False)
    assert tools.system_block(a.tools) == tools.system_block(b.tools)
    block = tools.system_block(a.tools)
    assert block.count('{"type": "function"') == 2 and "<tool_call>" in block
    msgs = [{"role": "system", "content": "You are Lydia."}, {"role": "user", "content": "hi"}]
    shown = tools.with_tools(msgs, block, tool_role=True)
    assert shown[0]["content"].startswith("You are Lydia.\n\n# Tools")
    assert msgs[0]["content"] == "You are Lydia."  # the session's own messages unchanged
    assert tools.with_tools(msgs[1:], block, True)[0] == {"role": "system", "content": block}


def test_tool_results_are_tool_messages_or_wrapped_user_lines() -> None:
    results = tools.result_messages([("call_1", "ok")])
    assert tools.with_tools(results, "", tool_role=True) == [{"role": "tool", "content": "ok"}]
    assert tools.with_tools(results, "", tool_role=False) == [
        {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}]
    assert tools.renders_tool_role(b"chatml") and tools.renders_tool_role(
        b"{% for m in messages %}<|im_start|>{{ m.role }}")
    assert not tools.renders_tool_role(b"llama3")


def test_earlier_calls_are_written_as_the_model_writes_them() -> None:
    text = tools.calls_text([("call_1", "follow", '{"distance": 2}'),
                             ("call_2", "attack", '{"target": "wolf"}')])
    reader = tools.CallReader()
    assert [(c.name, c.arguments) for c in reader.read(text)] == [
        ("follow", '{"distance": 2}'), ("attack", '{"target": "wolf"}')]


# --- grammar -------------------------------------------------------------------------------------


def _accepts(grammar: str, text: str) -> bool:
    """Whether llguidance's matcher takes ``text`` whole and may end there (byte tokens)."""
    tok = llguidance.LLTokenizer("byte")
    m = llguidance.LLMatcher(tok, grammar, limits=llguidance.LLParserLimits(**LIMITS))
    for t in tok.tokenize_str(text):
        if not m.consume_token(t):
            return False
    return m.is_accepting()


CALL = '<tool_call>\n{"name": "follow", "arguments": {"distance": 3}}\n</tool_call>'
ATTACK_CALL = '<tool_call>\n{"name": "attack", "arguments": {"target": "wolf"}}\n</tool_call>'


@pytest.mark.parametrize("choice, text, ok", [
    ("auto", "Lead the way, my Thane.", True),
    ("auto", CALL, True),
    ("auto", CALL + "\n" + ATTACK_CALL, True),
    ("auto", "Sure. " + CALL, False),  # text never holds a call
    ("auto", "", False),
    ("auto", " \n ", False),  # white space alone is no reply
    ("auto", "\n<b>Hi</b>", True),
    ("auto", CALL.replace("3", '"three"'), False),  # arguments against the schema
    ("auto", CALL.replace("3", "11"), False),  # maximum
    ("auto", CALL.replace("follow", "fly"), False),  # an undeclared tool
    ("auto", CALL.replace("}}", ', "speed": 2}}'), False),  # objects are closed
    ("required", "Lead the way.", False),
    ("required", CALL, True),
    ("attack", CALL, False),
    ("attack", ATTACK_CALL, True),
    ("attack", ATTACK_CALL + "\n" + ATTACK_CALL, False),  # a named tool: one call
])
def test_the_grammar_holds_a_reply_to_its_tools(choice: str, text: str, ok: bool) -> None:
    plan = tools.prepare(tools.ToolSpec.of([FOLLOW, ATTACK], choice))
    assert plan.grammar is not None
    assert _accepts(plan.grammar, text) is ok


def test_parallel_calls_are_bounded() -> None:
    one = tools.prepare(tools.ToolSpec.of([FOLLOW, ATTACK], parallel=False)).grammar
    many = tools.prepare(tools.ToolSpec.of([FOLLOW, ATTACK])).grammar
    assert one is not None and many is not None
    assert not _accepts(one, CALL + "\n" + CALL)
    assert _accepts(many, "\n".join([CALL] * tools.MAX_CALLS))
    assert not _accepts(many, "\n".join([CALL] * (tools.MAX_CALLS + 1)))


SAY = ("say", "Say something to someone.", {"type": "object", "properties": {
    "to": {"type": "string"}, "words": {"type": "string"}}, "required": ["to", "words"]})


def _say_call(n: int) -> str:
    return ('<tool_call>\n{"name": "say", "arguments": {"to": "Ulfric", "words": "'
            + "x" * n + '"}}\n</tool_call>')


def test_a_calls_free_strings_fit_the_replys_tokens() -> None:
    name, _, schema = SAY
    assert tools.call_chars(name, schema, 0) == tools.ARG_CHARS  # no reply limit known
    assert tools.call_chars(name, schema, 1000) == tools.ARG_CHARS
    chars = tools.call_chars(name, schema, 64)
    # the markup at 2.5 characters a token, two strings at a token a character: within 64
    markup = len(_say_call(0)) - len("Ulfric")
    assert tools.MIN_ARG_CHARS <= chars and (2 * markup + 4) // 5 + 2 * chars <= 64
    assert tools.call_chars(name, schema, 8) == tools.MIN_ARG_CHARS
    # a schema's own bounds stay: nothing free, nothing cut
    bounded = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 300}}}
    assert tools.call_chars("w", bounded, 64) == tools.ARG_CHARS
    short = tools.prepare(tools.ToolSpec.of([SAY]), max_tokens=64).grammar
    free = tools.prepare(tools.ToolSpec.of([SAY])).grammar
    assert short is not None and free is not None
    assert _accepts(short, _say_call(chars)) and not _accepts(short, _say_call(chars + 1))
    assert _accepts(free, _say_call(tools.ARG_CHARS))


def test_a_reply_knows_the_fewest_tokens_another_call_takes() -> None:
    both = tools.prepare(tools.ToolSpec.of([SAY, FOLLOW])).call_tokens
    say = tools.prepare(tools.ToolSpec.of([SAY, FOLLOW], "say")).call_tokens
    # the smaller markup of the two ("say" is shorter than "follow"), at 2.5 characters a token
    markup = len('\n<tool_call>\n{"name": "say", "arguments": {}}\n</tool_call>')
    assert both == say == (2 * markup) // 5
    assert tools.prepare(tools.ToolSpec.of([SAY], "none")).call_tokens == 0


def test_none_changes_no_grammar_and_bad_schemas_are_refused_before_compiling() -> None:
    assert tools.prepare(tools.ToolSpec.of([FOLLOW], "none")).grammar is None
    for params in [{"type": "object", "properties": {"w": {"type": "string",
                                                           "maxLength": 10**6}}},
                   {"type": "object", "properties": {f"p{i}": {} for i in range(65)}}]:
        with pytest.raises(InvalidToolsError) as e:
            tools.prepare(tools.ToolSpec.of([("shout", "", params)]))
        assert e.value.code == "invalid_body" and "shout" in e.value.message


# --- reading calls -------------------------------------------------------------------------------


def test_calls_are_read_as_their_closing_tags_arrive_and_text_is_held_while_it_may_be_one() -> None:
    r = tools.CallReader()
    assert r.state("") == "open" and r.state(" <tool_") == "open"
    assert r.state("<b>hi") == "text" and r.shown("Hello", 5) == 5
    assert r.shown("<tool", 5) == 0
    raw = CALL[:-3]
    assert r.state(raw) == "calls" and r.read(raw) == []
    first = r.read(CALL)
    assert [(c.index, c.name, c.arguments) for c in first] == [(0, "follow", '{"distance": 3}')]
    assert first[0].id.startswith("call_") and len(first[0].id) == 29
    assert r.read(CALL) == []  # once
    second = r.read(CALL + "\n" + ATTACK_CALL)
    assert [(c.index, c.name) for c in second] == [(1, "attack")]
    assert tools.parse_call('{"name": "f", "arguments": "{\\"a\\": 1}"}') == ("f", '{"a": 1}')
    with pytest.raises(ValueError):
        tools.parse_call('{"arguments": {}}')


# --- the HTTP face -------------------------------------------------------------------------------


def _body(**extra: object) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **extra}).encode()


OPENAI_TOOLS = [{"type": "function", "function": {"name": "follow", "parameters": FOLLOW[2]}},
                {"type": "function", "function": {"name": "wait"}}]


def test_openai_tools_map_to_the_chat_fields() -> None:
    p = read(_body(tools=OPENAI_TOOLS, tool_choice={"type": "function",
                                                    "function": {"name": "follow"}},
                   parallel_tool_calls=False))
    opts = http_tools.chat_options(p.options)
    assert opts["tool_choice"] == "follow" and opts["parallel_tool_calls"] is False
    assert opts["tools"][1] == {"name": "wait", "description": "",
                                "parameters": {"type": "object", "properties": {}}}
    assert http_tools.chat_options(read(_body()).options) == {}
    for bad in [dict(tools=OPENAI_TOOLS, tool_choice={"type": "function",
                                                      "function": {"name": "fly"}}),
                dict(tools=OPENAI_TOOLS * 2), dict(tool_choice="required")]:
        with pytest.raises(HttpError) as e:
            read(_body(**bad))
        assert e.value.status == 400


def test_a_transcript_with_calls_and_results_continues_its_conversation() -> None:
    call = {"id": "call_ab", "type": "function",
            "function": {"name": "follow", "arguments": '{"distance": 3}'}}
    msgs = [{"role": "system", "content": "You are Lydia."},
            {"role": "user", "content": "Follow me."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_ab", "content": "following"}]
    p = read(json.dumps({"messages": msgs, "tools": OPENAI_TOOLS}).encode())
    assert p.line == "" and p.results == (("call_ab", "following"),)
    assert p.history == [("user", "Follow me."),
                         ("assistant", "", json.dumps([["call_ab", "follow", '{"distance": 3}']]))]
    # the table answered the first request with what its done said: the transcript matches
    table = Conversations()
    first = table.match("npc", "You are Lydia.", [])
    done = {"text": "", "tool_calls": [{"id": "call_ab", "name": "follow",
                                        "arguments": '{"distance": 3}'}]}
    table.answered_turns(first.conversation, [*http_tools.line_turns("Follow me.", ()),
                                              http_tools.reply_turn(done)])
    again = table.match("npc", "You are Lydia.", p.history)
    assert not again.fresh and again.conversation is first.conversation
    # a later request holds the results as history turns, the call's id with them
    msgs += [{"role": "assistant", "content": "I follow."}, {"role": "user", "content": "Go."}]
    later = read(json.dumps({"messages": msgs}).encode())
    assert later.history[2] == ("tool", "following", "call_ab")
    assert http_tools.wire_turn(later.history[2]) == {
        "role": "tool", "content": "following", "tool_call_id": "call_ab"}
    assert http_tools.wire_turn(later.history[1])["tool_calls"] == [
        {"id": "call_ab", "name": "follow", "arguments": '{"distance": 3}'}]
    assert http_tools.message(done) == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_ab", "type": "function",
         "function": {"name": "follow", "arguments": '{"distance": 3}'}}]}


def test_a_tool_message_must_answer_a_call_of_the_assistant_message_before_it() -> None:
    def call(i: str) -> dict[str, object]:
        return {"id": i, "type": "function", "function": {"name": "follow", "arguments": "{}"}}

    asked = [{"role": "user", "content": "Follow me."},
             {"role": "assistant", "content": None, "tool_calls": [call("call_1"), call("call_2")]}]
    answered = [*asked, {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
                {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    assert read(json.dumps({"messages": answered}).encode()).results == (
        ("call_2", "ok"), ("call_1", "ok"))
    later = [*answered, {"role": "assistant", "content": "I follow."},
             {"role": "user", "content": "Stop."}]
    assert read(json.dumps({"messages": later}).encode()).line == "Stop."
    bad = {
        "an id no call has": [*asked, {"role": "tool", "tool_call_id": "call_9", "content": "x"}],
        "no call before it": [{"role": "user", "content": "hi"},
                              {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
        "a call of an earlier message": [*answered, {"role": "assistant", "content": "Done."},
                                         {"role": "tool", "tool_call_id": "call_1",
                                          "content": "x"}],
        "a user line between": [*asked, {"role": "user", "content": "Well?"},
                                {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
    }
    for why, messages in bad.items():
        with pytest.raises(HttpError) as e:
            read(json.dumps({"messages": messages}).encode())
        assert e.value.status == 400 and "tool" in e.value.message, why


def test_which_calls_a_lines_results_may_answer() -> None:
    def turns(*raw: dict[str, object]) -> list[P.HistoryTurn]:
        return [P.HistoryTurn.model_validate(t) for t in raw]

    asked = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "name": "follow", "arguments": "{}"}]}
    answer = {"role": "tool", "content": "ok", "tool_call_id": "call_1"}
    assert tool_results.of_history(turns(asked)) == {"call_1"}
    assert tool_results.of_history(turns(asked, answer)) == {"call_1"}
    assert tool_results.of_history(turns(asked, {"role": "user", "content": "hi"})) == set()
    assert tool_results.of_history([]) == set()
    ok = [P.ToolResult(id="call_1", content="ok")]
    tool_results.check(ok, frozenset({"call_1", "call_2"}))
    tool_results.check(ok, None)  # not known (a restored session): not checked
    with pytest.raises(UnknownToolCallError) as e:
        tool_results.check(ok, frozenset())
    assert e.value.code == "invalid_body" and "call_1" in e.value.message
