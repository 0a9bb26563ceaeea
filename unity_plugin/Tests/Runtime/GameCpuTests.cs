// The game's CPU use in frame reports, against a real sidecar of its own (the report stays with
// the sidecar, so the shared one is left as it was): a report of busy threads shows in stats as
// the game's cores once the engine has run a step, and frames without it change nothing.
using System;
using System.Collections.Generic;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Sidecar")]
    public class GameCpuTests
    {
        Sidecar sidecar;
        IgiClient client;
        string session;

        [TestFixtureSetUp]
        public void StartSidecar()
        {
            sidecar = Sidecar.Start();
            client = Pumping.Connect(sidecar.Endpoint);
            Assert.IsTrue(client.IsGame, "a sidecar started without a launch token takes every client as the game");
            session = Pumping.Ok(client, client.OpenSession(new SessionOptions { Persona = "Brom", Sampling = Pumping.Greedy })).Session;
        }

        [TestFixtureTearDown]
        public void StopSidecar()
        {
            if (client != null) client.Dispose();
            if (sidecar != null) sidecar.Dispose();
        }

        // the engine reads the game's report after each step: one short reply, then stats
        Dictionary<string, object> ThreadsAfterAStep()
        {
            Pumping.Ok(client, client.Chat(session, "Hello!", new ChatOptions { MaxTokens = 2 }), 60);
            var stats = Pumping.Ok(client, client.Stats());
            var threads = MsgValue.GetMap(MsgValue.GetMap(stats.Result, "engine"), "threads");
            Assert.IsNotNull(threads, "stats.engine.threads");
            return threads;
        }

        static object GameCores(Dictionary<string, object> threads) { return MsgValue.Get(threads, "game_cores"); }

        [Test]
        [Timeout(120000)]
        public void BusyThreadsShowAsTheGamesCoresAndFramesWithoutThemChangeNothing()
        {
            // before any report, and after a frame without one: no game cores
            Assert.IsNull(GameCores(ThreadsAfterAStep()), "no report yet");
            Assert.IsTrue(Pumping.Ok(client, client.Frame(1, 16.6, 16.6)).GetBool("paced"));
            Assert.IsNull(GameCores(ThreadsAfterAStep()), "a frame without the game's CPU use reports none");

            Pumping.Ok(client, client.Frame(2, 16.6, 16.6, busyThreads: 3));
            var threads = ThreadsAfterAStep();
            Assert.AreEqual(3L, GameCores(threads), "the game's 3 busy threads");
            long ceiling = MsgValue.GetLong(threads, "ceiling");
            Assert.LessOrEqual(ceiling, Math.Max(1, Environment.ProcessorCount - 3),
                "the model's threads keep off the game's cores");
            Console.WriteLine("measured: after busy_threads 3 on " + Environment.ProcessorCount + " CPUs the thread ceiling is " + ceiling);

            // a frame without it leaves the last report as it was
            Pumping.Ok(client, client.Frame(3, 16.6, 16.6));
            Assert.AreEqual(3L, GameCores(ThreadsAfterAStep()), "kept after a frame without the figure");

            // the report without a request handle carries it too
            Assert.IsTrue(client.ReportFrame(4, 16.6, 16.6, busyThreads: 2));
            var clock = System.Diagnostics.Stopwatch.StartNew();
            object cores = null;
            while (clock.Elapsed.TotalSeconds < 30)
            {
                cores = GameCores(ThreadsAfterAStep());
                if (Equals(cores, 2L)) break;
            }
            Assert.AreEqual(2L, cores, "ReportFrame's busy_threads");
            Assert.IsNull(client.FrameError, "the sidecar took every report");
        }
    }
}
