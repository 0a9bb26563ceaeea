// What a game lives through: the sidecar crashing mid-reply and coming back, play-mode restarts
// that dispose the client without closing anything, and a 60 FPS loop that must never stall.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Sidecar")]
    public class RecoveryTests
    {
        readonly List<IDisposable> owned = new List<IDisposable>();

        T Own<T>(T thing) where T : IDisposable
        {
            owned.Add(thing);
            return thing;
        }

        [TearDown]
        public void DisposeAll()
        {
            for (int i = owned.Count - 1; i >= 0; i--) owned[i].Dispose();
            owned.Clear();
        }

        [Test]
        [Timeout(120000)]
        public void KilledMidStreamThenRestartedSidecarRecoversTheSessionFromItsSave()
        {
            var sidecar = Own(Sidecar.Start());
            var client = Own(Pumping.Connect(sidecar.Endpoint));
            var states = new List<IgiConnectionState>();
            client.ConnectionChanged += states.Add;
            string session = Pumping.Ok(client, client.OpenSession(new SessionOptions { Persona = "Brom", Sampling = Pumping.Greedy })).Session;
            Pumping.Ok(client, client.Chat(session, "Remember: the password is swordfish.", new ChatOptions { MaxTokens = 8 }), 60);
            Pumping.Ok(client, client.SaveSession(session, "brom-kill"));

            bool killed = false;
            var stream = client.Chat(session, "Tell me a very long story.", new ChatOptions { MaxTokens = 2000 })
                .OnToken(piece =>
                {
                    if (killed) return;
                    killed = true;
                    sidecar.Kill(); // a crash: no goodbye, no terminal event
                });
            Pumping.Until(client, () => stream.IsDone, 30, "the stream's end after the kill");
            Assert.IsTrue(killed);
            Assert.IsFalse(stream.Succeeded);
            StringAssert.IsMatch("^(unavailable|stream_lost)$", stream.Error.Code, stream.Error.ToString());
            Assert.IsTrue(stream.Error.Retryable);

            // a request made while the sidecar is gone fails as unavailable, without blocking
            var whileDown = client.Ping();
            Pumping.Until(client, () => whileDown.IsDone, 30, "ping while the sidecar is down");
            Assert.AreEqual(IgiError.Unavailable, whileDown.Error.Code);

            sidecar.Launch(); // same port, same save directory: a new process
            Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 30, "the client to reconnect");
            Pumping.Fails(client, client.Chat(session, "Still there?"), "unknown_session"); // the old session died with it
            string restored = Pumping.Ok(client, client.RestoreSession("brom-kill")).Session;
            var reply = Pumping.Ok(client, client.Chat(restored, "What is the password?", new ChatOptions { MaxTokens = 16 }), 60);
            Assert.IsNotEmpty(reply.Text);
            CollectionAssert.Contains(states, IgiConnectionState.Unavailable);
            Assert.AreEqual(IgiConnectionState.Ready, states.Last());
        }

        [Test]
        [Timeout(120000)]
        public void ThreePlayModeRestartsLeakNoSessions()
        {
            // 8 slots: three leaked sets of 3 would not fit, so a fourth client proves nothing leaked
            var sidecar = Own(Sidecar.Start("--max-sessions 8"));
            for (int restart = 0; restart < 3; restart++)
            {
                var client = Pumping.Connect(sidecar.Endpoint);
                for (int i = 0; i < 3; i++)
                    Pumping.Ok(client, client.OpenSession(new SessionOptions { Persona = "npc" + i }));
                client.Dispose(); // leaving play mode: nothing closed by the game
                Assert.AreEqual(IgiConnectionState.Closed, client.State);
            }
            var fourth = Own(Pumping.Connect(sidecar.Endpoint));
            var listed = Pumping.Ok(fourth, fourth.ListSessions());
            Assert.AreEqual(0, MsgValue.GetList(listed.Result, "sessions").Count, "no orphans left behind");
            Assert.AreEqual(0, MsgValue.GetLong(listed.Result, "others", -1), "no sessions held by the old clients");
            Assert.AreEqual(8, MsgValue.GetLong(listed.Result, "free_slots"));
            var opened = Enumerable.Range(0, 8).Select(i => fourth.OpenSession(new SessionOptions { Persona = "npc" + i })).ToList();
            foreach (var open in opened) Pumping.Ok(fourth, open);
        }

        [Test]
        [Timeout(120000)]
        public void PlayModeRestartKeepingSessionsAdoptsThemByName()
        {
            var sidecar = Sidecar.Shared;
            string name = "npc.keep." + Guid.NewGuid().ToString("N").Substring(0, 6);
            string owner = IgiKeys.New(); // the game's, kept across play modes (IgiSidecar does this)
            var first = Pumping.Connect(sidecar.Endpoint, o => { o.KeepSessionsOnDispose = true; o.OwnerKey = owner; });
            Pumping.Ok(first, first.OpenSession(new SessionOptions { Name = name, Sampling = Pumping.Greedy }));
            Pumping.Ok(first, first.Chat(name, "My horse is called Pepper.", new ChatOptions { MaxTokens = 8 }), 60);
            first.Dispose();

            var second = Own(Pumping.Connect(sidecar.Endpoint, o => o.OwnerKey = owner));
            Pumping.Fails(second, second.OpenSession(new SessionOptions { Name = name }), "session_exists");
            Pumping.Ok(second, second.AdoptSession(name));
            Pumping.Ok(second, second.Chat(name, "What is my horse called?", new ChatOptions { MaxTokens = 8 }), 60);
            Pumping.Ok(second, second.CloseSession(name));
        }

        [Test]
        [Timeout(60000)]
        public void OrphanedSessionsGiveWayToALiveClient()
        {
            var sidecar = Own(Sidecar.Start("--max-sessions 2"));
            string owner = IgiKeys.New();
            var first = Pumping.Connect(sidecar.Endpoint, o => o.OwnerKey = owner);
            Pumping.Ok(first, first.OpenSession(new SessionOptions { Name = "npc.old" }));
            Pumping.Ok(first, first.OpenSession(new SessionOptions { Name = "npc.older" }));
            Assert.AreEqual(2, Pumping.Ok(first, first.Goodbye(true)).GetLong("orphaned"));
            first.Dispose();

            var second = Own(Pumping.Connect(sidecar.Endpoint, o => o.OwnerKey = owner));
            // every slot is held by an orphan: a live client's open takes the oldest one's
            Pumping.Ok(second, second.OpenSession(new SessionOptions { Persona = "new" }));
            var listed = Pumping.Ok(second, second.ListSessions());
            var orphans = MsgValue.GetList(listed.Result, "sessions").Cast<Dictionary<string, object>>()
                .Where(x => MsgValue.GetString(x, "owner") == "orphaned").Select(x => MsgValue.GetString(x, "session")).ToList();
            CollectionAssert.AreEqual(new[] { "npc.older" }, orphans, "the oldest orphan gave way");
            Pumping.Ok(second, second.AdoptSession("npc.older"));
            var full = Pumping.Fails(second, second.OpenSession(), "too_many_sessions");
            Assert.IsTrue(full.Retryable, "live clients hold every slot");
        }

        [Test]
        [Timeout(90000)]
        public void SixtyFpsLoopNeverStallsWhileAChatStreams()
        {
            var client = Own(Pumping.Connect(Sidecar.Shared.Endpoint));
            // the baseline, in the same frames: a second client of the same sidecar with nothing
            // streaming, given the same calls. A shared machine's hiccups (other processes on
            // the cores, the sidecar decoding beside us) land on both alike; what streaming
            // itself costs the game's thread lands on the first only.
            var control = Own(Pumping.Connect(Sidecar.Shared.Endpoint));
            string session = Pumping.Ok(client, client.OpenSession(new SessionOptions { Persona = "Brom" })).Session;
            // warm-up: the first calls compile the code paths (IL2CPP builds compile ahead of time)
            Pumping.Ok(client, client.Chat(session, "Hi.", new ChatOptions { MaxTokens = 4 }), 60);
            Pumping.Ok(client, client.Frame(0, 16.6));
            Pumping.Ok(control, control.Frame(0, 16.6));
            // start from a collected heap, as a game does after loading a level: a collection
            // owed to garbage from earlier tests is not this loop's stall
            GC.Collect();
            GC.WaitForPendingFinalizers();

            const double frameMs = 1000.0 / 60;
            int tokens = 0;
            var stream = client.Chat(session, "Tell me a long story about your forge.", new ChatOptions { MaxTokens = 300 })
                .OnToken(piece => tokens++);
            var frameClock = Stopwatch.StartNew();
            var streaming = new List<double>();
            var idle = new List<double>();
            var slow = new List<string>();
            int frames = 0, preempted = 0;
            double wallMax = 0;
            while (!stream.IsDone && frameClock.Elapsed.TotalSeconds < 40)
            {
                frames++;
                // alternate which client goes first: neither is always the one after a switch
                double wallMs, waitedMs, ownIdle;
                if ((frames & 1) == 0)
                {
                    streaming.Add(OneFrame(client, frames, out wallMs, out waitedMs));
                    idle.Add(ownIdle = OneFrame(control, frames, out _, out _));
                }
                else
                {
                    idle.Add(ownIdle = OneFrame(control, frames, out _, out _));
                    streaming.Add(OneFrame(client, frames, out wallMs, out waitedMs));
                }
                double ownMs = streaming[streaming.Count - 1];
                if (ownMs < wallMs - 0.05) preempted++;
                wallMax = Math.Max(wallMax, wallMs);
                if (wallMs > 0.5)
                    slow.Add(string.Format("frame {0}: {1:F3} ms wall, {2:F3} ms waiting for a core; the idle client {3:F3} ms",
                        frames, wallMs, waitedMs, ownIdle));
                // the rest of the frame is the game's (rendering); wait for the next tick
                double next = frames * frameMs - frameClock.Elapsed.TotalMilliseconds;
                if (next > 0) Thread.Sleep((int)Math.Ceiling(next));
            }
            // a loaded machine decodes slower (the sidecar runs niced, behind the game): the
            // frames measured are those of the first 40 s, and a reply still running is cut there
            bool cut = !stream.IsDone;
            if (cut) client.Cancel(stream);
            Pumping.Ok(client, stream, 60);
            Assert.Greater(tokens, 20, "tokens streamed through the measured frames");
            double p99 = Percentile(streaming, 0.99), idleP99 = Percentile(idle, 0.99);
            double median = Percentile(streaming, 0.5), idleMedian = Percentile(idle, 0.5);
            Console.WriteLine("measured: Pump()+Frame() while a chat streams: median {0:F3} ms, p99 {1:F3} ms, max {2:F3} ms " +
                "(without time preempted by other processes; {3:F3} ms wall, {4} frames preempted); the idle client in the same " +
                "frames: median {5:F3} ms, p99 {6:F3} ms; {7} frames, {8} tokens{9}",
                median, p99, streaming.Max(), wallMax, preempted, idleMedian, idleP99, frames, tokens, cut ? " (the reply cut at 40 s)" : "");
            foreach (var line in slow) Console.WriteLine("measured: slow " + line);
            // relative to the idle client of the same frames, never to a fixed figure: a client
            // that stalls on tokens is slow on every token (hundreds of frames here) and moves
            // its p99 far past the idle one's; the 1% above p99 is left to the machine (a page
            // fault, a late core), and 0.5 ms of slack keeps sub-millisecond noise from counting
            double bound = 3 * idleP99 + 0.5;
            Assert.LessOrEqual(p99, bound, "p99 of Pump()+Frame() while streaming (" + p99.ToString("F3") +
                " ms) against 3x the idle client's p99 in the same frames (" + idleP99.ToString("F3") + " ms) + 0.5 ms");
            Assert.LessOrEqual(median, 3 * idleMedian + 0.25, "the typical frame, likewise");
        }

        // one frame of the game's calls on one client: its own time in ms (the wall time less
        // the time this thread sat on the run queue while other processes had the cores)
        static double OneFrame(IgiClient c, int frame, out double wallMs, out double waitedMs)
        {
            long waitBefore = RunQueueWaitNs();
            var work = Stopwatch.StartNew();
            c.Pump();
            c.Frame(frame, 1000.0 / 60);
            work.Stop();
            long waitedNs = RunQueueWaitNs() - waitBefore;
            wallMs = work.Elapsed.TotalMilliseconds;
            waitedMs = waitBefore < 0 ? 0 : Math.Max(0, waitedNs) / 1e6;
            return wallMs - Math.Min(wallMs, waitedMs);
        }

        static double Percentile(List<double> values, double p)
        {
            var sorted = values.OrderBy(v => v).ToList();
            int at = (int)Math.Ceiling(p * sorted.Count) - 1;
            return sorted[Math.Max(0, Math.Min(sorted.Count - 1, at))];
        }

        /// <summary>Nanoseconds this thread has spent runnable but waiting for a CPU (Linux
        /// /proc/thread-self/schedstat, 2nd field); -1 where the kernel does not say.</summary>
        static long RunQueueWaitNs()
        {
            try
            {
                string[] fields = System.IO.File.ReadAllText("/proc/thread-self/schedstat").Split(' ');
                return long.Parse(fields[1]);
            }
            catch (Exception)
            {
                return -1;
            }
        }
    }
}
