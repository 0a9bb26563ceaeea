// Images on a chat line, against a scripted transport (no sidecar): how they go on the wire
// (msgpack bin, rows top to bottom), the limits checked before sending, and a sidecar that does
// not offer the images feature.
using System;
using System.Collections.Generic;
using System.Linq;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Client")]
    public class ImageUnitTests : FakeClientFixture
    {
        void Start(bool offerImages = true)
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type != "hello") return;
                var ok = FakeTransport.HelloOk();
                var features = (List<object>)ok["features"];
                if (!offerImages) features.Remove("images");
                ok["limits"] = new Dictionary<string, object> { { "max_text_chars", 32000L }, { "max_message_bytes", 17825792L } };
                fake.Reply(id, "ok", ok);
            };
            client = new IgiClient(new IgiClientOptions { TransportFactory = () => fake });
            Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 5, "fake hello");
        }

        Dictionary<string, object> SentBody(IgiRequest request)
        {
            Pumping.Until(client, () => fake.Sent.Any(m => (long)m["id"] == request.Id), 5, request.Type + " sent");
            return (Dictionary<string, object>)fake.Sent.First(m => (long)m["id"] == request.Id)["body"];
        }

        static ChatOptions With(params IgiImage[] images) { return new ChatOptions { Images = images }; }

        [Test]
        [Timeout(10000)]
        public void ImagesGoAsBinWithRowsTopToBottom()
        {
            Start();
            byte[] png = TestImages.Png(TestImages.Card(0, 4, 2), 4, 2);
            // 2x3 RGBA, Unity's order: row 0 is the bottom one
            byte[] bottomUp = Enumerable.Range(0, 2 * 3 * 4).Select(i => (byte)i).ToArray();
            var chat = client.Chat("s", "What is this?", With(IgiImage.FromEncoded(png), IgiImage.FromRgba32(bottomUp, 2, 3),
                IgiImage.FromPixels(new byte[] { 1, 2, 3 }, 1, 1, 3)));
            var images = (List<object>)SentBody(chat)["images"];
            Assert.AreEqual(3, images.Count);

            var data = (Dictionary<string, object>)images[0];
            CollectionAssert.AreEqual(new[] { "data" }, data.Keys.ToArray());
            Assert.IsInstanceOf<byte[]>(data["data"], "decoded from msgpack bin (a str would read as a string)");
            CollectionAssert.AreEqual(png, (byte[])data["data"], "PNG bytes as msgpack bin");

            var rgba = (Dictionary<string, object>)images[1];
            Assert.AreEqual(2L, rgba["width"]);
            Assert.AreEqual(3L, rgba["height"]);
            Assert.AreEqual(4L, rgba["channels"]);
            byte[] topDown = (byte[])rgba["pixels"];
            CollectionAssert.AreEqual(bottomUp.Skip(16).Take(8), topDown.Take(8), "the top row first");
            CollectionAssert.AreEqual(bottomUp.Skip(8).Take(8), topDown.Skip(8).Take(8));
            CollectionAssert.AreEqual(bottomUp.Take(8), topDown.Skip(16), "the bottom row last");
            Assert.AreEqual(0, bottomUp[0], "the game's array is not changed");

            var rgb = (Dictionary<string, object>)images[2];
            CollectionAssert.AreEqual(new byte[] { 1, 2, 3 }, (byte[])rgb["pixels"]);
            Assert.AreEqual(3L, rgb["channels"]);
        }

        [Test]
        public void ImageBytesAreWrittenAsMsgpackBin()
        {
            // bin 8 / bin 16 / bin 32 by length, never str
            CollectionAssert.AreEqual(new byte[] { 0xc4, 0xff }, MsgPack.Encode(new byte[255]).Take(2));
            CollectionAssert.AreEqual(new byte[] { 0xc5, 0x01, 0x2c }, MsgPack.Encode(new byte[300]).Take(3));
            CollectionAssert.AreEqual(new byte[] { 0xc6, 0x00, 0x01, 0x11, 0x70 }, MsgPack.Encode(new byte[70000]).Take(5));
            byte[] big = MsgPack.Encode(new byte[IgiImage.MaxBytes]);
            Assert.AreEqual(IgiImage.MaxBytes + 5, big.Length);
            CollectionAssert.AreEqual(new byte[] { 0xc6, 0x01, 0x00, 0x00, 0x00 }, big.Take(5));
        }

        [Test]
        [Timeout(10000)]
        public void ImagesOutsideTheLimitsAreRefusedBeforeSending()
        {
            Start();
            var ok = IgiImage.FromPixels(new byte[12], 2, 2, 3);
            var refused = new Dictionary<string, IgiImage[]>
            {
                { "5 images", new[] { ok, ok, ok, ok, ok } },
                { "a null image", new IgiImage[] { null } },
                { "short pixels", new[] { IgiImage.FromPixels(new byte[11], 2, 2, 3) } },
                { "long pixels", new[] { IgiImage.FromPixels(new byte[16], 2, 2, 3) } },
                { "RGBA counted as RGB", new[] { IgiImage.FromRgba32(new byte[12], 2, 2) } },
                { "2 channels", new[] { IgiImage.FromPixels(new byte[8], 2, 2, 2) } },
                { "zero width", new[] { IgiImage.FromPixels(new byte[12], 0, 4, 3) } },
                { "negative height", new[] { IgiImage.FromPixels(new byte[12], 4, -1, 3) } },
                { "a side over 8192", new[] { IgiImage.FromPixels(new byte[8193 * 3], 8193, 1, 3) } },
                { "empty pixels", new[] { IgiImage.FromPixels(new byte[0], 0, 0, 3) } },
                { "null pixels", new[] { IgiImage.FromPixels(null, 2, 2, 3) } },
                { "empty data", new[] { IgiImage.FromEncoded(new byte[0]) } },
                { "null data", new[] { IgiImage.FromEncoded(null) } },
                { "data over 16 MiB", new[] { IgiImage.FromEncoded(new byte[IgiImage.MaxBytes + 1]) } },
            };
            foreach (var entry in refused)
            {
                var error = Pumping.Fails(client, client.Chat("s", "Look!", With(entry.Value)), IgiError.InvalidBody, 5);
                StringAssert.StartsWith("images", error.Message, entry.Key);
                Assert.IsFalse(error.Retryable, entry.Key);
            }
            // four images of the limits' edges are fine; a 16 MiB image fits the 17 MiB message
            var edges = client.Chat("s", "Look!", With(ok, IgiImage.FromPixels(new byte[8192 * 3], 8192, 1, 3),
                IgiImage.FromPixels(new byte[3], 1, 1, 3), IgiImage.FromEncoded(new byte[IgiImage.MaxBytes])));
            Assert.AreEqual(4, ((List<object>)SentBody(edges)["images"]).Count);
            Assert.AreEqual(1, fake.SentOf("chat").Count, "only the chat within the limits was sent");
            // an empty array is a chat without images
            Assert.IsFalse(SentBody(client.Chat("s", "Look!", With())).ContainsKey("images"));
        }

        [Test]
        [Timeout(10000)]
        public void ASidecarWithoutTheImagesFeatureGetsNothing()
        {
            Start(offerImages: false);
            Assert.IsFalse(client.Server.HasFeature(IgiFeatures.Images));
            var image = IgiImage.FromEncoded(TestImages.Png(TestImages.Card(0, 4, 4), 4, 4));
            var error = Pumping.Fails(client, client.Chat("s", "Look!", With(image)), IgiError.Unsupported, 5);
            StringAssert.Contains("'images'", error.Message);
            Assert.IsFalse(error.Retryable);
            Pumping.Fails(client, client.LoadModel("vlm.gguf", null, null, null, "mmproj.gguf"), IgiError.Unsupported, 5);
            // the rest still goes out: a chat without images, a load without a projector
            var plain = client.Chat("s", "Hello");
            SentBody(plain);
            Assert.AreEqual(1, fake.SentOf("chat").Count);
            Assert.IsFalse(((Dictionary<string, object>)fake.SentOf("chat")[0]["body"]).ContainsKey("images"));
            Assert.AreEqual(0, fake.SentOf("load_model").Count);
        }

        [Test]
        public void FlipRowsReversesTheRowOrderOnly()
        {
            byte[] pixels = Enumerable.Range(0, 3 * 2 * 3).Select(i => (byte)i).ToArray(); // 2 wide, 3 high, RGB
            byte[] flipped = IgiImage.FlipRows(pixels, 2, 3, 3);
            CollectionAssert.AreEqual(new byte[] { 12, 13, 14, 15, 16, 17, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5 }, flipped);
            CollectionAssert.AreEqual(pixels, IgiImage.FlipRows(flipped, 2, 3, 3));
            Assert.Throws<ArgumentException>(() => IgiImage.FlipRows(new byte[17], 2, 3, 3));
        }
    }
}
