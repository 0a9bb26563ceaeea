// A msgpack codec for the sidecar protocol, written for builds without exceptions or RTTI
// (Unreal's defaults). Decoding never trusts a length: every count is checked against the bytes
// left and against limits before anything is allocated, nesting is bounded, and malformed input
// is answered with false and a reason, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include "IgiSdkCoreApi.h"

namespace igi {

enum class MsgType : uint8_t { Nil, Bool, Int, Float, Str, Bin, Array, Map };

// One decoded msgpack value. Integers are kept as int64 when they fit, otherwise the unsigned
// value is kept in `u` with `is_unsigned_big` set (the protocol never needs more than 2^53).
class IGISDKCORE_API MsgValue {
public:
    MsgValue() = default;
    static MsgValue Nil() { return MsgValue(); }
    static MsgValue Bool(bool v);
    static MsgValue Int(int64_t v);
    static MsgValue UInt(uint64_t v);
    static MsgValue Float(double v);
    static MsgValue Str(std::string v);
    static MsgValue Bin(std::string v);
    static MsgValue Array();
    static MsgValue Map();

    MsgType Type() const { return type_; }
    bool IsNil() const { return type_ == MsgType::Nil; }
    bool IsStr() const { return type_ == MsgType::Str; }
    bool IsMap() const { return type_ == MsgType::Map; }
    bool IsArray() const { return type_ == MsgType::Array; }
    bool IsInt() const { return type_ == MsgType::Int; }

    bool AsBool(bool fallback = false) const { return type_ == MsgType::Bool ? b_ : fallback; }
    // an integer that fits int64 (a float is not an integer)
    bool GetInt(int64_t& out) const;
    int64_t AsInt(int64_t fallback = 0) const;
    // ints and floats
    double AsDouble(double fallback = 0.0) const;
    const std::string& AsString() const { return s_; }  // str and bin; empty otherwise

    // arrays
    size_t Size() const { return type_ == MsgType::Array ? items_.size() : type_ == MsgType::Map ? entries_.size() : 0; }
    const MsgValue& At(size_t i) const;
    MsgValue& Push(MsgValue v);
    const std::vector<MsgValue>& Items() const { return items_; }

    // maps (keys are any value; the protocol's are strings)
    const MsgValue* Find(const char* key) const;
    MsgValue& Set(const char* key, MsgValue v);  // replaces an existing key
    const std::vector<std::pair<MsgValue, MsgValue>>& Entries() const { return entries_; }

    // convenience readers for string-keyed maps
    std::string GetString(const char* key, const char* fallback = "") const;
    int64_t GetInt(const char* key, int64_t fallback = 0) const;
    double GetDouble(const char* key, double fallback = 0.0) const;
    bool GetBool(const char* key, bool fallback = false) const;

private:
    friend class MsgDecoder;
    friend class MsgWriter;
    MsgType type_ = MsgType::Nil;
    bool b_ = false;
    bool is_unsigned_big_ = false;
    int64_t i_ = 0;
    uint64_t u_ = 0;
    double f_ = 0.0;
    std::string s_;
    std::vector<MsgValue> items_;
    std::vector<std::pair<MsgValue, MsgValue>> entries_;
};

struct MsgLimits {
    // the protocol's bounds (PROTOCOL.md §2, §7): 256 map entries, 4096 array items
    size_t max_depth = 64;
    size_t max_map = 256;
    size_t max_array = 4096;
    size_t max_str = 1u << 20;
    size_t max_bin = (16u << 20) + (1u << 20);
    // values in all (a bound on memory: each costs about sizeof(MsgValue))
    size_t max_values = 1u << 18;
};

// Decodes exactly one value that spans all of [data, data+size). False (and `error` set) on
// malformed or over-limit input; `out` is then unspecified.
IGISDKCORE_API bool MsgDecode(const uint8_t* data, size_t size, MsgValue& out, std::string* error = nullptr,
               const MsgLimits& limits = MsgLimits());

// Appends msgpack to a byte string. Writes the shortest form of each integer, floats as float64.
class IGISDKCORE_API MsgWriter {
public:
    explicit MsgWriter(std::string& out) : out_(out) {}
    void Nil();
    void Bool(bool v);
    void Int(int64_t v);
    void UInt(uint64_t v);
    void Double(double v);
    void Str(const char* s, size_t n);
    void Str(const std::string& s) { Str(s.data(), s.size()); }
    void Bin(const void* p, size_t n);
    void ArrayHeader(uint32_t n);
    void MapHeader(uint32_t n);
    void Value(const MsgValue& v);  // recursive: only for values this program built

private:
    void Byte(uint8_t b) { out_.push_back(static_cast<char>(b)); }
    void Be(uint64_t v, int bytes);
    std::string& out_;
};

IGISDKCORE_API std::string MsgEncode(const MsgValue& v);

}  // namespace igi
