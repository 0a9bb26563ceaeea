// The libzmq transport (P/Invoke) against the real sidecar: TCP, ipc:// and CurveZMQ.
using System;
using System.Diagnostics;
using System.IO;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Native")]
    public class NativeTransportTests
    {
        IgiClient client;
        Sidecar own;
        string ipcPath;

        [TearDown]
        public void CleanUp()
        {
            if (client != null) client.Dispose();
            if (own != null) own.Dispose();
            client = null;
            own = null;
            if (ipcPath != null) File.Delete(ipcPath); // a killed sidecar leaves its socket file
            ipcPath = null;
        }

        static void RequireLibzmq()
        {
            try
            {
                using (var probe = new ZmqNativeTransport()) probe.Connect("tcp://127.0.0.1:9", null, 100);
            }
            catch (IgiTransportException e)
            {
                if (e.InnerException is DllNotFoundException) Assert.Ignore("libzmq is not installed: " + e.Message);
                throw;
            }
        }

        void ChatThrough(string endpoint, IgiCurveKeys curve = null)
        {
            client = Pumping.Connect(endpoint, o => o.TransportFactory = () => new ZmqNativeTransport(curve));
            string session = Pumping.Ok(client, client.OpenSession(new SessionOptions { Persona = "Brom" })).Session;
            var stream = Pumping.Ok(client, client.Chat(session, "Hello!", new ChatOptions { MaxTokens = 8 }), 60);
            Assert.IsNotEmpty(stream.Text);
            Assert.LessOrEqual(stream.LastTokenIndex, MsgValue.GetLong(MsgValue.GetMap(stream.Result, "usage"), "completion_tokens"));
        }

        [Test]
        [Timeout(60000)]
        public void ChatsOverTcp()
        {
            RequireLibzmq();
            ChatThrough(Sidecar.Shared.Endpoint);
        }

        [Test]
        [Timeout(60000)]
        public void ChatsOverIpc()
        {
            RequireLibzmq();
            ipcPath = Path.Combine(Path.GetTempPath(), "igi-cs-" + Guid.NewGuid().ToString("N").Substring(0, 8) + ".sock");
            own = Sidecar.Start("", "ipc://" + ipcPath);
            ChatThrough(own.Endpoint);
        }

        [Test]
        [Timeout(90000)]
        public void ChatsOverCurveAndRefusesClientsWithoutKeys()
        {
            RequireLibzmq();
            string keys = Path.Combine(Path.GetTempPath(), "igi-cs-keys-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            var make = Process.Start(new ProcessStartInfo(Sidecar.Exe, "keys \"" + keys + "\"")
            {
                UseShellExecute = false, RedirectStandardOutput = true, RedirectStandardError = true,
            });
            make.StandardOutput.ReadToEnd();
            make.WaitForExit();
            Assert.AreEqual(0, make.ExitCode, make.StandardError.ReadToEnd());
            try
            {
                own = Sidecar.Start("--curve-secret \"" + Path.Combine(keys, "server.key_secret") + "\" --curve-clients \"" +
                    Path.Combine(keys, "clients") + "\"");
                var curve = IgiCurveKeys.FromCertificateFiles(Path.Combine(keys, "game.key_secret"), Path.Combine(keys, "server.key"));
                Assert.AreEqual(40, curve.ClientSecretKey.Length);
                ChatThrough(own.Endpoint, curve);
                client.Dispose();

                // the managed transport speaks only NULL security: it is told why it cannot connect
                client = new IgiClient(new IgiClientOptions { Endpoint = own.Endpoint, SidecarSilenceSeconds = 1 });
                var refused = Pumping.Fails(client, client.Ping(), IgiError.Unavailable, 10);
                StringAssert.Contains("handshake", refused.Message);
            }
            finally
            {
                try { Directory.Delete(keys, true); } catch (IOException) { }
            }
        }
    }
}
