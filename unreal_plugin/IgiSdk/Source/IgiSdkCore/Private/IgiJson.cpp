#include "IgiJson.h"

#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace igi {

namespace {

class JsonReader {
public:
    JsonReader(const std::string& text, const JsonLimits& limits) : s_(text), limits_(limits) {}

    bool Read(MsgValue& out, std::string* error) {
        Value(out, 0);
        if (error_.empty()) {
            Skip();
            if (at_ != s_.size()) Fail("text after the value");
        }
        if (!error_.empty() && error) *error = error_ + " (at " + std::to_string(at_) + ")";
        return error_.empty();
    }

private:
    void Fail(const char* why) {
        if (error_.empty()) error_ = why;
    }

    void Skip() {
        while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
    }

    bool Word(const char* word) {
        size_t n = std::char_traits<char>::length(word);
        if (s_.compare(at_, n, word) != 0) return false;
        at_ += n;
        return true;
    }

    void Value(MsgValue& out, size_t depth) {
        if (!error_.empty()) return;
        if (depth > limits_.max_depth) { Fail("nested too deep"); return; }
        if (++values_ > limits_.max_values) { Fail("too many values"); return; }
        Skip();
        if (at_ >= s_.size()) { Fail("unexpected end"); return; }
        char c = s_[at_];
        if (c == '{') { Object(out, depth); return; }
        if (c == '[') { Array(out, depth); return; }
        if (c == '"') {
            std::string str;
            if (String(str)) out = MsgValue::Str(std::move(str));
            return;
        }
        if (Word("true")) { out = MsgValue::Bool(true); return; }
        if (Word("false")) { out = MsgValue::Bool(false); return; }
        if (Word("null")) { out = MsgValue::Nil(); return; }
        if (c == '-' || (c >= '0' && c <= '9')) { Number(out); return; }
        Fail("unexpected character");
    }

    void Object(MsgValue& out, size_t depth) {
        out = MsgValue::Map();
        ++at_;  // {
        Skip();
        if (at_ < s_.size() && s_[at_] == '}') { ++at_; return; }
        while (error_.empty()) {
            Skip();
            if (at_ >= s_.size() || s_[at_] != '"') { Fail("expected a key"); return; }
            std::string key;
            if (!String(key)) return;
            Skip();
            if (at_ >= s_.size() || s_[at_] != ':') { Fail("expected ':'"); return; }
            ++at_;
            MsgValue item;
            Value(item, depth + 1);
            if (!error_.empty()) return;
            out.Set(key.c_str(), std::move(item));
            Skip();
            if (at_ < s_.size() && s_[at_] == ',') { ++at_; continue; }
            if (at_ < s_.size() && s_[at_] == '}') { ++at_; return; }
            Fail("expected ',' or '}'");
        }
    }

    void Array(MsgValue& out, size_t depth) {
        out = MsgValue::Array();
        ++at_;  // [
        Skip();
        if (at_ < s_.size() && s_[at_] == ']') { ++at_; return; }
        while (error_.empty()) {
            MsgValue item;
            Value(item, depth + 1);
            if (!error_.empty()) return;
            out.Push(std::move(item));
            Skip();
            if (at_ < s_.size() && s_[at_] == ',') { ++at_; continue; }
            if (at_ < s_.size() && s_[at_] == ']') { ++at_; return; }
            Fail("expected ',' or ']'");
        }
    }

    static int Hex(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }

    bool Hex4(unsigned& code) {
        code = 0;
        for (int k = 0; k < 4; ++k) {
            int d = at_ < s_.size() ? Hex(s_[at_]) : -1;
            if (d < 0) { Fail("a bad \\u escape"); return false; }
            code = code * 16 + static_cast<unsigned>(d);
            ++at_;
        }
        return true;
    }

    static void Utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out.push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
            out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
        } else if (cp < 0x10000) {
            out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
        } else {
            out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
        }
    }

    bool String(std::string& out) {
        ++at_;  // "
        while (at_ < s_.size()) {
            unsigned char c = static_cast<unsigned char>(s_[at_++]);
            if (c == '"') return true;
            if (c < 0x20) { Fail("a control character in a string"); return false; }
            if (c != '\\') { out.push_back(static_cast<char>(c)); continue; }
            if (at_ >= s_.size()) break;
            char e = s_[at_++];
            switch (e) {
            case '"': out.push_back('"'); break;
            case '\\': out.push_back('\\'); break;
            case '/': out.push_back('/'); break;
            case 'b': out.push_back('\b'); break;
            case 'f': out.push_back('\f'); break;
            case 'n': out.push_back('\n'); break;
            case 'r': out.push_back('\r'); break;
            case 't': out.push_back('\t'); break;
            case 'u': {
                unsigned cp = 0;
                if (!Hex4(cp)) return false;
                if (cp >= 0xd800 && cp < 0xdc00 && at_ + 1 < s_.size() && s_[at_] == '\\' && s_[at_ + 1] == 'u') {
                    size_t back = at_;
                    at_ += 2;
                    unsigned low = 0;
                    if (!Hex4(low)) return false;
                    if (low >= 0xdc00 && low < 0xe000) cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
                    else at_ = back;  // not a pair: each half stands alone
                }
                // a lone surrogate has no UTF-8: the replacement character stands in
                if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd;
                Utf8(out, cp);
                break;
            }
            default: Fail("a bad escape"); return false;
            }
        }
        Fail("an unterminated string");
        return false;
    }

    void Number(MsgValue& out) {
        size_t start = at_;
        bool integral = true;
        if (s_[at_] == '-') ++at_;
        size_t digits = at_;
        while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
        if (at_ == digits) { Fail("a number without digits"); return; }
        if (at_ < s_.size() && s_[at_] == '.') {
            integral = false;
            size_t frac = ++at_;
            while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
            if (at_ == frac) { Fail("a number without digits after '.'"); return; }
        }
        if (at_ < s_.size() && (s_[at_] == 'e' || s_[at_] == 'E')) {
            integral = false;
            ++at_;
            if (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-')) ++at_;
            size_t exp = at_;
            while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
            if (at_ == exp) { Fail("a number without exponent digits"); return; }
        }
        std::string text = s_.substr(start, at_ - start);
        if (integral) {
            errno = 0;
            char* end = nullptr;
            long long v = std::strtoll(text.c_str(), &end, 10);
            if (errno == 0 && end && *end == '\0') { out = MsgValue::Int(static_cast<int64_t>(v)); return; }
        }
        // strtod reads the C locale's decimal point; JSON's is '.', which a game may have
        // changed with setlocale: read it with the locale's point put in
        char* end = nullptr;
        double d = std::strtod(text.c_str(), &end);
        if (end && *end != '\0') {
            std::string local = text;
            char point = *std::localeconv()->decimal_point;
            for (char& ch : local) if (ch == '.') ch = point;
            d = std::strtod(local.c_str(), &end);
            if (!end || *end != '\0') { Fail("a number that does not read"); return; }
        }
        out = MsgValue::Float(d);
    }

    const std::string& s_;
    const JsonLimits& limits_;
    size_t at_ = 0;
    size_t values_ = 0;
    std::string error_;
};

}  // namespace

bool ParseJson(const std::string& text, MsgValue& out, std::string* error, const JsonLimits& limits) {
    if (text.size() > limits.max_length) {
        if (error) *error = "longer than " + std::to_string(limits.max_length) + " characters";
        return false;
    }
    JsonReader reader(text, limits);
    return reader.Read(out, error);
}

std::string JsonQuote(const std::string& text) {
    std::string out;
    out.reserve(text.size() + 2);
    out.push_back('"');
    for (char ch : text) {
        unsigned char c = static_cast<unsigned char>(ch);
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            } else {
                out.push_back(ch);
            }
        }
    }
    out.push_back('"');
    return out;
}

}  // namespace igi
