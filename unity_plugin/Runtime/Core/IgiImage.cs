using System;
using System.Collections.Generic;

namespace Igi.Sdk
{
    /// <summary>
    /// One image an NPC sees with a chat line (protocol 1.1 feature <c>images</c>,
    /// <see cref="ChatOptions.Images"/>): PNG or JPEG file bytes, or raw 8-bit RGB/RGBA pixels.
    /// The sidecar's model needs its vision projector (<c>serve --mmproj</c>), else the chat
    /// ends with <c>vision_unavailable</c>.
    /// <para>The protocol wants pixel rows top to bottom. Unity's are bottom to top
    /// (<c>Texture2D.GetRawTextureData</c>, <c>GetPixels32</c>, <c>ReadPixels</c>): pass
    /// <c>rowsBottomToTop: true</c> and the rows are flipped when the chat is sent.</para>
    /// <para>The arrays are not copied: leave them unchanged until <c>Chat</c> returns.
    /// Nothing is checked here; <c>Chat</c> refuses a bad image with <c>invalid_body</c>.</para>
    /// </summary>
    public sealed class IgiImage
    {
        /// <summary>At most this many images per chat line.</summary>
        public const int MaxImages = 4;
        /// <summary>At most this many bytes of <see cref="Data"/> or <see cref="Pixels"/> (16 MiB).</summary>
        public const int MaxBytes = 16 << 20;
        /// <summary>Raw pixels: at most this many a side...</summary>
        public const int MaxSide = 8192;
        /// <summary>... and this many in all (32 Mpx).</summary>
        public const long MaxPixels = 32L << 20;

        /// <summary>PNG or JPEG file bytes; null for raw pixels.</summary>
        public readonly byte[] Data;
        /// <summary>Raw 8-bit pixels, <see cref="Width"/> × <see cref="Height"/> ×
        /// <see cref="Channels"/> bytes, no row padding; null for an encoded image.</summary>
        public readonly byte[] Pixels;
        public readonly int Width;
        public readonly int Height;
        /// <summary>3 (RGB) or 4 (RGBA; the sidecar drops alpha).</summary>
        public readonly int Channels;
        /// <summary>The first row of <see cref="Pixels"/> is the bottom one (Unity's order).</summary>
        public readonly bool RowsBottomToTop;

        IgiImage(byte[] data, byte[] pixels, int width, int height, int channels, bool rowsBottomToTop)
        {
            Data = data;
            Pixels = pixels;
            Width = width;
            Height = height;
            Channels = channels;
            RowsBottomToTop = rowsBottomToTop;
        }

        /// <summary>A PNG or JPEG file (<c>File.ReadAllBytes</c>, <c>Texture2D.EncodeToPNG</c>).</summary>
        public static IgiImage FromEncoded(byte[] pngOrJpeg)
        {
            return new IgiImage(pngOrJpeg, null, 0, 0, 0, false);
        }

        /// <summary>Raw 8-bit pixels, <paramref name="channels"/> 4 (RGBA) or 3 (RGB), no row
        /// padding (Unity's <c>TextureFormat.RGBA32</c> / <c>RGB24</c>).</summary>
        public static IgiImage FromPixels(byte[] pixels, int width, int height, int channels, bool rowsBottomToTop = false)
        {
            return new IgiImage(null, pixels, width, height, channels, rowsBottomToTop);
        }

        /// <summary>RGBA pixels (4 bytes each), e.g. <c>Texture2D.GetRawTextureData()</c> of an
        /// RGBA32 texture: rows bottom to top by default, as Unity gives them.</summary>
        public static IgiImage FromRgba32(byte[] pixels, int width, int height, bool rowsBottomToTop = true)
        {
            return FromPixels(pixels, width, height, 4, rowsBottomToTop);
        }

        /// <summary>A copy of <paramref name="pixels"/> with its rows in the other order (bottom to
        /// top becomes top to bottom). The length must be width × height × channels.</summary>
        public static byte[] FlipRows(byte[] pixels, int width, int height, int channels)
        {
            if (pixels == null) throw new ArgumentNullException("pixels");
            long row = (long)width * channels;
            if (width < 0 || height < 0 || channels < 1 || row * height != pixels.LongLength)
                throw new ArgumentException("pixels has " + pixels.LongLength + " bytes, not width x height x channels = " + row * height);
            var flipped = new byte[pixels.Length];
            for (int y = 0; y < height; y++)
                Buffer.BlockCopy(pixels, (int)(y * row), flipped, (int)((height - 1 - y) * row), (int)row);
            return flipped;
        }

        /// <summary>Why the sidecar would refuse this image for its form, or null: the limits of
        /// PROTOCOL.md (`chat`, §7) that can be checked without decoding.</summary>
        public string Problem()
        {
            if ((Data == null) == (Pixels == null)) return "has neither data nor pixels";
            if (Data != null)
            {
                if (Data.Length == 0) return "data is empty";
                if (Data.Length > MaxBytes) return "data has " + Data.Length + " bytes (limit " + MaxBytes + ")";
                return null;
            }
            if (Pixels.Length == 0) return "pixels is empty";
            if (Pixels.Length > MaxBytes) return "pixels has " + Pixels.Length + " bytes (limit " + MaxBytes + ")";
            if (Channels != 3 && Channels != 4) return "channels is " + Channels + " (3 = RGB or 4 = RGBA)";
            if (Width < 1 || Height < 1) return "is " + Width + "x" + Height + " (sides of 1 pixel or more)";
            if (Width > MaxSide || Height > MaxSide) return "is " + Width + "x" + Height + " (at most " + MaxSide + " pixels a side)";
            if ((long)Width * Height > MaxPixels) return "has " + (long)Width * Height + " pixels (limit " + MaxPixels + ")";
            long expected = (long)Width * Height * Channels;
            if (Pixels.LongLength != expected)
                return "pixels has " + Pixels.LongLength + " bytes, not width x height x channels = " + expected;
            return null;
        }

        /// <summary>The image as the wire wants it (rows top to bottom); call after
        /// <see cref="Problem"/> said null.</summary>
        internal Dictionary<string, object> ToWire()
        {
            var map = new Dictionary<string, object>();
            if (Data != null)
            {
                map["data"] = Data;
                return map;
            }
            map["pixels"] = RowsBottomToTop ? FlipRows(Pixels, Width, Height, Channels) : Pixels;
            map["width"] = (long)Width;
            map["height"] = (long)Height;
            map["channels"] = (long)Channels;
            return map;
        }
    }
}
