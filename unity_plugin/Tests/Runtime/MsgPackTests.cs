using System;
using System.Collections.Generic;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Codec")]
    public class MsgPackTests
    {
        static byte[] Hex(string hex)
        {
            hex = hex.Replace(" ", "");
            var b = new byte[hex.Length / 2];
            for (int i = 0; i < b.Length; i++) b[i] = Convert.ToByte(hex.Substring(2 * i, 2), 16);
            return b;
        }

        static string ToHex(byte[] b) { return BitConverter.ToString(b).Replace("-", "").ToLowerInvariant(); }

        static byte[] Repeat(byte value, int n)
        {
            var b = new byte[n];
            for (int i = 0; i < n; i++) b[i] = value;
            return b;
        }

        static byte[] Concat(params byte[][] parts)
        {
            var list = new List<byte>();
            foreach (var p in parts) list.AddRange(p);
            return list.ToArray();
        }

        [Test]
        public void DecodesEveryScalarFormat()
        {
            Assert.AreEqual(5L, MsgPack.Decode(Hex("05")));
            Assert.AreEqual(-3L, MsgPack.Decode(Hex("fd")));
            Assert.IsNull(MsgPack.Decode(Hex("c0")));
            Assert.AreEqual(false, MsgPack.Decode(Hex("c2")));
            Assert.AreEqual(true, MsgPack.Decode(Hex("c3")));
            Assert.AreEqual(200L, MsgPack.Decode(Hex("cc c8")));
            Assert.AreEqual(65535L, MsgPack.Decode(Hex("cd ffff")));
            Assert.AreEqual(4294967295L, MsgPack.Decode(Hex("ce ffffffff")));
            Assert.AreEqual(9007199254740991L, MsgPack.Decode(Hex("cf 001fffffffffffff")));
            Assert.AreEqual(ulong.MaxValue, MsgPack.Decode(Hex("cf ffffffffffffffff")));
            Assert.AreEqual(-128L, MsgPack.Decode(Hex("d0 80")));
            Assert.AreEqual(-32768L, MsgPack.Decode(Hex("d1 8000")));
            Assert.AreEqual((long)int.MinValue, MsgPack.Decode(Hex("d2 80000000")));
            Assert.AreEqual(long.MinValue, MsgPack.Decode(Hex("d3 8000000000000000")));
            Assert.AreEqual((double)0.7f, MsgPack.Decode(Hex("ca 3f333333")));   // float32, exact
            Assert.AreEqual(0.7, MsgPack.Decode(Hex("cb 3fe6666666666666")));
            Assert.AreEqual("", MsgPack.Decode(Hex("a0")));
            Assert.AreEqual("é", MsgPack.Decode(Hex("a2 c3a9")));
            Assert.AreEqual(new string('a', 40), MsgPack.Decode(Concat(Hex("d9 28"), Repeat(0x61, 40))));
            Assert.AreEqual(new string('b', 300), MsgPack.Decode(Concat(Hex("da 012c"), Repeat(0x62, 300))));
            Assert.AreEqual(new string('c', 70000), MsgPack.Decode(Concat(Hex("db 00011170"), Repeat(0x63, 70000))));
            CollectionAssert.AreEqual(new byte[] { 1, 2 }, (byte[])MsgPack.Decode(Hex("c4 02 0102")));
            CollectionAssert.AreEqual(Repeat(7, 300), (byte[])MsgPack.Decode(Concat(Hex("c5 012c"), Repeat(7, 300))));
            CollectionAssert.AreEqual(Repeat(8, 3), (byte[])MsgPack.Decode(Concat(Hex("c6 00000003"), Repeat(8, 3))));
        }

        [Test]
        public void DecodesExtFormats()
        {
            foreach (var code in new[] { "d4", "d5", "d6", "d7", "d8" })
            {
                int n = 1 << (Convert.ToInt32(code, 16) - 0xd4);
                var ext = (MsgExt)MsgPack.Decode(Concat(Hex(code + " 05"), Repeat(9, n)));
                Assert.AreEqual(5, ext.Type);
                Assert.AreEqual(n, ext.Data.Length);
            }
            Assert.AreEqual(3, ((MsgExt)MsgPack.Decode(Hex("c7 03 ff 010203"))).Data.Length);
            Assert.AreEqual(-1, ((MsgExt)MsgPack.Decode(Hex("c7 03 ff 010203"))).Type);
            Assert.AreEqual(2, ((MsgExt)MsgPack.Decode(Hex("c8 0002 01 0102"))).Data.Length);
            Assert.AreEqual(1, ((MsgExt)MsgPack.Decode(Hex("c9 00000001 01 01"))).Data.Length);
        }

        [Test]
        public void DecodesContainersOfEveryWidth()
        {
            var fix = (Dictionary<string, object>)MsgPack.Decode(Hex("82 a1 61 01 a1 62 92 01 02"));
            Assert.AreEqual(1L, fix["a"]);
            CollectionAssert.AreEqual(new object[] { 1L, 2L }, (List<object>)fix["b"]);

            var array16 = (List<object>)MsgPack.Decode(Concat(Hex("dc 0014"), Repeat(1, 20)));
            Assert.AreEqual(20, array16.Count);
            var array32 = (List<object>)MsgPack.Decode(Concat(Hex("dd 00000003"), Repeat(2, 3)));
            Assert.AreEqual(3, array32.Count);

            var map16 = new List<byte>(Hex("de 0011"));
            for (int i = 0; i < 17; i++) { map16.Add(0xa1); map16.Add((byte)('A' + i)); map16.Add((byte)i); }
            Assert.AreEqual(17, ((Dictionary<string, object>)MsgPack.Decode(map16.ToArray())).Count);
            var map32 = (Dictionary<string, object>)MsgPack.Decode(Hex("df 00000001 a1 6b c3"));
            Assert.AreEqual(true, map32["k"]);
        }

        [Test]
        public void EncodesIntegersInTheSmallestForm()
        {
            Assert.AreEqual("00", ToHex(MsgPack.Encode(0L)));
            Assert.AreEqual("7f", ToHex(MsgPack.Encode(127L)));
            Assert.AreEqual("cc80", ToHex(MsgPack.Encode(128L)));
            Assert.AreEqual("cd0100", ToHex(MsgPack.Encode(256)));
            Assert.AreEqual("ce00010000", ToHex(MsgPack.Encode(65536L)));
            Assert.AreEqual("cf0000000100000000", ToHex(MsgPack.Encode(4294967296L)));
            Assert.AreEqual("ff", ToHex(MsgPack.Encode(-1)));
            Assert.AreEqual("e0", ToHex(MsgPack.Encode(-32L)));
            Assert.AreEqual("d0df", ToHex(MsgPack.Encode(-33L)));
            Assert.AreEqual("d1ff7f", ToHex(MsgPack.Encode(-129L)));
            Assert.AreEqual("d2ffff7fff", ToHex(MsgPack.Encode(-32769L)));
            Assert.AreEqual("d3ffffffff7fffffff", ToHex(MsgPack.Encode(-2147483649L)));
            Assert.AreEqual("cfffffffffffffffff", ToHex(MsgPack.Encode(ulong.MaxValue)));
        }

        [Test]
        public void EncodesFloatsAsFloat64AndStringsAsStr()
        {
            Assert.AreEqual("cb3fe6666666666666", ToHex(MsgPack.Encode(0.7)));
            // a float is widened, never written as float32 (0xca)
            Assert.AreEqual("cb", ToHex(MsgPack.Encode(0.5f)).Substring(0, 2));
            Assert.AreEqual("a3616263", ToHex(MsgPack.Encode("abc")));
            Assert.AreEqual("d920", ToHex(MsgPack.Encode(new string('x', 32))).Substring(0, 4));
            Assert.AreEqual("da0100", ToHex(MsgPack.Encode(new string('x', 256))).Substring(0, 6));
            Assert.AreEqual("db00010000", ToHex(MsgPack.Encode(new string('x', 65536))).Substring(0, 10));
            Assert.AreEqual("a4f09f9880", ToHex(MsgPack.Encode("\U0001F600"))); // UTF-8, not UTF-16
            Assert.AreEqual("c40101", ToHex(MsgPack.Encode(new byte[] { 1 })));
        }

        [Test]
        public void RoundTripsNestedValues()
        {
            var value = new Dictionary<string, object>
            {
                { "s", "héllo" }, { "n", -5L }, { "f", 1.25 }, { "b", false }, { "z", null },
                { "l", new List<object> { 1L, "x", new Dictionary<string, object> { { "k", 2L } } } },
                { "big", new string('q', 100000) },
            };
            ValueAssert.AreEqual(value, MsgPack.Decode(MsgPack.Encode(value)), "roundtrip");
            var strings = (List<object>)MsgPack.Decode(MsgPack.Encode(new[] { "a", "b" }));
            CollectionAssert.AreEqual(new object[] { "a", "b" }, strings);
        }

        [Test]
        public void EnforcesTheProtocolLimits()
        {
            var map257 = new List<byte>(Hex("de 0101"));
            for (int i = 0; i < 257; i++) { map257.Add(0xa2); map257.Add((byte)('a' + i / 26)); map257.Add((byte)('a' + i % 26)); map257.Add(0); }
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(map257.ToArray()));
            var map256 = new List<byte>(Hex("de 0100"));
            for (int i = 0; i < 256; i++) { map256.Add(0xa2); map256.Add((byte)('a' + i / 26)); map256.Add((byte)('a' + i % 26)); map256.Add(0); }
            Assert.AreEqual(256, ((Dictionary<string, object>)MsgPack.Decode(map256.ToArray())).Count);

            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Concat(Hex("dc 1001"), Repeat(0, 4097))));
            Assert.AreEqual(4096, ((List<object>)MsgPack.Decode(Concat(Hex("dc 1000"), Repeat(0, 4096)))).Count);

            // deeper than the limit: 100 nested arrays
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Concat(Repeat(0x91, 100), Hex("00"))));
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Hex("81 01 02")));       // non-string key
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Hex("c1")));             // never used
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Hex("db ffffffff 61"))); // huge claimed length
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Hex("dd ffffffff")));    // huge claimed count
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Hex("a2 c3")));          // truncated
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Hex("a1 ff")));          // not UTF-8
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(Hex("01 02")));          // trailing bytes
            Assert.Throws<MsgPackException>(() => MsgPack.Decode(new byte[0]));
        }

        [Test]
        public void GarbageNeverThrowsAnythingElse()
        {
            var random = new Random(1234);
            var seed = MsgPack.Encode(new Dictionary<string, object>
            {
                { "v", 1L }, { "id", 3L }, { "type", "token" },
                { "body", new Dictionary<string, object> { { "text", "abc" }, { "i", 2L }, { "l", new List<object> { 1.5, null, true } } } },
            });
            for (int round = 0; round < 20000; round++)
            {
                byte[] data;
                if (round % 2 == 0)
                {
                    data = (byte[])seed.Clone();
                    for (int k = random.Next(1, 4); k > 0; k--) data[random.Next(data.Length)] = (byte)random.Next(256);
                    if (random.Next(4) == 0) Array.Resize(ref data, random.Next(data.Length));
                }
                else
                {
                    data = new byte[random.Next(0, 40)];
                    random.NextBytes(data);
                }
                object value;
                string error;
                MsgPack.TryDecode(data, out value, out error); // must return, whatever the bytes
            }
        }

        [Test]
        public void CountsCodePointsNotUtf16Units()
        {
            Assert.AreEqual(0, Protocol.CodePoints(""));
            Assert.AreEqual(3, Protocol.CodePoints("abc"));
            Assert.AreEqual(1, Protocol.CodePoints("\U0001F600"));
            Assert.AreEqual(2, Protocol.CodePoints("a\U0001F600"));
            Assert.AreEqual(1, Protocol.CodePoints("\ud800")); // a lone surrogate counts as one
        }
    }
}
