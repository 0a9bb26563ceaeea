// Against the real sidecar: the I/O thread sleeps while nothing happens (no 2 ms polling) yet
// answers a request at once (the game's queue wakes it), with both transports; a frame report
// leaves (almost) no garbage on the game's thread; a request the sidecar could not read fails
// at once instead of timing out.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Client")]
    public class IdleAndGarbageTests
    {
        IgiClient client;

        [TearDown]
        public void CleanUp()
        {
            if (client != null) client.Dispose();
            client = null;
        }

        // I/O loop turns per idle second, and the median ping round trip from idle (ms)
        static void MeasureIdle(IgiClient c, string transport, out double turnsPerSecond, out double medianPingMs)
        {
            Pumping.Ok(c, c.Ping());
            Thread.Sleep(300);
            long before = c.IoTurns;
            var clock = Stopwatch.StartNew();
            Thread.Sleep(1500);
            turnsPerSecond = (c.IoTurns - before) / clock.Elapsed.TotalSeconds;
            var trips = new List<double>();
            for (int i = 0; i < 7; i++)
            {
                Thread.Sleep(120); // idle again: the I/O thread is asleep on the socket
                var trip = Stopwatch.StartNew();
                var ping = c.Ping();
                Pumping.Until(c, () => ping.IsDone, 10, "ping");
                trips.Add(trip.Elapsed.TotalMilliseconds);
            }
            trips.Sort();
            medianPingMs = trips[trips.Count / 2];
            Console.WriteLine("measured: " + transport + " I/O thread idle: " + turnsPerSecond.ToString("0.0") +
                " wakes/s (was ~500 with a 2 ms poll); ping from idle, median " + medianPingMs.ToString("0.0") + " ms");
        }

        [Test]
        [Timeout(30000)]
        public void TheIoThreadSleepsWhenIdleAndWakesForARequest()
        {
            client = Pumping.Connect(Sidecar.Shared.Endpoint);
            double turns, pingMs;
            MeasureIdle(client, "managed ZMTP", out turns, out pingMs);
            Assert.Less(turns, 25, "idle wakes per second (the idle wait is 200 ms; pings and heartbeats add a few)");
            // woken by the queue, not by the end of its 200 ms wait
            Assert.Less(pingMs, 100, "a ping from idle is answered without waiting out the idle wait");
        }

        [Test]
        [Timeout(30000)]
        [Category("Native")]
        public void TheNativeTransportSleepsWhenIdleAndWakesForARequest()
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
            client = Pumping.Connect(Sidecar.Shared.Endpoint, o => o.TransportFactory = () => new ZmqNativeTransport());
            double turns, pingMs;
            MeasureIdle(client, "libzmq", out turns, out pingMs);
            Assert.Less(turns, 25, "idle wakes per second: zmq_poll, no Sleep(1) loop");
            Assert.Less(pingMs, 100, "a ping from idle is answered without waiting out the idle wait");
        }

        [Test]
        [Timeout(60000)]
        public void AFrameReportLeavesAtMost256BytesOfGarbageOnTheGamesThread()
        {
            client = Pumping.Connect(Sidecar.Shared.Endpoint);
            const int frames = 2000;
            // warm up: JIT, first-use allocations
            for (int i = 0; i < 200; i++) { client.ReportFrame(i, 16.6, 16.6, 1L << 30, 8L << 30); client.Pump(); }
            Thread.Sleep(100);
            long before = GC.GetAllocatedBytesForCurrentThread();
            for (int i = 0; i < frames; i++)
            {
                client.ReportFrame(1000 + i, 16.6, 16.6, 1L << 30, 8L << 30);
                client.Pump();
            }
            double perFrame = (GC.GetAllocatedBytesForCurrentThread() - before) / (double)frames;
            // the request API for comparison (a handle per call, its answer delivered back)
            long beforeRequests = GC.GetAllocatedBytesForCurrentThread();
            var last = default(IgiRequest);
            for (int i = 0; i < 200; i++) { last = client.Frame(5000 + i, 16.6, 16.6, 1L << 30, 8L << 30); client.Pump(); }
            double perRequest = (GC.GetAllocatedBytesForCurrentThread() - beforeRequests) / 200.0;
            Pumping.Until(client, () => last.IsDone, 10, "the last frame request");
            Console.WriteLine("measured: garbage on the game's thread per frame report: ReportFrame + Pump " + perFrame.ToString("0.0") +
                " B, Frame (request handle) + Pump " + perRequest.ToString("0") + " B");
            Assert.LessOrEqual(perFrame, 256.0, "bytes allocated per ReportFrame + Pump");
            Assert.IsNull(client.FrameError, "the sidecar took the frame reports (this client is the game)");
            // the reports reached the sidecar: its stats show the latest frame
            var stats = Pumping.Ok(client, client.Stats());
            Assert.IsTrue(stats.Succeeded);
        }

        [Test]
        [Timeout(30000)]
        public void AStringTheSidecarCannotReadFailsAtOnceNotAfterATimeout()
        {
            client = Pumping.Connect(Sidecar.Shared.Endpoint, o => o.RequestTimeoutSeconds = 30);
            string session = Pumping.Ok(client, client.OpenSession(new SessionOptions { Persona = "Brom" })).Session;
            var clock = Stopwatch.StartNew();
            var request = client.SaveSession(session, new string('n', Protocol.MaxStrBytes + 10));
            var error = Pumping.Fails(client, request, IgiError.InvalidBody, 5);
            StringAssert.Contains("UTF-8 bytes", error.Message);
            // the code and message are the client's own (the sidecar would have answered malformed
            // with id 0); the time only has to be far from the request timeout it would have waited out
            Assert.Less(clock.Elapsed.TotalSeconds, client.Options.RequestTimeoutSeconds / 3, "refused before sending, not timed out");
            Pumping.Ok(client, client.CloseSession(session));
        }
    }
}
