// The msgpack codec and the ZMTP frame parser without a network: round trips, the protocol's
// bounds, every conformance vector of bridge/vectors, and random / mutated input (no crash; run
// under ASan/UBSan by run.sh).
#include <dirent.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "IgiClient.h"
#include "IgiMsgPack.h"
#include "IgiZmtp.h"
#include "sidecar.h"

using igi::MsgDecode;
using igi::MsgEncode;
using igi::MsgType;
using igi::MsgValue;

namespace {

bool Decode(const std::string& bytes, MsgValue& out, std::string* why = nullptr) {
    return MsgDecode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), out, why);
}

std::string Hex(const char* hex) {
    std::string out;
    for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) out.push_back(static_cast<char>(std::stoi(std::string(hex + i, 2), nullptr, 16)));
    return out;
}

MsgValue Sample() {
    MsgValue m = MsgValue::Map();
    m.Set("nil", MsgValue::Nil());
    m.Set("t", MsgValue::Bool(true));
    m.Set("small", MsgValue::Int(5));
    m.Set("neg", MsgValue::Int(-33));
    m.Set("big", MsgValue::Int(9007199254740991LL));
    m.Set("min", MsgValue::Int(INT64_MIN));
    m.Set("umax", MsgValue::UInt(UINT64_MAX));
    m.Set("f", MsgValue::Float(0.7));
    m.Set("s", MsgValue::Str(std::string(300, 'x')));
    m.Set("utf8", MsgValue::Str("Brom \xc3\xa9\xf0\x9f\x98\x80"));
    m.Set("bin", MsgValue::Bin(std::string("\x00\x01\x02", 3)));
    MsgValue a = MsgValue::Array();
    for (int i = 0; i < 20; ++i) a.Push(MsgValue::Int(i * 1000));
    m.Set("arr", a);
    return m;
}

}  // namespace

TEST(MsgPack, RoundTripKeepsEveryType) {
    MsgValue in = Sample();
    std::string bytes = MsgEncode(in);
    MsgValue out;
    ASSERT_TRUE(Decode(bytes, out));
    EXPECT_TRUE(out.Find("nil")->IsNil());
    EXPECT_TRUE(out.GetBool("t"));
    EXPECT_EQ(out.GetInt("small"), 5);
    EXPECT_EQ(out.GetInt("neg"), -33);
    EXPECT_EQ(out.GetInt("big"), 9007199254740991LL);
    EXPECT_EQ(out.GetInt("min"), INT64_MIN);
    int64_t ignored;
    EXPECT_FALSE(out.Find("umax")->GetInt(ignored));  // does not fit int64: not an int64
    EXPECT_DOUBLE_EQ(out.Find("umax")->AsDouble(), 18446744073709551615.0);
    EXPECT_DOUBLE_EQ(out.GetDouble("f"), 0.7);
    EXPECT_EQ(out.GetString("s"), std::string(300, 'x'));
    EXPECT_EQ(out.GetString("utf8"), "Brom \xc3\xa9\xf0\x9f\x98\x80");
    EXPECT_EQ(out.Find("bin")->Type(), MsgType::Bin);
    EXPECT_EQ(out.Find("bin")->AsString().size(), 3u);
    EXPECT_EQ(out.Find("arr")->Size(), 20u);
    EXPECT_EQ(out.Find("arr")->At(19).AsInt(), 19000);
    EXPECT_EQ(MsgEncode(out), bytes);  // stable
}

TEST(MsgPack, ShortestIntegerForms) {
    EXPECT_EQ(MsgEncode(MsgValue::Int(127)), Hex("7f"));
    EXPECT_EQ(MsgEncode(MsgValue::Int(128)), Hex("cc80"));
    EXPECT_EQ(MsgEncode(MsgValue::Int(-32)), Hex("e0"));
    EXPECT_EQ(MsgEncode(MsgValue::Int(-33)), Hex("d0df"));
    EXPECT_EQ(MsgEncode(MsgValue::Int(65536)), Hex("ce00010000"));
    EXPECT_EQ(MsgEncode(MsgValue::Float(1.0)), Hex("cb3ff0000000000000"));  // always float64
}

TEST(MsgPack, Float32IsReadAsItsExactValue) {
    MsgValue v;
    ASSERT_TRUE(Decode(Hex("ca3f333333"), v));  // 0.7f
    EXPECT_EQ(v.Type(), MsgType::Float);
    EXPECT_DOUBLE_EQ(v.AsDouble(), static_cast<double>(0.7f));
}

TEST(MsgPack, RefusesMalformedAndOverLimitInput) {
    MsgValue v;
    std::string why;
    EXPECT_FALSE(Decode("", v, &why));
    EXPECT_FALSE(Decode(Hex("c1"), v, &why));              // never used
    EXPECT_FALSE(Decode(Hex("d40100"), v, &why));          // ext types
    EXPECT_FALSE(Decode(Hex("a5616263"), v, &why));        // str cut short
    EXPECT_EQ(why, "truncated");
    EXPECT_FALSE(Decode(Hex("dd7fffffff"), v, &why));      // 2^31 items claimed, none there
    EXPECT_FALSE(Decode(Hex("dfffffffff"), v, &why));      // a huge map claimed
    EXPECT_FALSE(Decode(Hex("dbffffffff"), v, &why));      // a 4 GiB str claimed
    EXPECT_FALSE(Decode(Hex("c0c0"), v, &why));            // trailing bytes
    EXPECT_EQ(why, "trailing bytes after the value");
    // the protocol's bounds: 256 map entries, 4096 array items, 64 levels
    std::string big_map;
    igi::MsgWriter w(big_map);
    w.MapHeader(257);
    for (int i = 0; i < 257; ++i) { w.Str(std::to_string(i)); w.Nil(); }
    EXPECT_FALSE(Decode(big_map, v, &why));
    EXPECT_EQ(why, "map larger than the limit");
    std::string deep;
    for (int i = 0; i < 200; ++i) deep.push_back(static_cast<char>(0x91));
    deep.push_back(static_cast<char>(0xc0));
    EXPECT_FALSE(Decode(deep, v, &why));
    EXPECT_EQ(why, "nested too deep");
    std::string nested;
    for (int i = 0; i < 64; ++i) nested.push_back(static_cast<char>(0x91));
    nested.push_back(static_cast<char>(0xc0));
    EXPECT_TRUE(Decode(nested, v, &why)) << why;
    // a deeply nested document far past any stack: refused, not a crash
    std::string abyss(1 << 20, static_cast<char>(0x91));
    EXPECT_FALSE(Decode(abyss, v, &why));
}

TEST(MsgPack, EnvelopeRoundTrip) {
    MsgValue body = MsgValue::Map();
    body.Set("text", MsgValue::Str("Swords"));
    body.Set("i", MsgValue::Int(1));
    std::string frame = igi::EncodeEnvelope(9007199254740991ULL, "token", body);
    uint64_t id = 0;
    std::string type;
    MsgValue got;
    ASSERT_TRUE(igi::DecodeEnvelope(frame, id, type, got));
    EXPECT_EQ(id, 9007199254740991ULL);
    EXPECT_EQ(type, "token");
    EXPECT_EQ(got.GetString("text"), "Swords");
    // not an envelope: a list, v 2, a string id, a body that is not a map
    EXPECT_FALSE(igi::DecodeEnvelope(Hex("9101"), id, type, got));
    EXPECT_FALSE(igi::DecodeEnvelope(Hex("83a17602a2696401a474797065a26f6b"), id, type, got));
    EXPECT_FALSE(igi::DecodeEnvelope(Hex("83a17601a26964a131a474797065a26f6b"), id, type, got));
    EXPECT_FALSE(igi::DecodeEnvelope(Hex("84a17601a2696401a474797065a26f6ba4626f647901"), id, type, got));
}

// Every reply and event vector the protocol ships decodes as an envelope; every vector at all
// decodes or is refused without a crash.
TEST(MsgPack, ConformanceVectors) {
    std::string dir = igitest::Env("IGI_VECTORS_DIR", "bridge/vectors");
    DIR* d = opendir(dir.c_str());
    ASSERT_NE(d, nullptr) << dir;
    int replies = 0, all = 0;
    while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name.size() < 9 || name.compare(name.size() - 8, 8, ".msgpack") != 0) continue;
        std::string bytes = igitest::ReadFile(dir + "/" + name);
        MsgValue v;
        Decode(bytes, v);
        ++all;
        if (name.rfind("reply_", 0) == 0 || name.rfind("event_", 0) == 0) {
            uint64_t id;
            std::string type;
            MsgValue body;
            EXPECT_TRUE(igi::DecodeEnvelope(bytes, id, type, body)) << name;
            ++replies;
        }
    }
    closedir(d);
    EXPECT_GT(all, 50);
    EXPECT_GT(replies, 10);
    std::printf("measured: %d vectors read, %d reply/event vectors decoded as envelopes\n", all, replies);
}

// Random bytes, and valid frames with random mutations (flipped bytes, cut short, grown,
// spliced): the decoder answers true or false and never crashes, hangs or over-allocates.
TEST(MsgPackFuzz, RandomAndMutatedFramesNeverCrash) {
    std::mt19937_64 rng(20240522);
    std::vector<std::string> seeds;
    seeds.push_back(MsgEncode(Sample()));
    MsgValue body = MsgValue::Map();
    body.Set("text", MsgValue::Str("the smith nods"));
    body.Set("finish_reason", MsgValue::Str("stop"));
    MsgValue usage = MsgValue::Map();
    usage.Set("prompt_tokens", MsgValue::Int(41));
    body.Set("usage", usage);
    seeds.push_back(igi::EncodeEnvelope(3, "done", body));
    std::string dir = igitest::Env("IGI_VECTORS_DIR", "bridge/vectors");
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            std::string name = e->d_name;
            if (name.size() > 8 && name.compare(name.size() - 8, 8, ".msgpack") == 0) seeds.push_back(igitest::ReadFile(dir + "/" + name));
        }
        closedir(d);
    }
    auto start = std::chrono::steady_clock::now();
    size_t iterations = 0, accepted = 0;
    const size_t kRounds = static_cast<size_t>(std::atoi(igitest::Env("IGI_FUZZ_ROUNDS", "60000").c_str()));
    for (size_t round = 0; round < kRounds; ++round) {
        std::string frame;
        if (round % 4 == 0) {
            frame.resize(rng() % 64);
            for (auto& c : frame) c = static_cast<char>(rng());
        } else {
            frame = seeds[rng() % seeds.size()];
            int mutations = 1 + static_cast<int>(rng() % 6);
            for (int m = 0; m < mutations && !frame.empty(); ++m) {
                size_t at = rng() % frame.size();
                switch (rng() % 5) {
                case 0: frame[at] = static_cast<char>(rng()); break;
                case 1: frame.resize(at); break;
                case 2: frame.insert(at, 1 + rng() % 8, static_cast<char>(rng())); break;
                case 3: frame[at] = static_cast<char>(0xdc + rng() % 4); break;  // a huge container header
                case 4: frame += seeds[rng() % seeds.size()].substr(0, rng() % 32); break;
                }
            }
        }
        MsgValue v;
        if (Decode(frame, v)) {
            ++accepted;
            std::string again = MsgEncode(v);  // whatever decodes, encodes
            MsgValue w;
            EXPECT_TRUE(Decode(again, w));
        }
        uint64_t id;
        std::string type;
        igi::DecodeEnvelope(frame, id, type, v);
        ++iterations;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("measured: msgpack fuzz %zu frames (%zu decoded) in %.2f s\n", iterations, accepted, s);
    EXPECT_EQ(iterations, kRounds);
}

TEST(Zmtp, GreetingAndReadyAreRfc37) {
    std::string g = igi::ZmtpDealer::Greeting();
    ASSERT_EQ(g.size(), 64u);
    EXPECT_EQ(static_cast<uint8_t>(g[0]), 0xff);
    EXPECT_EQ(g[9], 0x7f);
    EXPECT_EQ(g[10], 3);
    EXPECT_EQ(g[11], 1);
    EXPECT_EQ(g.substr(12, 5), std::string("NULL\0", 5));
    EXPECT_EQ(g[32], 0);  // as-server: no
    std::string r = igi::ZmtpDealer::ReadyCommand("igi-abc");
    EXPECT_EQ(r, std::string("\x05READY\x0bSocket-Type\x00\x00\x00\x06" "DEALER\x08Identity\x00\x00\x00\x07igi-abc", 48));
}

TEST(Zmtp, ParserSplitsShortLongAndPartialFrames) {
    igi::ZmtpParser p(1 << 20);
    std::string stream;
    stream += std::string("\x00\x03" "abc", 5);
    std::string big(300, 'z');
    stream += std::string("\x02\x00\x00\x00\x00\x00\x00\x01\x2c", 9) + big;
    stream += std::string("\x04\x05" "\x04PING", 7);
    igi::ZmtpParser::Frame f;
    // byte by byte: a frame only once whole
    int frames = 0;
    for (char c : stream) {
        p.Feed(reinterpret_cast<const uint8_t*>(&c), 1);
        int r;
        while ((r = p.Next(f)) > 0) {
            ++frames;
            if (frames == 1) { EXPECT_EQ(f.body, "abc"); }
            if (frames == 2) { EXPECT_EQ(f.body, big); }
            if (frames == 3) { EXPECT_EQ(f.flags, igi::ZmtpParser::kCommand); }
        }
        ASSERT_EQ(r, 0);
    }
    EXPECT_EQ(frames, 3);
    igi::ZmtpParser q(1 << 20);
    std::string huge("\x02\x7f\xff\xff\xff\xff\xff\xff\xff", 9);
    q.Feed(reinterpret_cast<const uint8_t*>(huge.data()), huge.size());
    EXPECT_EQ(q.Next(f), -1);  // a size no frame may have: the stream is broken
}

TEST(ZmtpFuzz, RandomStreamsNeverCrash) {
    std::mt19937_64 rng(7);
    for (int round = 0; round < 3000; ++round) {
        igi::ZmtpParser p(1 << 16);
        std::string bytes(rng() % 512, '\0');
        for (auto& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() % 8 : rng());
        size_t at = 0;
        igi::ZmtpParser::Frame f;
        while (at < bytes.size()) {
            size_t n = 1 + rng() % 37;
            if (at + n > bytes.size()) n = bytes.size() - at;
            p.Feed(reinterpret_cast<const uint8_t*>(bytes.data() + at), n);
            at += n;
            int r;
            while ((r = p.Next(f)) > 0) EXPECT_LE(f.body.size(), 1u << 16);
            if (r < 0) break;
        }
    }
}

TEST(Endpoint, ParsesTcpOnly) {
    std::string host;
    uint16_t port = 0;
    EXPECT_TRUE(igi::ParseTcpEndpoint("tcp://127.0.0.1:5599", host, port));
    EXPECT_EQ(host, "127.0.0.1");
    EXPECT_EQ(port, 5599);
    EXPECT_TRUE(igi::ParseTcpEndpoint("tcp://[::1]:80", host, port));
    EXPECT_EQ(host, "::1");
    EXPECT_TRUE(igi::ParseTcpEndpoint("tcp://localhost:1", host, port));
    EXPECT_EQ(host, "127.0.0.1");
    EXPECT_FALSE(igi::ParseTcpEndpoint("ipc:///tmp/x", host, port));
    EXPECT_FALSE(igi::ParseTcpEndpoint("tcp://127.0.0.1:0", host, port));
    EXPECT_FALSE(igi::ParseTcpEndpoint("tcp://127.0.0.1:70000", host, port));
    EXPECT_FALSE(igi::ParseTcpEndpoint("tcp://127.0.0.1:", host, port));
    EXPECT_FALSE(igi::ParseTcpEndpoint("tcp://:5599", host, port));
}

TEST(ClientOptions, BadOptionsAreRefusedAtStart) {
    igi::ClientOptions o;
    o.endpoint = "ipc:///tmp/nope";
    igi::Client a(o);
    std::string why;
    EXPECT_FALSE(a.Start(&why));
    EXPECT_NE(why.find("tcp://"), std::string::npos);
    o.endpoint = "tcp://127.0.0.1:5599";
    o.owner_key = "short";
    igi::Client b(o);
    EXPECT_FALSE(b.Start(&why));
    EXPECT_NE(why.find("owner key"), std::string::npos);
}

// The game's CPU use in a frame report: left out when not given (old call sites send what they
// sent before), clamped into the protocol's ranges when given, as the report's other figures are.
TEST(FrameReport, TheGamesCpuUseIsSentOnlyWhenGivenAndClamped) {
    MsgValue plain = igi::FrameBody(7, 16.6, 16.6, -1, -1);
    EXPECT_EQ(plain.GetInt("frame"), 7);
    EXPECT_EQ(plain.Find("busy_threads"), nullptr);
    EXPECT_EQ(plain.Find("cpu_share"), nullptr);
    EXPECT_EQ(plain.Find("vram_used"), nullptr);
    EXPECT_EQ(plain.Size(), 3u);  // frame, frame_time_ms, target_frame_time_ms

    MsgValue both = igi::FrameBody(8, 16.6, 0, -1, -1, 3, 0.25);
    ASSERT_NE(both.Find("busy_threads"), nullptr);
    EXPECT_TRUE(both.Find("busy_threads")->IsInt());
    EXPECT_EQ(both.GetInt("busy_threads"), 3);
    ASSERT_NE(both.Find("cpu_share"), nullptr);
    EXPECT_EQ(both.Find("cpu_share")->Type(), MsgType::Float);
    EXPECT_EQ(both.GetDouble("cpu_share"), 0.25);

    // the ends of the ranges, and beyond them
    MsgValue ends = igi::FrameBody(9, 16.6, 0, -1, -1, 0, 0.0);
    EXPECT_EQ(ends.GetInt("busy_threads", -1), 0);
    EXPECT_EQ(ends.GetDouble("cpu_share", -1), 0.0);
    MsgValue over = igi::FrameBody(10, 16.6, 0, -1, -1, 100000, 1.5);
    EXPECT_EQ(over.GetInt("busy_threads"), igi::kMaxBusyThreads);
    EXPECT_EQ(over.GetDouble("cpu_share"), 1.0);

    // not given: negative, NaN or infinite
    for (double share : {-1.0, -0.01, std::nan(""), HUGE_VAL, -HUGE_VAL}) {
        MsgValue none = igi::FrameBody(11, 16.6, 0, -1, -1, -1, share);
        EXPECT_EQ(none.Find("busy_threads"), nullptr);
        EXPECT_EQ(none.Find("cpu_share"), nullptr) << share;
    }
    MsgValue only_threads = igi::FrameBody(12, 16.6, 0, -1, -1, 5);
    EXPECT_EQ(only_threads.GetInt("busy_threads"), 5);
    EXPECT_EQ(only_threads.Find("cpu_share"), nullptr);

    // a frame time that is not a number would have the whole report refused: it reads as 0
    MsgValue nan_time = igi::FrameBody(13, std::nan(""), std::nan(""));
    EXPECT_EQ(nan_time.GetDouble("frame_time_ms", -1), 0.0);
    EXPECT_EQ(nan_time.Find("target_frame_time_ms"), nullptr);

    // what goes on the wire decodes to the same body
    std::string wire = igi::EncodeEnvelope(1, "frame", both);
    uint64_t id = 0;
    std::string type;
    MsgValue body;
    ASSERT_TRUE(igi::DecodeEnvelope(wire, id, type, body));
    EXPECT_EQ(body.GetInt("busy_threads"), 3);
    EXPECT_EQ(body.GetDouble("cpu_share"), 0.25);
}
