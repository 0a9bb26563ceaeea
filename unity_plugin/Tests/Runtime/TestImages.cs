// Test pictures made in code (no image files in the repository): a test card as raw RGB/RGBA
// pixels and a minimal PNG encoder (stored deflate blocks, no compression library).
using System;
using System.IO;

namespace Igi.Sdk.Tests
{
    public static class TestImages
    {
        /// <summary>Width × height RGB pixels, rows top to bottom: gradients plus noise from
        /// <paramref name="seed"/> (something for an encoder to see).</summary>
        public static byte[] Card(int seed, int width = 64, int height = 64)
        {
            var random = new Random(seed);
            var rgb = new byte[width * height * 3];
            for (int y = 0; y < height; y++)
            {
                for (int x = 0; x < width; x++)
                {
                    int i = (y * width + x) * 3;
                    rgb[i] = (byte)Math.Min(255, x * 4);
                    rgb[i + 1] = (byte)Math.Min(255, y * 4);
                    rgb[i + 2] = (byte)Math.Min(255, (x + y) * 2 + random.Next(64));
                }
            }
            return rgb;
        }

        /// <summary>RGB pixels with an alpha channel added (any alpha: the sidecar drops it).</summary>
        public static byte[] WithAlpha(byte[] rgb)
        {
            var rgba = new byte[rgb.Length / 3 * 4];
            for (int p = 0; p < rgb.Length / 3; p++)
            {
                Buffer.BlockCopy(rgb, p * 3, rgba, p * 4, 3);
                rgba[p * 4 + 3] = (byte)(p * 7);
            }
            return rgba;
        }

        /// <summary>An 8-bit RGB PNG of <paramref name="rgb"/> (rows top to bottom).</summary>
        public static byte[] Png(byte[] rgb, int width, int height)
        {
            var raw = new MemoryStream();
            for (int y = 0; y < height; y++)
            {
                raw.WriteByte(0); // filter: none
                raw.Write(rgb, y * width * 3, width * 3);
            }
            var png = new MemoryStream();
            png.Write(new byte[] { 0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a }, 0, 8);
            var ihdr = new MemoryStream();
            BigEndian(ihdr, (uint)width);
            BigEndian(ihdr, (uint)height);
            ihdr.Write(new byte[] { 8, 2, 0, 0, 0 }, 0, 5); // 8 bits, RGB, deflate, no filter, no interlace
            Chunk(png, "IHDR", ihdr.ToArray());
            Chunk(png, "IDAT", ZlibStored(raw.ToArray()));
            Chunk(png, "IEND", new byte[0]);
            return png.ToArray();
        }

        static byte[] ZlibStored(byte[] data)
        {
            var z = new MemoryStream();
            z.WriteByte(0x78);
            z.WriteByte(0x01);
            int at = 0;
            do
            {
                int n = Math.Min(65535, data.Length - at);
                z.WriteByte((byte)(at + n == data.Length ? 1 : 0)); // BFINAL, BTYPE 00 (stored)
                z.WriteByte((byte)n);
                z.WriteByte((byte)(n >> 8));
                z.WriteByte((byte)~n);
                z.WriteByte((byte)(~n >> 8));
                z.Write(data, at, n);
                at += n;
            } while (at < data.Length);
            uint a = 1, b = 0;
            foreach (byte x in data)
            {
                a = (a + x) % 65521;
                b = (b + a) % 65521;
            }
            BigEndian(z, (b << 16) | a);
            return z.ToArray();
        }

        static void Chunk(MemoryStream png, string kind, byte[] data)
        {
            BigEndian(png, (uint)data.Length);
            var body = new byte[4 + data.Length];
            for (int i = 0; i < 4; i++) body[i] = (byte)kind[i];
            Buffer.BlockCopy(data, 0, body, 4, data.Length);
            png.Write(body, 0, body.Length);
            BigEndian(png, Crc32(body));
        }

        static uint Crc32(byte[] bytes)
        {
            uint crc = 0xffffffff;
            foreach (byte x in bytes)
            {
                crc ^= x;
                for (int k = 0; k < 8; k++) crc = (crc & 1) != 0 ? 0xedb88320 ^ (crc >> 1) : crc >> 1;
            }
            return ~crc;
        }

        static void BigEndian(MemoryStream o, uint v)
        {
            o.WriteByte((byte)(v >> 24));
            o.WriteByte((byte)(v >> 16));
            o.WriteByte((byte)(v >> 8));
            o.WriteByte((byte)v);
        }
    }
}
