// The core's JSON reader (an action call's arguments) and the protocol's rules for NPC actions
// (protocol 1.3 tools), checked before a line is sent. No sidecar.
#include <gtest/gtest.h>

#include <string>

#include "IgiClient.h"
#include "IgiJson.h"

using igi::ChatOptions;
using igi::MsgValue;
using igi::ParseJson;
using igi::ToolResult;
using igi::ToolSpec;

TEST(Json, ReadsWhatArgumentsHold) {
    MsgValue v;
    std::string error;
    ASSERT_TRUE(ParseJson(" {\"a\": [1, -2.5, 3e2, true, false, null], \"s\": \"x\\n\\u00e9\\\"\\ud83d\\ude00\", \"o\": {}} ", v, &error)) << error;
    ASSERT_TRUE(v.IsMap());
    const MsgValue* a = v.Find("a");
    ASSERT_TRUE(a && a->IsArray());
    ASSERT_EQ(a->Size(), 6u);
    EXPECT_TRUE(a->At(0).IsInt());
    EXPECT_EQ(a->At(0).AsInt(), 1);
    EXPECT_EQ(a->At(1).AsDouble(), -2.5);
    EXPECT_EQ(a->At(2).AsDouble(), 300.0);
    EXPECT_FALSE(a->At(2).IsInt());
    EXPECT_TRUE(a->At(3).AsBool());
    EXPECT_EQ(a->At(4).Type(), igi::MsgType::Bool);
    EXPECT_TRUE(a->At(5).IsNil());
    EXPECT_EQ(v.GetString("s"), "x\n\xc3\xa9\"\xf0\x9f\x98\x80");
    EXPECT_EQ(v.Find("o")->Size(), 0u);
    ASSERT_TRUE(ParseJson("[9223372036854775807, 9223372036854775808]", v));
    EXPECT_EQ(v.At(0).AsInt(), INT64_MAX);
    EXPECT_FALSE(v.At(1).IsInt()) << "past int64: a float";
}

TEST(Json, RefusesMalformedAndUnboundedInput) {
    for (const char* bad : {"", "{", "{\"a\" 1}", "[1,]", "{\"a\":1,}", "\"open", "tru", "[1] 2", "{\"a\":\"\x01\"}",
                            "\"\\x\"", "\"\\u12\"", "-", "1.", "1e", "{1: 2}", "NaN"}) {
        MsgValue v;
        std::string error;
        EXPECT_FALSE(ParseJson(bad, v, &error)) << "'" << bad << "' read";
        EXPECT_FALSE(error.empty()) << bad;
    }
    igi::JsonLimits limits;
    std::string deep = std::string(limits.max_depth + 2, '[') + std::string(limits.max_depth + 2, ']');
    MsgValue v;
    std::string error;
    EXPECT_FALSE(ParseJson(deep, v, &error));
    EXPECT_NE(error.find("deep"), std::string::npos) << error;
    EXPECT_TRUE(ParseJson(std::string(limits.max_depth, '[') + std::string(limits.max_depth, ']'), v, &error)) << error;
    EXPECT_FALSE(ParseJson(std::string(limits.max_length + 1, ' '), v, &error));
    std::string wide = "[";
    for (size_t k = 0; k < limits.max_values + 1; ++k) wide += k ? ",0" : "0";
    wide += "]";
    EXPECT_FALSE(ParseJson(wide, v, &error));
    EXPECT_EQ(igi::JsonQuote("a\x01\t\"\\"), "\"a\\u0001\\t\\\"\\\\\"");
}

TEST(Json, ACallsArgumentsReadAsAMap) {
    igi::ToolCall call;
    call.arguments = "{\"item\": \"sword\", \"price\": 30}";
    MsgValue args;
    ASSERT_TRUE(call.Arguments(args));
    EXPECT_EQ(args.GetString("item"), "sword");
    EXPECT_EQ(args.GetInt("price"), 30);
    call.arguments = "[1]";
    EXPECT_FALSE(call.Arguments(args)) << "not an object";
}

namespace {

ToolSpec Tool(const std::string& name, const std::string& params = "{\"type\": \"object\"}") {
    ToolSpec t;
    t.name = name;
    t.parameters_json = params;
    return t;
}

}  // namespace

TEST(ToolRules, NamesFollowTheProtocol) {
    for (const char* ok : {"a", "follow", "Trade_2", "x-y"}) EXPECT_TRUE(igi::IsValidToolName(ok)) << ok;
    EXPECT_TRUE(igi::IsValidToolName(std::string(64, 'n')));
    for (const char* bad : {"", "auto", "none", "required", "open door", "\xc3\xa9", "a.b"}) EXPECT_FALSE(igi::IsValidToolName(bad)) << bad;
    EXPECT_FALSE(igi::IsValidToolName(std::string(65, 'n')));
}

TEST(ToolRules, EachBrokenRuleIsNamed) {
    ChatOptions ok;
    ok.tools = {Tool("follow"), Tool("trade")};
    ok.tool_choice = "trade";
    ok.tool_results = {ToolResult{"call_1", "done"}};
    EXPECT_EQ(igi::ToolsProblem(ok), "");
    ChatOptions none;
    none.tool_choice = "none";
    EXPECT_EQ(igi::ToolsProblem(none), "") << "none needs no tools";

    auto problem = [](void (*change)(ChatOptions&)) {
        ChatOptions o;
        o.tools = {Tool("follow"), Tool("trade")};
        change(o);
        return igi::ToolsProblem(o, 100);
    };
    EXPECT_NE(problem([](ChatOptions& o) { o.tools[0].name = "open door"; }).find("tools[0].name"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tools[1].name = "follow"; }).find("twice"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tool_choice = "flee"; }).find("tool_choice"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tools.clear(); o.tool_choice = "required"; }).find("no tools"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tools[0].parameters_json = "{\"type\": "; }).find("not JSON"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tools[0].parameters_json = "{\"type\": \"string\"}"; }).find("object"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tools[0].description = std::string(2001, 'x'); }).find("description"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.extra.Set("json_schema", MsgValue::Str("{}")); }).find("grammar"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tool_results = {ToolResult{std::string(65, 'c'), ""}}; }).find(".id"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tool_results = {ToolResult{"c", std::string(101, 'x')}}; }).find("content"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) {
        for (int k = 0; k < 31; ++k) o.tools.push_back(Tool("a" + std::to_string(k)));
    }).find("limit 32"), std::string::npos);
    EXPECT_NE(problem([](ChatOptions& o) { o.tool_results.assign(17, ToolResult{"c", ""}); }).find("limit 16"), std::string::npos);
}
