#include "IgiMsgPack.h"

#include <cmath>
#include <cstring>

namespace igi {

// ---- MsgValue --------------------------------------------------------------------------------

MsgValue MsgValue::Bool(bool v) { MsgValue m; m.type_ = MsgType::Bool; m.b_ = v; return m; }
MsgValue MsgValue::Int(int64_t v) { MsgValue m; m.type_ = MsgType::Int; m.i_ = v; m.u_ = static_cast<uint64_t>(v); return m; }
MsgValue MsgValue::UInt(uint64_t v) {
    MsgValue m;
    m.type_ = MsgType::Int;
    m.u_ = v;
    if (v <= static_cast<uint64_t>(INT64_MAX)) m.i_ = static_cast<int64_t>(v);
    else m.is_unsigned_big_ = true;
    return m;
}
MsgValue MsgValue::Float(double v) { MsgValue m; m.type_ = MsgType::Float; m.f_ = v; return m; }
MsgValue MsgValue::Str(std::string v) { MsgValue m; m.type_ = MsgType::Str; m.s_ = std::move(v); return m; }
MsgValue MsgValue::Bin(std::string v) { MsgValue m; m.type_ = MsgType::Bin; m.s_ = std::move(v); return m; }
MsgValue MsgValue::Array() { MsgValue m; m.type_ = MsgType::Array; return m; }
MsgValue MsgValue::Map() { MsgValue m; m.type_ = MsgType::Map; return m; }

bool MsgValue::GetInt(int64_t& out) const {
    if (type_ != MsgType::Int || is_unsigned_big_) return false;
    out = i_;
    return true;
}

int64_t MsgValue::AsInt(int64_t fallback) const {
    int64_t v;
    return GetInt(v) ? v : fallback;
}

double MsgValue::AsDouble(double fallback) const {
    if (type_ == MsgType::Float) return f_;
    if (type_ == MsgType::Int) return is_unsigned_big_ ? static_cast<double>(u_) : static_cast<double>(i_);
    return fallback;
}

const MsgValue& MsgValue::At(size_t i) const {
    static const MsgValue nil;
    return (type_ == MsgType::Array && i < items_.size()) ? items_[i] : nil;
}

MsgValue& MsgValue::Push(MsgValue v) {
    if (type_ != MsgType::Array) { *this = Array(); }
    items_.push_back(std::move(v));
    return items_.back();
}

const MsgValue* MsgValue::Find(const char* key) const {
    if (type_ != MsgType::Map) return nullptr;
    size_t n = std::strlen(key);
    for (const auto& e : entries_) {
        if (e.first.type_ == MsgType::Str && e.first.s_.size() == n && std::memcmp(e.first.s_.data(), key, n) == 0)
            return &e.second;
    }
    return nullptr;
}

MsgValue& MsgValue::Set(const char* key, MsgValue v) {
    if (type_ != MsgType::Map) { *this = Map(); }
    for (auto& e : entries_) {
        if (e.first.type_ == MsgType::Str && e.first.s_ == key) { e.second = std::move(v); return e.second; }
    }
    entries_.emplace_back(Str(key), std::move(v));
    return entries_.back().second;
}

std::string MsgValue::GetString(const char* key, const char* fallback) const {
    const MsgValue* v = Find(key);
    return (v && v->type_ == MsgType::Str) ? v->s_ : std::string(fallback);
}

int64_t MsgValue::GetInt(const char* key, int64_t fallback) const {
    const MsgValue* v = Find(key);
    return v ? v->AsInt(fallback) : fallback;
}

double MsgValue::GetDouble(const char* key, double fallback) const {
    const MsgValue* v = Find(key);
    return v ? v->AsDouble(fallback) : fallback;
}

bool MsgValue::GetBool(const char* key, bool fallback) const {
    const MsgValue* v = Find(key);
    return v ? v->AsBool(fallback) : fallback;
}

// ---- decoding --------------------------------------------------------------------------------

class MsgDecoder {
public:
    MsgDecoder(const uint8_t* p, size_t n, const MsgLimits& l) : p_(p), end_(p + n), limits_(l) {}

    bool Run(MsgValue& out, std::string* error) {
        bool ok = Read(out, 0);
        if (ok && p_ != end_) { ok = false; why_ = "trailing bytes after the value"; }
        if (!ok && error) *error = why_;
        return ok;
    }

private:
    size_t Left() const { return static_cast<size_t>(end_ - p_); }

    bool Fail(const char* why) { why_ = why; return false; }

    bool Be(int bytes, uint64_t& v) {
        if (Left() < static_cast<size_t>(bytes)) return Fail("truncated");
        v = 0;
        for (int i = 0; i < bytes; ++i) v = (v << 8) | p_[i];
        p_ += bytes;
        return true;
    }

    bool Bytes(uint64_t n, size_t limit, MsgType t, MsgValue& out) {
        if (n > limit) return Fail(t == MsgType::Str ? "str longer than the limit" : "bin longer than the limit");
        if (n > Left()) return Fail("truncated");
        out.type_ = t;
        out.s_.assign(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
        p_ += n;
        return true;
    }

    bool Count() {
        if (++values_ > limits_.max_values) return Fail("too many values");
        return true;
    }

    bool ArrayOf(uint64_t n, size_t depth, MsgValue& out) {
        if (n > limits_.max_array) return Fail("array longer than the limit");
        if (n > Left()) return Fail("truncated");  // each item takes at least one byte
        if (depth + 1 > limits_.max_depth) return Fail("nested too deep");
        out.type_ = MsgType::Array;
        out.items_.resize(static_cast<size_t>(n));
        for (auto& item : out.items_) if (!Read(item, depth + 1)) return false;
        return true;
    }

    bool MapOf(uint64_t n, size_t depth, MsgValue& out) {
        if (n > limits_.max_map) return Fail("map larger than the limit");
        if (n * 2 > Left()) return Fail("truncated");
        if (depth + 1 > limits_.max_depth) return Fail("nested too deep");
        out.type_ = MsgType::Map;
        out.entries_.resize(static_cast<size_t>(n));
        for (auto& e : out.entries_) {
            if (!Read(e.first, depth + 1) || !Read(e.second, depth + 1)) return false;
        }
        return true;
    }

    // depth is bounded by max_depth, so the recursion is too
    bool Read(MsgValue& out, size_t depth) {
        if (!Count()) return false;
        if (Left() < 1) return Fail("truncated");
        uint8_t t = *p_++;
        uint64_t v = 0;
        if (t <= 0x7f) { out = MsgValue::Int(t); return true; }
        if (t >= 0xe0) { out = MsgValue::Int(static_cast<int8_t>(t)); return true; }
        if ((t & 0xf0) == 0x80) return MapOf(t & 0x0f, depth, out);
        if ((t & 0xf0) == 0x90) return ArrayOf(t & 0x0f, depth, out);
        if ((t & 0xe0) == 0xa0) return Bytes(t & 0x1f, limits_.max_str, MsgType::Str, out);
        switch (t) {
        case 0xc0: out = MsgValue(); return true;
        case 0xc2: out = MsgValue::Bool(false); return true;
        case 0xc3: out = MsgValue::Bool(true); return true;
        case 0xc4: return Be(1, v) && Bytes(v, limits_.max_bin, MsgType::Bin, out);
        case 0xc5: return Be(2, v) && Bytes(v, limits_.max_bin, MsgType::Bin, out);
        case 0xc6: return Be(4, v) && Bytes(v, limits_.max_bin, MsgType::Bin, out);
        case 0xca: {
            if (!Be(4, v)) return false;
            uint32_t bits = static_cast<uint32_t>(v);
            float f;
            std::memcpy(&f, &bits, 4);
            out = MsgValue::Float(f);
            return true;
        }
        case 0xcb: {
            if (!Be(8, v)) return false;
            double d;
            std::memcpy(&d, &v, 8);
            out = MsgValue::Float(d);
            return true;
        }
        case 0xcc: if (!Be(1, v)) return false; out = MsgValue::UInt(v); return true;
        case 0xcd: if (!Be(2, v)) return false; out = MsgValue::UInt(v); return true;
        case 0xce: if (!Be(4, v)) return false; out = MsgValue::UInt(v); return true;
        case 0xcf: if (!Be(8, v)) return false; out = MsgValue::UInt(v); return true;
        case 0xd0: if (!Be(1, v)) return false; out = MsgValue::Int(static_cast<int8_t>(v)); return true;
        case 0xd1: if (!Be(2, v)) return false; out = MsgValue::Int(static_cast<int16_t>(v)); return true;
        case 0xd2: if (!Be(4, v)) return false; out = MsgValue::Int(static_cast<int32_t>(v)); return true;
        case 0xd3: if (!Be(8, v)) return false; out = MsgValue::Int(static_cast<int64_t>(v)); return true;
        case 0xd9: return Be(1, v) && Bytes(v, limits_.max_str, MsgType::Str, out);
        case 0xda: return Be(2, v) && Bytes(v, limits_.max_str, MsgType::Str, out);
        case 0xdb: return Be(4, v) && Bytes(v, limits_.max_str, MsgType::Str, out);
        case 0xdc: return Be(2, v) && ArrayOf(v, depth, out);
        case 0xdd: return Be(4, v) && ArrayOf(v, depth, out);
        case 0xde: return Be(2, v) && MapOf(v, depth, out);
        case 0xdf: return Be(4, v) && MapOf(v, depth, out);
        default:
            // 0xc1 (never used) and the ext types: the protocol has none
            return Fail("unsupported msgpack type");
        }
    }

    const uint8_t* p_;
    const uint8_t* end_;
    const MsgLimits& limits_;
    size_t values_ = 0;
    const char* why_ = "";
};

bool MsgDecode(const uint8_t* data, size_t size, MsgValue& out, std::string* error, const MsgLimits& limits) {
    if (data == nullptr && size > 0) {
        if (error) *error = "no data";
        return false;
    }
    MsgDecoder d(data, size, limits);
    return d.Run(out, error);
}

// ---- encoding --------------------------------------------------------------------------------

void MsgWriter::Be(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) Byte(static_cast<uint8_t>(v >> (8 * i)));
}

void MsgWriter::Nil() { Byte(0xc0); }
void MsgWriter::Bool(bool v) { Byte(v ? 0xc3 : 0xc2); }

void MsgWriter::UInt(uint64_t v) {
    if (v <= 0x7f) Byte(static_cast<uint8_t>(v));
    else if (v <= 0xff) { Byte(0xcc); Be(v, 1); }
    else if (v <= 0xffff) { Byte(0xcd); Be(v, 2); }
    else if (v <= 0xffffffffu) { Byte(0xce); Be(v, 4); }
    else { Byte(0xcf); Be(v, 8); }
}

void MsgWriter::Int(int64_t v) {
    if (v >= 0) { UInt(static_cast<uint64_t>(v)); return; }
    if (v >= -32) Byte(static_cast<uint8_t>(static_cast<int8_t>(v)));
    else if (v >= INT8_MIN) { Byte(0xd0); Be(static_cast<uint8_t>(static_cast<int8_t>(v)), 1); }
    else if (v >= INT16_MIN) { Byte(0xd1); Be(static_cast<uint16_t>(static_cast<int16_t>(v)), 2); }
    else if (v >= INT32_MIN) { Byte(0xd2); Be(static_cast<uint32_t>(static_cast<int32_t>(v)), 4); }
    else { Byte(0xd3); Be(static_cast<uint64_t>(v), 8); }
}

void MsgWriter::Double(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    Byte(0xcb);
    Be(bits, 8);
}

void MsgWriter::Str(const char* s, size_t n) {
    if (n <= 31) Byte(static_cast<uint8_t>(0xa0 | n));
    else if (n <= 0xff) { Byte(0xd9); Be(n, 1); }
    else if (n <= 0xffff) { Byte(0xda); Be(n, 2); }
    else { Byte(0xdb); Be(n, 4); }
    out_.append(s, n);
}

void MsgWriter::Bin(const void* p, size_t n) {
    if (n <= 0xff) { Byte(0xc4); Be(n, 1); }
    else if (n <= 0xffff) { Byte(0xc5); Be(n, 2); }
    else { Byte(0xc6); Be(n, 4); }
    out_.append(static_cast<const char*>(p), n);
}

void MsgWriter::ArrayHeader(uint32_t n) {
    if (n <= 15) Byte(static_cast<uint8_t>(0x90 | n));
    else if (n <= 0xffff) { Byte(0xdc); Be(n, 2); }
    else { Byte(0xdd); Be(n, 4); }
}

void MsgWriter::MapHeader(uint32_t n) {
    if (n <= 15) Byte(static_cast<uint8_t>(0x80 | n));
    else if (n <= 0xffff) { Byte(0xde); Be(n, 2); }
    else { Byte(0xdf); Be(n, 4); }
}

void MsgWriter::Value(const MsgValue& v) {
    switch (v.type_) {
    case MsgType::Nil: Nil(); break;
    case MsgType::Bool: Bool(v.b_); break;
    case MsgType::Int: if (v.is_unsigned_big_) UInt(v.u_); else Int(v.i_); break;
    case MsgType::Float: Double(v.f_); break;
    case MsgType::Str: Str(v.s_); break;
    case MsgType::Bin: Bin(v.s_.data(), v.s_.size()); break;
    case MsgType::Array:
        ArrayHeader(static_cast<uint32_t>(v.items_.size()));
        for (const auto& item : v.items_) Value(item);
        break;
    case MsgType::Map:
        MapHeader(static_cast<uint32_t>(v.entries_.size()));
        for (const auto& e : v.entries_) { Value(e.first); Value(e.second); }
        break;
    }
}

std::string MsgEncode(const MsgValue& v) {
    std::string out;
    MsgWriter w(out);
    w.Value(v);
    return out;
}

}  // namespace igi
