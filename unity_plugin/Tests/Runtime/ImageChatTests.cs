// Chat lines with images against the real sidecar: a tiny synthetic Qwen2.5-VL pair (random
// weights, made by the igi-sdk Python package beside IGI_SDK_EXE) served with --mmproj, and the
// shared text-only sidecar for vision_unavailable. Replies are greedy, so one picture gives one
// reply however it is sent (PNG, RGB, RGBA bottom to top).
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Sidecar")]
    public class ImageChatTests : ClientFixture
    {
        const int W = 64, H = 64;
        const string Line = "What do you think of this sword?";
        const string VlmModel = "tiny-qwen2.5-vl.gguf";
        const string VlmProjector = "mmproj-tiny-qwen2.5-vl.gguf";

        static Sidecar vision;
        static readonly object VisionLock = new object();

        /// <summary>The VLM's sidecar, started on first use and shared by these tests (as
        /// <see cref="Sidecar.Shared"/> is: NUnit 2.6 and 3 agree on no fixture set-up attribute).</summary>
        static Sidecar Vision
        {
            get
            {
                lock (VisionLock)
                {
                    if (vision == null || !vision.IsRunning)
                    {
                        string modelDir = WriteSyntheticVlm();
                        vision = Sidecar.Start("--model-dir \"" + modelDir + "\" --model " + VlmModel + " --mmproj " + VlmProjector);
                        var started = vision;
                        EventHandler stop = delegate
                        {
                            started.Dispose();
                            try { Directory.Delete(modelDir, true); } catch (IOException) { }
                        };
                        AppDomain.CurrentDomain.DomainUnload += stop;
                        AppDomain.CurrentDomain.ProcessExit += stop;
                    }
                    return vision;
                }
            }
        }

        static string WriteSyntheticVlm()
        {
            string exe = Sidecar.Exe;
            string python = Environment.GetEnvironmentVariable("IGI_SDK_PYTHON");
            if (string.IsNullOrEmpty(python)) python = Path.Combine(Path.GetDirectoryName(exe), "python");
            if (!File.Exists(python)) Assert.Ignore("no Python beside " + exe + " to write the synthetic VLM (set IGI_SDK_PYTHON)");
            string dir = Path.Combine(Path.GetTempPath(), "igi-cs-vlm-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            var info = new ProcessStartInfo(python, "-c \"import sys; from igi_sdk.model.synthetic_vlm import " +
                "write_synthetic_vlm; write_synthetic_vlm(sys.argv[1], 'tiny')\" \"" + dir + "\"")
            {
                UseShellExecute = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
                CreateNoWindow = true,
            };
            using (var writer = Process.Start(info))
            {
                string errors = writer.StandardError.ReadToEnd();
                writer.WaitForExit(60000);
                Assert.AreEqual(0, writer.ExitCode, "writing the synthetic VLM failed:\n" + errors);
            }
            return dir;
        }

        IgiClient Connect(Sidecar sidecar)
        {
            return Connect(sidecar.Endpoint);
        }

        static string Open(IgiClient client)
        {
            var options = new SessionOptions { SystemPrompt = "You are Brom, the blacksmith. Describe what the player shows you.", Sampling = Pumping.Greedy };
            return Pumping.Ok(client, client.OpenSession(options)).Session;
        }

        static IgiStream Say(IgiClient client, string session, string text, params IgiImage[] images)
        {
            return client.Chat(session, text, new ChatOptions { MaxTokens = 8, Images = images.Length > 0 ? images : null });
        }

        /// <summary>The reply to <see cref="Line"/> in a new session (greedy: the same for the same picture).</summary>
        static IgiStream FirstReply(IgiClient client, params IgiImage[] images)
        {
            string session = Open(client);
            var stream = Pumping.Ok(client, Say(client, session, Line, images), 30);
            Pumping.Ok(client, client.CloseSession(session));
            return stream;
        }

        static long PromptTokens(IgiStream stream)
        {
            return MsgValue.GetLong(MsgValue.GetMap(stream.Result, "usage"), "prompt_tokens");
        }

        [Test]
        [Timeout(60000)]
        public void OnePictureGivesOneReplyAsPngRgbOrUnityRgba()
        {
            var client = Connect(Vision);
            Assert.IsTrue(client.Server.HasFeature(IgiFeatures.Images));
            byte[] rgb = TestImages.Card(0, W, H);
            var png = FirstReply(client, IgiImage.FromEncoded(TestImages.Png(rgb, W, H)));
            Assert.IsNotEmpty(png.Text);
            var textOnly = FirstReply(client);
            // the 64x64 picture is 9 tokens of the encoder's grid, plus its two delimiters
            Assert.AreEqual(PromptTokens(textOnly) + 9 + 2, PromptTokens(png), "the image is in the prompt");

            var raw = FirstReply(client, IgiImage.FromPixels(rgb, W, H, 3));
            Assert.AreEqual(png.Text, raw.Text, "raw RGB pixels are the same picture as its PNG");
            // Unity's order: RGBA, rows bottom to top; the client flips them
            byte[] unityRows = IgiImage.FlipRows(TestImages.WithAlpha(rgb), W, H, 4);
            var rgba = FirstReply(client, IgiImage.FromRgba32(unityRows, W, H));
            Assert.AreEqual(png.Text, rgba.Text, "RGBA bottom to top, flipped, is the same picture");

            // the model sees the picture: upside down (rows not flipped) or another card differ
            var upsideDown = FirstReply(client, IgiImage.FromPixels(unityRows, W, H, 4));
            Assert.AreNotEqual(png.Text, upsideDown.Text, "an upside-down picture");
            var other = FirstReply(client, IgiImage.FromPixels(TestImages.Card(1, W, H), W, H, 3));
            Assert.AreNotEqual(png.Text, other.Text, "another picture");
        }

        [Test]
        [Timeout(60000)]
        public void ACorruptPngIsInvalidImageAndTheSessionIsUnchanged()
        {
            var client = Connect(Vision);
            byte[] rgb = TestImages.Card(2, W, H);
            var expected = FirstReply(client, IgiImage.FromPixels(rgb, W, H, 3));

            string session = Open(client);
            byte[] png = TestImages.Png(rgb, W, H);
            var cut = new byte[60];
            Buffer.BlockCopy(png, 0, cut, 0, cut.Length);
            var error = Pumping.Fails(client, Say(client, session, Line, IgiImage.FromEncoded(cut)), IgiError.InvalidImage);
            Assert.IsFalse(error.Retryable);
            var notAnImage = IgiImage.FromEncoded(System.Text.Encoding.ASCII.GetBytes("GIF89a, not a PNG or JPEG"));
            Pumping.Fails(client, Say(client, session, Line, notAnImage), IgiError.InvalidImage);
            // two media markers for one image
            Pumping.Fails(client, Say(client, session, "<__media__> and <__media__>?", IgiImage.FromPixels(rgb, W, H, 3)), IgiError.InvalidImage);

            // nothing of the refused lines entered the conversation: it replies as a new one
            var after = Pumping.Ok(client, Say(client, session, Line, IgiImage.FromPixels(rgb, W, H, 3)), 30);
            Assert.AreEqual(expected.Text, after.Text);
            Assert.AreEqual(PromptTokens(expected), PromptTokens(after));
        }

        [Test]
        [Timeout(60000)]
        public void ImagesForATextOnlyModelAreVisionUnavailable()
        {
            var client = Connect(Sidecar.Shared); // the default model, served without --mmproj
            Assert.IsTrue(client.Server.HasFeature(IgiFeatures.Images), "the protocol feature is the sidecar's, not the model's");
            string session = Open(client);
            var image = IgiImage.FromEncoded(TestImages.Png(TestImages.Card(0, 16, 16), 16, 16));
            var error = Pumping.Fails(client, Say(client, session, Line, image), IgiError.VisionUnavailable);
            Assert.IsFalse(error.Retryable);
            var reply = Pumping.Ok(client, Say(client, session, "Hello!"), 30);
            Assert.Greater(reply.LastTokenIndex, 0, "the session goes on");
        }
    }
}
