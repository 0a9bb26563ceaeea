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
        [Timeout(60000)]
        public void SixtyFpsLoopNeverStallsWhileAChatStreams()
        {
            var client = Own(Pumping.Connect(Sidecar.Shared.Endpoint));
            string session = Pumping.Ok(client, client.OpenSession(new SessionOptions { Persona = "Brom" })).Session;
            // warm-up: the first calls compile the code paths (IL2CPP builds compile ahead of time)
            Pumping.Ok(client, client.Chat(session, "Hi.", new ChatOptions { MaxTokens = 4 }), 60);
            Pumping.Ok(client, client.Frame(0, 16.6));
            // start from a collected heap, as a game does after loading a level: a collection
            // owed to garbage from earlier tests is not this loop's stall
            GC.Collect();
            GC.WaitForPendingFinalizers();

            const double frameMs = 1000.0 / 60;
            var work = new Stopwatch();
            // the baseline, in this run: the same calls with nothing streaming (a shared CI
            // machine's own hiccups show in both)
            double idleOwnMaxMs = 0;
            for (int i = 0; i < 60; i++)
            {
                long idleWaitBefore = RunQueueWaitNs();
                work.Restart();
                client.Pump();
                client.Frame(i + 1, frameMs);
                work.Stop();
                double idleMs = work.Elapsed.TotalMilliseconds;
                long idleWaitedNs = RunQueueWaitNs() - idleWaitBefore;
                idleOwnMaxMs = Math.Max(idleOwnMaxMs, idleMs - Math.Min(idleMs, Math.Max(0, idleWaitedNs) / 1e6));
                Thread.Sleep((int)frameMs);
            }

            int tokens = 0;
            var stream = client.Chat(session, "Tell me a long story about your forge.", new ChatOptions { MaxTokens = 300 })
                .OnToken(piece => tokens++);
            var frameClock = Stopwatch.StartNew();
            double maxMs = 0, maxOwnMs = 0, totalMs = 0;
            int frames = 60, preempted = 0;
            var slow = new List<string>();
            var ownTimes = new List<double>();
            while (!stream.IsDone && frameClock.Elapsed.TotalSeconds < 40)
            {
                int gcBefore = GC.CollectionCount(0);
                long waitBefore = RunQueueWaitNs();
                work.Restart();
                client.Pump();
                client.Frame(frames + 1, frameMs);
                work.Stop();
                long waitedNs = RunQueueWaitNs() - waitBefore;
                double ms = work.Elapsed.TotalMilliseconds;
                // time this thread sat ready on the run queue while other processes had the
                // cores is the machine's doing, not a stall of the client
                double ownMs = ms - Math.Min(ms, Math.Max(0, waitedNs) / 1e6);
                if (ms > 0.5)
                {
                    slow.Add(string.Format("frame {0}: {1:F3} ms wall, {2:F3} ms waiting for a core, gc {3}",
                        frames, ms, waitedNs / 1e6, GC.CollectionCount(0) - gcBefore));
                }
                if (ownMs < ms - 0.05) preempted++;
                ownTimes.Add(ownMs);  // the wall time where the kernel does not say
                maxMs = Math.Max(maxMs, ms);
                maxOwnMs = Math.Max(maxOwnMs, ownMs);
                totalMs += ms;
                frames++;
                // the rest of the frame is the game's (rendering); wait for the next tick
                double next = (frames - 60) * frameMs - frameClock.Elapsed.TotalMilliseconds;
                if (next > 0) Thread.Sleep((int)Math.Ceiling(next));
            }
            Assert.IsTrue(stream.Succeeded, stream.ToString());
            Assert.Greater(tokens, 20);
            int streamed = frames - 60;
            Console.WriteLine("measured: max frame stall {0:F3} ms wall ({1:F3} ms without time preempted by other processes, " +
                "{2} frames preempted), mean {3:F4} ms over {4} frames ({5} tokens); idle baseline {6:F3} ms",
                maxMs, maxOwnMs, preempted, totalMs / streamed, streamed, tokens, idleOwnMaxMs);
            foreach (var line in slow) Console.WriteLine("measured: slow " + line);
            // a millisecond of a 16.7 ms frame, or three times what the same calls cost with
            // nothing streaming in this run, whichever is more. Counted, not the one worst frame:
            // a client that stalls on tokens is slow on every token (hundreds of frames here),
            // while a shared 2-core machine gives a lone frame a page fault or a late core
            // (one frame of 2.4 ms against a 1 ms bound failed a run that was otherwise clean)
            double bound = Math.Max(1.0, 3 * idleOwnMaxMs);
            int over = ownTimes.Count(t => t >= bound);
            Assert.LessOrEqual(over, Math.Max(2, streamed / 100),
                over + " of " + streamed + " frames took Pump()+Frame() " + bound + " ms or more of their own (the most: " + maxOwnMs + " ms)");
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
