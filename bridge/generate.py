"""Writes the protocol's machine-readable contract beside PROTOCOL.md, from the SDK's types.

* ``schema/<type>.json``: the body of every request type (from ``protocol.REQUESTS``),
  ``envelope.json`` (the ``{v, id, type, body}`` map) and ``replies.json`` (the bodies of
  ``ok`` per request type, ``token``, ``done``, ``error``, ``heartbeat``, and the error codes,
  from ``igi_sdk/wire/contract.py``);
* ``vectors/<name>.msgpack`` + ``<name>.json``: one message per file and its readable twin,
  with the outcome the sidecar gives each request.

Regenerate both after changing the protocol: ``python bridge/generate.py`` (from the
repository, with the SDK installed; ``tests/test_protocol_contract.py`` fails until the
committed files match). A tool of the repository, not of the installed package.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgpack
from pydantic import BaseModel

from igi_sdk.wire import protocol as P
from igi_sdk.wire.contract import ERROR_CODES, EVENTS, OK_REPLIES

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = ROOT / "bridge" / "schema"
VECTORS_DIR = ROOT / "bridge" / "vectors"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE = "python bridge/generate.py"


# --- schemas ----------------------------------------------------------------------------------


def _open_objects(schema: Any) -> Any:
    """``schema`` with every ``additionalProperties: false`` turned to true: the sidecar ignores
    (and names in ``ignored``) the body fields it does not define, at any depth, so a schema
    must not refuse them (the pydantic models forbid them only after they were taken out)."""
    if isinstance(schema, dict):
        return {k: True if k == "additionalProperties" and v is False else _open_objects(v)
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_open_objects(v) for v in schema]
    return schema


def request_schema(msg_type: str) -> dict[str, Any]:
    model = P.REQUESTS[msg_type]
    schema = _open_objects(model.model_json_schema())
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["$comment"] = (f"body of the '{msg_type}' request; generated from "
                          f"igi_sdk.wire.protocol.{model.__name__} by `{REGENERATE}`")
    return schema


def envelope_schema() -> dict[str, Any]:
    def envelope(types: list[str], required: list[str], what: str,
                 extra_keys: bool) -> dict[str, Any]:
        return {
            "type": "object",
            "description": what,
            "properties": {
                "v": {"const": P.PROTOCOL_VERSION, "description": "protocol version"},
                "id": {"type": "integer", "minimum": 0, "maximum": P.MAX_ID},
                "type": {"enum": types},
                "body": {"type": "object"},
            },
            "required": required,
            "additionalProperties": extra_keys,
        }

    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$comment": f"hand-written in igi_sdk/wire/contract.py; regenerate with `{REGENERATE}`",
        "title": "Envelope",
        "description": "Every message is one ZeroMQ frame holding one msgpack map. The body of "
                       "a request is described by schema/<type>.json, the body of a reply by "
                       "replies.json.",
        "oneOf": [{"$ref": "#/$defs/request"}, {"$ref": "#/$defs/reply"}],
        "$defs": {
            "request": envelope(sorted(P.REQUESTS), ["v", "id", "type"],
                                "client -> sidecar; id chosen by the client; a missing body "
                                "is an empty map; other keys are ignored (not named in "
                                "'ignored', which names body fields)", True),
            "reply": envelope(list(P.REPLY_TYPES), ["v", "id", "type", "body"],
                              "sidecar -> client; id is the id of the request answered "
                              "(0 for heartbeat, for an error answering a message whose "
                              "id could not be read, and for duplicate_id); the sidecar sends "
                              "no other key", False),
        },
    }


def replies_schema() -> dict[str, Any]:
    def schema(model: type[BaseModel]) -> dict[str, Any]:
        return model.model_json_schema()

    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$comment": f"generated from igi_sdk/wire/contract.py by `{REGENERATE}`",
        "title": "Replies",
        "description": "Bodies of the messages the sidecar sends. 'ok' answers one request and "
                       "its body depends on the request type (ok_by_request; chat is answered "
                       "by a stream of token events ended by one done or error instead). "
                       "Clients must ignore fields they do not know.",
        "ok_by_request": {t: schema(m) for t, m in OK_REPLIES.items() if m is not None},
        "events": {t: schema(m) for t, m in EVENTS.items()},
        "error_codes": {code: {"retryable": e.retryable, "meaning": e.meaning}
                        for code, e in sorted(ERROR_CODES.items())},
    }


def _dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def schema_files() -> dict[str, str]:
    """File name -> content of every file in ``bridge/schema/``."""
    files = {f"{t}.json": _dump_json(request_schema(t)) for t in sorted(P.REQUESTS)}
    files["envelope.json"] = _dump_json(envelope_schema())
    files["replies.json"] = _dump_json(replies_schema())
    return dict(sorted(files.items()))


def export_schemas(out_dir: str | Path = SCHEMA_DIR) -> list[Path]:
    """Write the JSON Schemas into ``out_dir`` (stale ``*.json`` there are removed)."""
    return _write_dir(Path(out_dir), {n: c.encode() for n, c in schema_files().items()},
                      ("*.json",))


# --- golden vectors ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vector:
    name: str
    direction: Literal["request", "reply"]
    note: str
    frame: bytes
    message: Any  # the decoded map (None when ``frame`` is not msgpack a JSON twin can show)
    expect: dict[str, Any] | None = None


def _req(name: str, msg_id: int, msg_type: str, body: dict[str, Any], note: str) -> Vector:
    reply = "stream" if msg_type in ("chat", "complete") else "ok"
    return Vector(name, "request", note, P.encode(msg_id, msg_type, body),
                  {"v": P.PROTOCOL_VERSION, "id": msg_id, "type": msg_type, "body": body},
                  {"type": "ok", "reply": reply})


def _bad(name: str, message: Any, code: str, answer_id: int, note: str) -> Vector:
    return Vector(name, "request", note, msgpack.packb(message, use_bin_type=True), message,
                  {"type": "error", "code": code, "id": answer_id})


def _bad_raw(name: str, frame: bytes, code: str, note: str, answer_id: int = 0) -> Vector:
    return Vector(name, "request", note, frame, None,
                  {"type": "error", "code": code, "id": answer_id})


INSTANCE = "mygame-4242-7f3a"  # a launcher's instance id (serve --instance)


def _rep(name: str, msg_id: int, msg_type: str, body: dict[str, Any], note: str) -> Vector:
    return Vector(name, "reply", note, P.encode(msg_id, msg_type, body),
                  {"v": P.PROTOCOL_VERSION, "id": msg_id, "type": msg_type, "body": body})


def _env(msg_id: Any, msg_type: Any, body: Any = None, **extra: Any) -> dict[str, Any]:
    msg = {"v": P.PROTOCOL_VERSION, "id": msg_id, "type": msg_type, "body": body or {}}
    msg.update(extra)
    return msg


FLOAT32_16_6 = struct.unpack("<f", struct.pack("<f", 16.6))[0]  # what a C++ 16.6f arrives as
SID = "3f2a9c0d81be"  # a session id as the sidecar makes them (12 hex digits)
MEMORY = {"cpu": {"compute": 8_650_752, "kv": 25_165_824, "weights": 90_177_536},
          "gpu": {"compute": 0, "kv": 0, "weights": 0}}


def _stored_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG whose zlib stream is stored (not compressed): the same bytes with any
    zlib, so the vector files do not depend on the machine that writes them."""
    rows = b"".join(b"\0" + rgb[y * width * 3:(y + 1) * width * 3] for y in range(height))
    stream = (b"\x78\x01\x01" + struct.pack("<HH", len(rows), len(rows) ^ 0xFFFF) + rows
              + struct.pack(">I", zlib.adler32(rows)))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", stream)
            + chunk(b"IEND", b""))


# a 2x2 picture: red, green / blue, white (rows top to bottom), as PNG and as raw RGBA pixels
_RGB_2X2 = bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255])
_RGBA_2X2 = b"".join(_RGB_2X2[i:i + 3] + b"\xff" for i in range(0, 12, 3))


def vectors() -> list[Vector]:
    """The golden cases, in a fixed order (one session's ids run 1, 2, 3, ...)."""
    hello = {"protocol": P.PROTOCOL_VERSION, "minor": P.PROTOCOL_MINOR, "engine": "unity",
             "game_pid": 4242, "client_name": "npc-plugin", "lease_s": 15.0}
    sampling = {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "min_p": 0.05,
                "repeat_penalty": 1.1, "seed": 7}
    limits = {"max_message_bytes": P.MAX_MESSAGE_BYTES, "max_text_chars": P.MAX_TEXT_CHARS,
              "max_tokens": P.MAX_TOKENS, "max_sessions_per_client": 8,
              "max_streams_per_client": 4}
    chat_body = {"session": SID, "text": "Greetings, smith! What can you offer me?",
                 "max_tokens": 64, "stop": ["\nPlayer:"]}
    return [
        # --- valid requests (one per type, plus variants) ---
        _req("request_hello", 1, "hello", hello, "first message of every connection"),
        _req("request_hello_minimal", 1, "hello", {"protocol": P.PROTOCOL_VERSION},
             "only protocol is required (a 1.0 client: minor 0)"),
        _req("request_hello_owner", 1, "hello",
             {**hello, "owner": "owner-key-of-the-game-0001", "token": "launch-token-0123456789"},
             "1.2: the owner key its sessions belong to, and the sidecar's launch token"),
        _req("request_ping", 2, "ping", {}, "liveness round trip"),
        _req("request_load_model", 3, "load_model",
             {"path": "smol.gguf", "vram_budget": 2 * 2**30, "n_ctx": 4096, "max_sessions": 8},
             "path is relative to the sidecar's model directory; the ok comes after the load"),
        _req("request_open_session", 4, "open_session",
             {"system_prompt": "You are Brom, the blacksmith of Oakvale.", "persona": "brom",
              "sampling": sampling, "priority": 1}, "answered with the new session id"),
        _req("request_open_session_defaults", 4, "open_session", {},
             "every open_session field has a default"),
        _req("request_chat", 5, "chat", chat_body, "answered by token events and one done"),
        _req("request_chat_line_sampling", 5, "chat",
             {**chat_body, "sampling": {"temperature": 1.0, "seed": 99, "frequency_penalty": 0.5,
                                        "logit_bias": {"15043": -100.0, "29871": 2.5}},
              "logprobs": 2},
             "1.3: this line's own sampling (the rest stays the session's) and each token's "
             "logprob with its 2 likeliest alternatives"),
        _req("request_chat_json_schema", 5, "chat",
             {"session": SID, "text": "Your price?", "json_schema": {
                 "type": "object", "properties": {"price": {"type": "integer"}},
                 "required": ["price"]}}, "constrained reply (json_schema wins over grammar)"),
        _req("request_chat_images", 5, "chat",
             {"session": SID, "text": "What do you make of this?", "max_tokens": 64, "images": [
                 {"data": _stored_png(2, 2, _RGB_2X2)},
                 {"pixels": _RGBA_2X2, "width": 2, "height": 2, "channels": 4}]},
             "images (feature images): PNG/JPEG file bytes, or raw pixels rows top to bottom; "
             "both msgpack bin"),
        _req("request_cancel", 6, "cancel", {"request": 5}, "stop the chat whose id is 5"),
        _req("request_save_session", 7, "save_session", {"session": SID, "name": "brom-day1"},
             "a name, not a path"),
        _req("request_restore_session", 8, "restore_session", {"name": "brom-day1"},
             "answered with a new session id"),
        _req("request_close_session", 9, "close_session", {"session": SID}, ""),
        _req("request_frame", 10, "frame",
             {"frame": 1200, "frame_time_ms": 16.6, "target_frame_time_ms": 16.6,
              "vram_used": 5 * 2**30, "vram_budget": 8 * 2**30}, "recorded (VRAM arbiter)"),
        _req("request_reserve_vram", 11, "reserve_vram",
             {"bytes": 2**30, "deadline_frames": 30}, "recorded (VRAM arbiter)"),
        _req("request_stats", 12, "stats", {}, ""),
        _req("request_shutdown", 13, "shutdown", {}, "the sidecar replies ok, then exits"),
        _req("request_id_max", P.MAX_ID, "ping", {}, "the largest id: 2^53"),
        # --- protocol 1.1 ---
        _req("request_open_session_named", 4, "open_session",
             {"persona": "brom", "name": "npc.brom"},
             "the session's id is the name; adopt it after a restart"),
        _req("request_chat_json_schema_string", 5, "chat",
             {"session": SID, "text": "Your price?",
              "json_schema": '{"type":"object","properties":{"price":{"type":"integer"}},'
                             '"required":["price"]}'},
             "json_schema as a JSON string, for engines without a JSON tree type"),
        _req("request_restore_session_named", 8, "restore_session",
             {"name": "brom-day1", "session": "npc.brom"}, "the restored session's id"),
        _req("request_set_priority", 14, "set_priority", {"session": SID, "priority": 50},
             "the NPC the player faces decodes first"),
        _req("request_list_sessions", 15, "list_sessions", {}, "own and orphaned sessions"),
        _req("request_adopt_session", 16, "adopt_session", {"session": "npc.brom"},
             "take over an orphaned session"),
        _req("request_resume_stream", 17, "resume_stream", {"request": 5, "after": 2},
             "send chat 5's events after token 2 again (after a reconnect)"),
        _req("request_goodbye", 18, "goodbye", {"keep_sessions": True},
             "leaving; the sessions wait to be adopted"),
        # --- protocol 1.3 ---
        _req("request_chat_tools", 5, "chat",
             {"session": SID, "text": "Follow me to the mill.", "max_tokens": 64,
              "tools": [{"name": "follow", "description": "Follow the player.",
                         "parameters": {"type": "object", "properties": {
                             "distance": {"type": "integer"}}, "required": ["distance"]}},
                        {"name": "attack", "description": "Attack a target.",
                         "parameters": '{"type":"object","properties":{"target":'
                                       '{"type":"string"}},"required":["target"]}'}],
              "tool_choice": "auto", "parallel_tool_calls": False},
             "tools (feature tools): the reply is text or calls of these tools"),
        _req("request_chat_tool_results", 5, "chat",
             {"session": SID, "text": "", "tool_results": [
                 {"id": "call_5f0c2a9e1b7d4c3a", "content": '{"following": true}'}]},
             "the results of the previous reply's calls; the reply continues from them"),
        _req("request_open_session_tool_history", 4, "open_session",
             {"system_prompt": "You are Brom.", "history": [
                 {"role": "user", "content": "Follow me."},
                 {"role": "assistant", "content": "", "tool_calls": [
                     {"id": "call_5f0c2a9e1b7d4c3a", "name": "follow",
                      "arguments": '{"distance": 2}'}]},
                 {"role": "tool", "content": '{"following": true}',
                  "tool_call_id": "call_5f0c2a9e1b7d4c3a"},
                 {"role": "system", "content": "Lydia joins the conversation."}]},
             "history roles (feature history_roles): system turns where they stand, calls "
             "and their results"),
        _req("request_chat_history_rewrite", 5, "chat",
             {"session": SID, "text": "And the price?", "history": [
                 {"role": "user", "content": "Forge me a sword."},
                 {"role": "assistant", "content": "Aye."},
                 {"role": "system", "content": "Lydia joins the conversation."}]},
             "1.3 (rewrite_history): the conversation replaced before the line, system turns "
             "where they stand; only what changed is read again"),
        _req("request_chat_prefill", 5, "chat",
             {"session": SID, "text": "", "history": [
                 {"role": "user", "content": "Your name?"},
                 {"role": "assistant", "content": "My name is"}]},
             "1.3: history ending with an assistant turn and text \"\": the reply continues it"),
        # 1.3: requests without a session
        _req("request_tokenize", 60, "tokenize",
             {"text": "Hello, traveller.", "with_pieces": True}, "token ids and their text"),
        _req("request_detokenize", 61, "detokenize", {"tokens": [19556, 28, 36874, 30]}, ""),
        _req("request_embed", 62, "embed",
             {"input": ["The guard saw a wolf.", [504, 3458, 314]]},
             "texts or token id arrays, one vector each"),
        _req("request_complete", 63, "complete",
             {"prompt": "Once upon a time", "max_tokens": 32, "stop": ["\n"],
              "sampling": {"temperature": 0.0}},
             "a raw prompt without the chat template: token events and one done, as chat's"),
        _req("request_unknown_field_ignored", 25, "stats", {"unknown_field": 1},
             "unknown body fields are ignored; the ok lists them in 'ignored'"),
        Vector("request_envelope_extra_field", "request",
               "envelope keys other than v, id, type, body are ignored",
               msgpack.packb(_env(20, "ping", trace="abc"), use_bin_type=True),
               _env(20, "ping", trace="abc"), {"type": "ok", "reply": "ok"}),
        Vector("request_frame_float32", "request",
               "a float32 is accepted and read as its exact value (16.6f = 16.6000003815); "
               "clients should send float64",
               msgpack.packb(_env(10, "frame", {"frame": 1, "frame_time_ms": 16.6}),
                             use_bin_type=True, use_single_float=True),
               _env(10, "frame", {"frame": 1, "frame_time_ms": FLOAT32_16_6}),
               {"type": "ok", "reply": "ok"}),
        # --- invalid requests: the error the sidecar answers (with that id) ---
        _bad_raw("invalid_not_msgpack", b"\xc1hello", "malformed",
                 "0xc1 is never valid msgpack; no id can be read, so the error has id 0"),
        _bad_raw("invalid_non_string_key", msgpack.packb({1: "x", "id": 42}), "malformed",
                 "map keys must be strings; the id can be read, so the error carries it", 42),
        _bad("invalid_not_a_map", [1, 1, "ping", {}], "malformed", 0, "an array, not a map"),
        _bad("invalid_id_missing", {"v": 1, "type": "ping", "body": {}}, "malformed", 0,
             "id is required"),
        _bad("invalid_id_negative", _env(-1, "ping"), "malformed", 0, "ids are 0..2^53"),
        _bad("invalid_id_too_large", _env(P.MAX_ID + 2, "ping"), "malformed", 0,
             "ids are 0..2^53"),
        _bad("invalid_id_float", _env(1.5, "ping"), "malformed", 0, "ids are integers"),
        _bad("invalid_version", {"v": 2, "id": 21, "type": "ping", "body": {}},
             "unsupported_version", 21, "v must be the sidecar's PROTOCOL_VERSION"),
        _bad("invalid_version_missing", {"id": 22, "type": "ping", "body": {}},
             "unsupported_version", 22, "v is required"),
        _bad("invalid_unknown_type", _env(23, "summon_dragon"), "unknown_type", 23, ""),
        _bad("invalid_body_not_a_map", _env(24, "stats", [1]), "malformed", 24, ""),
        _bad("invalid_hello_protocol_huge", _env(35, "hello", {"protocol": 2**31 + 1}),
             "unsupported_version", 35, "another major version, however large"),
        _bad("invalid_chat_json_schema_string", _env(36, "chat", {
            "session": SID, "text": "hi", "json_schema": "{not json"}), "invalid_body", 36,
             "a json_schema string must hold a JSON object"),
        _bad("invalid_set_priority_range", _env(37, "set_priority", {
            "session": SID, "priority": 101}), "invalid_body", 37, "priority is -100..100"),
        _bad("invalid_chat_missing_text", _env(26, "chat", {"session": SID}), "invalid_body", 26,
             ""),
        _bad("invalid_chat_text_too_long",
             _env(27, "chat", {"session": SID, "text": "a" * (P.MAX_TEXT_CHARS + 1)}),
             "invalid_body", 27, f"text is at most {P.MAX_TEXT_CHARS} characters"),
        _bad("invalid_chat_max_tokens", _env(28, "chat", {"session": SID, "text": "hi",
                                                          "max_tokens": P.MAX_TOKENS + 1}),
             "invalid_body", 28, f"max_tokens is 1..{P.MAX_TOKENS}"),
        _bad("invalid_session_name", _env(29, "close_session", {"session": "../etc"}),
             "invalid_body", 29, "names are [A-Za-z0-9_.-]{1,128}"),
        _bad("invalid_save_name_path", _env(30, "save_session", {"session": SID,
                                                                 "name": "saves/brom"}),
             "invalid_body", 30, "saved sessions are names, not paths"),
        _bad("invalid_sampling_range", _env(31, "open_session", {"sampling": {
            "temperature": -1.0}}), "invalid_body", 31, "temperature is 0..5"),
        _bad("invalid_chat_logprobs_range", _env(46, "chat", {"session": SID, "text": "hi",
                                                              "logprobs": 21}),
             "invalid_body", 46, f"logprobs is 0..{P.MAX_LOGPROBS}"),
        _bad("invalid_chat_logit_bias", _env(47, "chat", {
            "session": SID, "text": "hi", "sampling": {"logit_bias": {"15043": 101.0}}}),
             "invalid_body", 47, "a bias is -100..100 (a token id past the vocabulary: "
             "invalid_sampling, where the model is known)"),
        _bad("invalid_frame_negative", _env(32, "frame", {"frame": -1, "frame_time_ms": 16.6}),
             "invalid_body", 32, ""),
        _bad("invalid_hello_protocol_missing", _env(33, "hello", {"engine": "unity"}),
             "invalid_body", 33, "hello.protocol is required"),
        _bad("invalid_save_name_device", _env(34, "restore_session", {"name": "Con.txt"}),
             "invalid_body", 34, "Windows device names (CON, PRN, AUX, NUL, COM0-9, LPT0-9, "
             "any case, any extension) are not save names"),
        _bad("invalid_chat_image_source", _env(38, "chat", {"session": SID, "text": "Look!",
                                                            "images": [{"width": 64}]}),
             "invalid_body", 38, "an image has either data (PNG/JPEG bin) or pixels (bin)"),
        _bad("invalid_chat_images_too_many", _env(39, "chat", {
            "session": SID, "text": "Look!", "images": [{}] * (P.MAX_IMAGES + 1)}),
             "invalid_body", 39, f"at most {P.MAX_IMAGES} images per chat"),
        _bad("invalid_chat_tool_choice_undeclared", _env(45, "chat", {
            "session": SID, "text": "Go.", "tools": [{"name": "follow"}],
            "tool_choice": "attack"}),
             "invalid_body", 45, "tool_choice names a tool the chat does not declare"),
        _bad("invalid_chat_tool_names_repeat", _env(43, "chat", {
            "session": SID, "text": "Go.", "tools": [{"name": "follow"}, {"name": "follow"}]}),
             "invalid_body", 43, "tool names are unique"),
        _bad("invalid_chat_tools_with_grammar", _env(44, "chat", {
            "session": SID, "text": "Go.", "tools": [{"name": "follow"}],
            "json_schema": {"type": "object"}}),
             "invalid_body", 44, "tools constrain the reply: no grammar or json_schema beside"),
        _bad("invalid_array_too_long", _env(40, "stats", {"x": [0] * 4097}), "malformed", 40,
             "an array of more than 4096 items, even in a field the sidecar ignores; the id "
             "can be read, so the error carries it (the request ends)"),
        _bad("invalid_map_too_large", _env(41, "stats", {f"k{i}": 0 for i in range(257)}),
             "malformed", 41, "a map of more than 256 entries; answered with its id"),
        # --- replies and events ---
        _rep("reply_ok_hello", 1, "ok", {"protocol": P.PROTOCOL_VERSION,
                                          "minor": P.PROTOCOL_MINOR,
                                          "features": list(P.FEATURES), "lease_s": 15.0,
                                          "game": True, "owner": "key",
                                          "model": "smol.gguf", "loading": False,
                                          "instance": INSTANCE, "limits": limits},
             "instance (1.2): serve --instance; a launcher refuses a sidecar whose instance "
             "or model is not its own"),
        _rep("reply_ok_ping", 2, "ok", {"t": 1_700_000_000.25}, ""),
        _rep("reply_ok_load_model", 3, "ok", {"model": "smol.gguf", "memory": MEMORY}, ""),
        _rep("reply_ok_open_session", 4, "ok", {"session": SID}, ""),
        _rep("event_token_1", 5, "token", {"text": "Swords", "i": 1}, "first piece of chat 5"),
        _rep("event_token_2", 5, "token", {"text": ", traveller.", "i": 2}, ""),
        _rep("event_token_logprobs", 5, "token", {"text": "Swords", "i": 1, "logprobs": [
            {"token": "Sw", "logprob": -0.25, "top": [{"token": "Sw", "logprob": -0.25},
                                                      {"token": "Ax", "logprob": -1.75}]},
            {"token": "ords", "logprob": -0.015625, "top": [
                {"token": "ords", "logprob": -0.015625}, {"token": "ord", "logprob": -4.5}]}]},
             "1.3, a chat with logprobs 2: the tokens whose text this piece completes"),
        _rep("event_done", 5, "done", {
            "text": "Swords, traveller.", "finish_reason": "stop",
            "usage": {"prompt_tokens": 41, "completion_tokens": 5, "cached_tokens": 0,
                      "dropped_turns": 0, "summarised_turns": 0},
            "timings": {"ttft_s": 0.042, "total_s": 0.118}}, "the text is the tokens joined"),
        _rep("event_tool_call", 5, "tool_call", {
            "id": "call_5f0c2a9e1b7d4c3a", "name": "follow", "arguments": '{"distance": 2}',
            "i": 1, "index": 0}, "1.3: a call, sent once its closing tag is read"),
        _rep("event_done_tool_calls", 5, "done", {
            "text": "", "finish_reason": "tool_calls",
            "usage": {"prompt_tokens": 180, "completion_tokens": 19, "cached_tokens": 0,
                      "dropped_turns": 0, "summarised_turns": 0},
            "timings": {"ttft_s": 0.05, "total_s": 0.3},
            "tool_calls": [{"id": "call_5f0c2a9e1b7d4c3a", "name": "follow",
                            "arguments": '{"distance": 2}'}]},
             "1.3: a reply that ended in calls"),
        _rep("event_done_cancelled", 5, "done", {
            "text": "Swords", "finish_reason": "cancelled",
            "usage": {"prompt_tokens": 41, "completion_tokens": 2, "cached_tokens": 0,
                      "dropped_turns": 0, "summarised_turns": 0},
            "timings": {"ttft_s": 0.042, "total_s": 0.07}},
             "a cancelled stream still ends with done"),
        _rep("reply_ok_cancel", 6, "ok", {"cancelled": True}, ""),
        _rep("reply_ok_save_session", 7, "ok", {"name": "brom-day1", "bytes": 1_203_456}, ""),
        _rep("reply_ok_restore_session", 8, "ok", {"session": "a07c55e3d2f1"}, ""),
        _rep("reply_ok_close_session", 9, "ok", {}, ""),
        _rep("reply_ok_frame", 10, "ok", {"paced": True}, ""),
        _rep("reply_ok_reserve_vram", 11, "ok", {"recorded": True, "acknowledged": True,
                                                  "granted": True}, ""),
        _rep("reply_ok_stats", 12, "ok", {
            "model": "smol.gguf", "loading": False, "clients": 1, "uptime_s": 12.5,
            "requests": 12, "errors": 0,
            "last_frame": {"frame": 1200, "frame_time_ms": 16.6, "target_frame_time_ms": 16.6,
                           "vram_used": 5 * 2**30, "vram_budget": 8 * 2**30,
                           "busy_threads": 3, "cpu_share": None},
            "reservations": [{"bytes": 2**30, "deadline_frames": 30}],
            "pacing_delay_s": 0.0, "sessions": 2, "plan": "all-cpu", "memory": MEMORY,
            "reshards": 0}, ""),
        _rep("reply_ok_shutdown", 13, "ok", {}, ""),
        _rep("reply_ok_set_priority", 14, "ok", {}, ""),
        _rep("reply_ok_list_sessions", 15, "ok", {"sessions": [
            {"session": SID, "owner": "you", "persona": "brom", "priority": 50, "busy": False,
             "tokens": 57, "max_tokens": 2304, "memory": "fold", "dropped_turns": 0,
             "idle_s": 3.5},
            {"session": "npc.brom", "owner": "orphaned", "persona": "brom", "priority": 0,
             "busy": False, "tokens": 112, "max_tokens": 2304, "memory": "fold",
             "dropped_turns": 12, "idle_s": 20.25}], "free_slots": 5, "others": 1,
            "reclaimable": 1},
             "reclaimable (1.2): orphaned sessions an open_session would close when no slot "
             "is free"),
        _rep("reply_ok_adopt_session", 16, "ok", {"session": "npc.brom"}, ""),
        _rep("reply_ok_resume_stream", 17, "ok", {"running": False, "replayed": 1},
             "then the missed events: here chat 5's done"),
        _rep("reply_ok_goodbye", 18, "ok", {"closed": 0, "orphaned": 2}, ""),
        _rep("reply_ok_tokenize", 60, "ok", {"tokens": [19556, 28, 36874, 30],
                                             "pieces": ["Hello", ",", " traveller", "."]}, ""),
        _rep("reply_ok_detokenize", 61, "ok", {"text": "Hello, traveller."}, ""),
        _rep("reply_ok_embed", 62, "ok", {"data": [[0.125, -0.5, 0.25], [0.0, 1.0, 0.0]],
                                          "tokens": 9, "pooling": "mean"},
             "vectors shortened for the example (the model's embedding width)"),
        _rep("reply_ok_ignored_fields", 25, "ok", {
            "model": "smol.gguf", "loading": False, "clients": 1, "uptime_s": 12.5,
            "requests": 25, "errors": 0, "last_frame": None, "reservations": [],
            "ignored": ["unknown_field"]}, "an answer naming the fields it ignored"),
        _rep("reply_error_session_exists", 4, "error", {
            "code": "session_exists", "message": "a session named 'npc.brom' exists: adopt it "
            "with adopt_session, or choose another name", "retryable": False}, ""),
        _rep("reply_error_hello_required", 2, "error", {
            "code": "hello_required", "message": "say hello first (protocol version)",
            "retryable": True}, "any request before hello"),
        _rep("reply_error_busy", 14, "error", {
            "code": "busy", "message": "4 replies are already streaming for this client; wait "
                                       "for one to finish", "retryable": True}, "back-pressure"),
        _rep("reply_error_malformed", 0, "error", {
            "code": "malformed", "message": "not a msgpack message: FormatError",
            "retryable": False}, "id 0: the request's id could not be read"),
        _rep("event_error_stream", 5, "error", {
            "code": "context_full", "message": "the shared context is full; retry when "
                                               "other replies end, close idle sessions or "
                                               "raise n_ctx",
            "retryable": True}, "a stream can end with error instead of done"),
        _rep("event_heartbeat", 0, "heartbeat", {"t": 1_700_000_001.0},
             "every second, id 0; not an answer to anything"),
    ]


def json_twin(value: Any) -> Any:
    """A decoded message as its JSON twin shows it: msgpack ``bin`` (``bytes``) becomes
    ``{"$bin": "<hex>"}``; everything else is JSON already."""
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, dict):
        return {k: json_twin(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_twin(v) for v in value]
    return value


def vector_files() -> dict[str, bytes]:
    """File name -> bytes of every file in ``bridge/vectors/``."""
    files: dict[str, bytes] = {}
    for v in vectors():
        twin: dict[str, Any] = {"name": v.name, "direction": v.direction, "note": v.note,
                                "message": json_twin(v.message)}
        if v.message is None:
            twin["msgpack_hex"] = v.frame.hex()
        if v.expect is not None:
            twin["expect"] = v.expect
        files[f"{v.name}.msgpack"] = v.frame
        files[f"{v.name}.json"] = _dump_json(twin).encode()
    return dict(sorted(files.items()))


def write_vectors(out_dir: str | Path = VECTORS_DIR) -> list[Path]:
    """Write the golden vectors into ``out_dir`` (stale vectors there are removed)."""
    return _write_dir(Path(out_dir), vector_files(), ("*.json", "*.msgpack"))


def _write_dir(out: Path, files: dict[str, bytes], owned: tuple[str, ...]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for pattern in owned:
        for stale in out.glob(pattern):
            if stale.name not in files:
                stale.unlink()
    written = []
    for name, data in files.items():
        path = out / name
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else ROOT
    schemas = export_schemas(root / "bridge" / "schema")
    vecs = write_vectors(root / "bridge" / "vectors")
    print(f"wrote {len(schemas)} schema files to {root / 'bridge' / 'schema'} and "
          f"{len(vecs)} vector files to {root / 'bridge' / 'vectors'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
