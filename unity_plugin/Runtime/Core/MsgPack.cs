// A small msgpack codec for the sidecar protocol, written for IL2CPP/AOT: no reflection, values
// are a plain tree of objects:
//   null, bool, long (every integer that fits), ulong (only above long.MaxValue), double (float32
//   is widened exactly), string (str, UTF-8), byte[] (bin), MsgExt (ext), List<object> (array),
//   Dictionary<string, object> (map; keys must be strings, as the protocol requires).
// Encode writes integers in their smallest form, floats always as float64, strings as str, and
// refuses (MsgPackException) what the sidecar could not read: more map entries, array items or
// nesting than the protocol allows, a str over 1 MiB. The sidecar answers such a message
// `malformed` with id 0, which no request can be tied to, so it must never leave the client.
// Decode enforces the protocol's limits and throws MsgPackException (never anything else) on
// garbage, so one bad message cannot take the reader down.
using System;
using System.Collections;
using System.Collections.Generic;
using System.IO;
using System.Text;

namespace Igi.Sdk
{
    /// <summary>A msgpack ext value (type code and raw payload), kept as is.</summary>
    public sealed class MsgExt
    {
        public readonly sbyte Type;
        public readonly byte[] Data;

        public MsgExt(sbyte type, byte[] data)
        {
            Type = type;
            Data = data ?? new byte[0];
        }
    }

    public sealed class MsgPackException : Exception
    {
        public MsgPackException(string message) : base(message) { }
    }

    public static class MsgPack
    {
        /// <summary>Protocol limits (PROTOCOL.md §2 and §7).</summary>
        public const int MaxMapEntries = 256;
        public const int MaxArrayItems = 4096;
        public const int MaxDepth = 64;

        static readonly UTF8Encoding StrictUtf8 = new UTF8Encoding(false, true);

        // ---- encode ------------------------------------------------------------------------

        public static byte[] Encode(object value)
        {
            var output = new MemoryStream(128);
            Write(output, value, 0);
            return output.ToArray();
        }

        static void Write(MemoryStream o, object value, int depth)
        {
            if (depth > MaxDepth)
                throw new MsgPackException("value nested deeper than " + MaxDepth + " levels");
            if (value == null) { o.WriteByte(0xc0); return; }
            if (value is bool) { o.WriteByte((bool)value ? (byte)0xc3 : (byte)0xc2); return; }
            if (value is string) { WriteString(o, (string)value); return; }
            if (value is int) { WriteInt(o, (int)value); return; }
            if (value is long) { WriteInt(o, (long)value); return; }
            if (value is double) { WriteDouble(o, (double)value); return; }
            if (value is float) { WriteDouble(o, (float)value); return; }
            if (value is ulong) { WriteUInt(o, (ulong)value); return; }
            if (value is uint) { WriteInt(o, (uint)value); return; }
            if (value is short) { WriteInt(o, (short)value); return; }
            if (value is ushort) { WriteInt(o, (ushort)value); return; }
            if (value is byte) { WriteInt(o, (byte)value); return; }
            if (value is sbyte) { WriteInt(o, (sbyte)value); return; }
            if (value is byte[]) { WriteBin(o, (byte[])value); return; }
            if (value is MsgExt) { WriteExt(o, (MsgExt)value); return; }
            var map = value as IDictionary<string, object>;
            if (map != null)
            {
                if (map.Count > MaxMapEntries)
                    throw new MsgPackException("a map of " + map.Count + " entries (limit " + MaxMapEntries + ")");
                WriteHeader(o, map.Count, 0x80, 0xde, 0xdf);
                foreach (var entry in map)
                {
                    WriteString(o, entry.Key);
                    Write(o, entry.Value, depth + 1);
                }
                return;
            }
            var list = value as IList; // List<object>, string[], List<string>, ...
            if (list != null)
            {
                if (list.Count > MaxArrayItems)
                    throw new MsgPackException("an array of " + list.Count + " items (limit " + MaxArrayItems + ")");
                WriteHeader(o, list.Count, 0x90, 0xdc, 0xdd);
                foreach (var item in list)
                    Write(o, item, depth + 1);
                return;
            }
            throw new MsgPackException("cannot encode a " + value.GetType().Name);
        }

        static void WriteHeader(MemoryStream o, int count, int fixBase, byte code16, byte code32)
        {
            if (count < 16) o.WriteByte((byte)(fixBase | count));
            else if (count <= 0xffff) { o.WriteByte(code16); WriteBE(o, (ulong)count, 2); }
            else { o.WriteByte(code32); WriteBE(o, (ulong)count, 4); }
        }

        static void WriteInt(MemoryStream o, long v)
        {
            if (v >= 0) { WriteUInt(o, (ulong)v); return; }
            if (v >= -32) o.WriteByte((byte)(sbyte)v);
            else if (v >= sbyte.MinValue) { o.WriteByte(0xd0); o.WriteByte((byte)(sbyte)v); }
            else if (v >= short.MinValue) { o.WriteByte(0xd1); WriteBE(o, (ulong)v, 2); }
            else if (v >= int.MinValue) { o.WriteByte(0xd2); WriteBE(o, (ulong)v, 4); }
            else { o.WriteByte(0xd3); WriteBE(o, (ulong)v, 8); }
        }

        static void WriteUInt(MemoryStream o, ulong v)
        {
            if (v < 128) o.WriteByte((byte)v);
            else if (v <= 0xff) { o.WriteByte(0xcc); o.WriteByte((byte)v); }
            else if (v <= 0xffff) { o.WriteByte(0xcd); WriteBE(o, v, 2); }
            else if (v <= 0xffffffff) { o.WriteByte(0xce); WriteBE(o, v, 4); }
            else { o.WriteByte(0xcf); WriteBE(o, v, 8); }
        }

        static void WriteDouble(MemoryStream o, double v)
        {
            o.WriteByte(0xcb);
            WriteBE(o, (ulong)BitConverter.DoubleToInt64Bits(v), 8);
        }

        static void WriteString(MemoryStream o, string s)
        {
            byte[] bytes;
            try { bytes = StrictUtf8.GetBytes(s); }
            catch (ArgumentException) // EncoderFallbackException: a lone surrogate
            {
                throw new MsgPackException("a string holds a lone UTF-16 surrogate (not valid Unicode)");
            }
            int n = bytes.Length;
            if (n > Protocol.MaxStrBytes)
                throw new MsgPackException("a string of " + n + " UTF-8 bytes (limit " + Protocol.MaxStrBytes + ")");
            if (n < 32) o.WriteByte((byte)(0xa0 | n));
            else if (n <= 0xff) { o.WriteByte(0xd9); o.WriteByte((byte)n); }
            else if (n <= 0xffff) { o.WriteByte(0xda); WriteBE(o, (ulong)n, 2); }
            else { o.WriteByte(0xdb); WriteBE(o, (ulong)n, 4); }
            o.Write(bytes, 0, n);
        }

        static void WriteBin(MemoryStream o, byte[] b)
        {
            int n = b.Length;
            if (n <= 0xff) { o.WriteByte(0xc4); o.WriteByte((byte)n); }
            else if (n <= 0xffff) { o.WriteByte(0xc5); WriteBE(o, (ulong)n, 2); }
            else { o.WriteByte(0xc6); WriteBE(o, (ulong)n, 4); }
            o.Write(b, 0, n);
        }

        static void WriteExt(MemoryStream o, MsgExt e)
        {
            int n = e.Data.Length;
            byte fixCode = 0;
            switch (n)
            {
                case 1: fixCode = 0xd4; break;
                case 2: fixCode = 0xd5; break;
                case 4: fixCode = 0xd6; break;
                case 8: fixCode = 0xd7; break;
                case 16: fixCode = 0xd8; break;
            }
            if (fixCode != 0) o.WriteByte(fixCode);
            else if (n <= 0xff) { o.WriteByte(0xc7); o.WriteByte((byte)n); }
            else if (n <= 0xffff) { o.WriteByte(0xc8); WriteBE(o, (ulong)n, 2); }
            else { o.WriteByte(0xc9); WriteBE(o, (ulong)n, 4); }
            o.WriteByte((byte)e.Type);
            o.Write(e.Data, 0, n);
        }

        static void WriteBE(MemoryStream o, ulong v, int bytes)
        {
            for (int shift = (bytes - 1) * 8; shift >= 0; shift -= 8)
                o.WriteByte((byte)(v >> shift));
        }

        // ---- decode ------------------------------------------------------------------------

        /// <summary>Decodes exactly one value that fills <paramref name="data"/>.</summary>
        public static object Decode(byte[] data)
        {
            if (data == null) throw new MsgPackException("no data");
            return Decode(data, 0, data.Length);
        }

        public static object Decode(byte[] data, int offset, int count)
        {
            if (data == null || offset < 0 || count < 0 || offset + count > data.Length)
                throw new MsgPackException("bad buffer range");
            var reader = new Reader(data, offset, offset + count);
            object value = reader.ReadValue(0);
            if (reader.Position != offset + count)
                throw new MsgPackException("trailing bytes after the value");
            return value;
        }

        /// <summary>Decode that reports failure instead of throwing.</summary>
        public static bool TryDecode(byte[] data, out object value, out string error)
        {
            try
            {
                value = Decode(data);
                error = null;
                return true;
            }
            catch (MsgPackException e)
            {
                value = null;
                error = e.Message;
                return false;
            }
        }

        sealed class Reader
        {
            readonly byte[] buf;
            readonly int end;
            public int Position;

            public Reader(byte[] buf, int start, int end)
            {
                this.buf = buf;
                Position = start;
                this.end = end;
            }

            void Need(long n)
            {
                if (n < 0 || n > end - Position)
                    throw new MsgPackException("truncated msgpack (needs " + n + " more bytes)");
            }

            byte Byte()
            {
                Need(1);
                return buf[Position++];
            }

            ulong BE(int bytes)
            {
                Need(bytes);
                ulong v = 0;
                for (int i = 0; i < bytes; i++) v = (v << 8) | buf[Position++];
                return v;
            }

            byte[] Bytes(long n)
            {
                Need(n);
                var b = new byte[n];
                Buffer.BlockCopy(buf, Position, b, 0, (int)n);
                Position += (int)n;
                return b;
            }

            string Str(long n)
            {
                Need(n);
                string s;
                try { s = StrictUtf8.GetString(buf, Position, (int)n); }
                catch (ArgumentException) { throw new MsgPackException("str is not valid UTF-8"); }
                Position += (int)n;
                return s;
            }

            public object ReadValue(int depth)
            {
                if (depth > MaxDepth)
                    throw new MsgPackException("nested deeper than " + MaxDepth + " levels");
                byte c = Byte();
                if (c <= 0x7f) return (long)c;
                if (c >= 0xe0) return (long)(sbyte)c;
                if (c >= 0xa0 && c <= 0xbf) return Str(c & 0x1f);
                if (c >= 0x90 && c <= 0x9f) return Array(c & 0x0f, depth);
                if (c >= 0x80 && c <= 0x8f) return Map(c & 0x0f, depth);
                switch (c)
                {
                    case 0xc0: return null;
                    case 0xc2: return false;
                    case 0xc3: return true;
                    case 0xc4: return Bytes((long)BE(1));
                    case 0xc5: return Bytes((long)BE(2));
                    case 0xc6: return Bytes((long)BE(4));
                    case 0xc7: return Ext((long)BE(1));
                    case 0xc8: return Ext((long)BE(2));
                    case 0xc9: return Ext((long)BE(4));
                    case 0xca: return (double)BitConverter.ToSingle(BitConverter.GetBytes((int)BE(4)), 0);
                    case 0xcb: return BitConverter.Int64BitsToDouble((long)BE(8));
                    case 0xcc: return (long)BE(1);
                    case 0xcd: return (long)BE(2);
                    case 0xce: return (long)BE(4);
                    case 0xcf:
                        {
                            ulong u = BE(8);
                            if (u <= long.MaxValue) return (long)u;
                            return u;
                        }
                    case 0xd0: return (long)(sbyte)BE(1);
                    case 0xd1: return (long)(short)BE(2);
                    case 0xd2: return (long)(int)BE(4);
                    case 0xd3: return (long)BE(8);
                    case 0xd4: return Ext(1);
                    case 0xd5: return Ext(2);
                    case 0xd6: return Ext(4);
                    case 0xd7: return Ext(8);
                    case 0xd8: return Ext(16);
                    case 0xd9: return Str((long)BE(1));
                    case 0xda: return Str((long)BE(2));
                    case 0xdb: return Str((long)BE(4));
                    case 0xdc: return Array((long)BE(2), depth);
                    case 0xdd: return Array((long)BE(4), depth);
                    case 0xde: return Map((long)BE(2), depth);
                    case 0xdf: return Map((long)BE(4), depth);
                }
                throw new MsgPackException("0x" + c.ToString("x2") + " is not a msgpack type");
            }

            MsgExt Ext(long n)
            {
                var type = (sbyte)Byte();
                return new MsgExt(type, Bytes(n));
            }

            List<object> Array(long n, int depth)
            {
                if (n > MaxArrayItems)
                    throw new MsgPackException("array of " + n + " items (limit " + MaxArrayItems + ")");
                Need(n); // every item takes at least one byte: refuse impossible counts early
                var list = new List<object>((int)n);
                for (long i = 0; i < n; i++) list.Add(ReadValue(depth + 1));
                return list;
            }

            Dictionary<string, object> Map(long n, int depth)
            {
                if (n > MaxMapEntries)
                    throw new MsgPackException("map of " + n + " entries (limit " + MaxMapEntries + ")");
                Need(2 * n);
                var map = new Dictionary<string, object>((int)n);
                for (long i = 0; i < n; i++)
                {
                    var key = ReadValue(depth + 1) as string;
                    if (key == null) throw new MsgPackException("map key is not a string");
                    // a repeated key keeps its last value, as msgpack readers usually do
                    map[key] = ReadValue(depth + 1);
                }
                return map;
            }
        }
    }
}
