// A small JSON reader for what the client itself reads as JSON text: the arguments of an NPC's
// action call (protocol 1.3 tools) and the schemas it checks before sending. Written like the
// msgpack codec for builds without exceptions or RTTI: bounded (length, nesting, values), never
// trusting the input, answering malformed text with false and a reason.
#pragma once

#include <cstddef>
#include <string>

#include "IgiMsgPack.h"
#include "IgiSdkCoreApi.h"

namespace igi {

struct JsonLimits {
    size_t max_length = 1u << 20;  // characters of text
    size_t max_depth = 32;
    size_t max_values = 1u << 16;
};

// Reads one JSON value spanning all of `text` into a MsgValue: objects become maps with string
// keys (a repeated key: the last wins), arrays arrays, integers that fit int64 Int, other numbers
// Float, strings Str (UTF-8, \u escapes and surrogate pairs decoded), true/false Bool, null Nil.
// False (and `error` set) for anything else; `out` is then unspecified.
IGISDKCORE_API bool ParseJson(const std::string& text, MsgValue& out, std::string* error = nullptr,
                              const JsonLimits& limits = JsonLimits());

// `text` as a JSON string literal (quotes included; control characters escaped).
IGISDKCORE_API std::string JsonQuote(const std::string& text);

}  // namespace igi
