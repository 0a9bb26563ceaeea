// NUnit tests of the package's Unity layer outside Unity (UnityEngineStub.cs stands in for the
// engine; the components' messages are called by hand, through reflection: test code only),
// against real sidecars: PID liveness without System.Diagnostics.Process for the watch, a
// player's launch on a free port with a fresh instance id, a script reload in play mode, and
// the refusal of a sidecar with another instance id.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Net;
using System.Net.Sockets;
using System.Reflection;
using System.Threading;
using Igi.Sdk;
using Igi.Sdk.Unity;
using NUnit.Framework;
using UnityEngine;

namespace Igi.Sdk.UnityTests
{
    static class Engine
    {
        public static void Call(object o, string method)
        {
            var m = o.GetType().GetMethod(method, BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public);
            if (m != null) m.Invoke(o, null);
        }

        public static void ResetStatics(Type t)
        {
            t.GetMethod("ResetStatics", BindingFlags.Static | BindingFlags.NonPublic).Invoke(null, null);
        }

        /// <summary>A component as Unity makes it: Awake, then OnEnable.</summary>
        public static T Add<T>(string name, List<MonoBehaviour> live) where T : MonoBehaviour, new()
        {
            var c = new GameObject(name).AddComponent<T>();
            Call(c, "Awake");
            Call(c, "OnEnable");
            live.Add(c);
            return c;
        }

        public static bool Frames(List<MonoBehaviour> live, Func<bool> until, double seconds)
        {
            var clock = Stopwatch.StartNew();
            while (clock.Elapsed.TotalSeconds < seconds)
            {
                foreach (var c in live.ToArray()) Call(c, "Update");
                if (until()) return true;
                Thread.Sleep(10);
            }
            return false;
        }

        /// <summary>
        /// What a script reload in play mode does to a component: OnDisable on the old one, then a
        /// fresh object whose serializable fields (public, [SerializeField], and private ones of
        /// serializable types alike: the reload keeps them all) are copied over; [NonSerialized]
        /// fields keep their initial values; then OnEnable (no Awake, no Start).
        /// </summary>
        public static T Reload<T>(T old) where T : MonoBehaviour, new()
        {
            var fresh = new GameObject(old.name).AddComponent<T>();
            for (Type t = typeof(T); t != null && t != typeof(MonoBehaviour); t = t.BaseType)
            {
                foreach (var f in t.GetFields(BindingFlags.Instance | BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.DeclaredOnly))
                {
                    if (f.IsNotSerialized || f.IsInitOnly || !Serializable(f.FieldType)) continue;
                    f.SetValue(fresh, f.GetValue(old));
                }
            }
            return fresh;
        }

        static bool Serializable(Type t)
        {
            if (t.IsPrimitive || t.IsEnum || t == typeof(string)) return true;
            if (typeof(UnityEngine.Object).IsAssignableFrom(t)) return true;
            if (t.IsArray) return Serializable(t.GetElementType());
            if (t.IsGenericType && t.GetGenericTypeDefinition() == typeof(List<>)) return Serializable(t.GetGenericArguments()[0]);
            return t.IsDefined(typeof(SerializableAttribute), false) && !t.IsGenericType && !t.IsAbstract
                && !typeof(Delegate).IsAssignableFrom(t) && t.Namespace != null && !t.Namespace.StartsWith("System", StringComparison.Ordinal);
        }
    }

    [TestFixture]
    public class ProcessWatchTests
    {
        static Process Child(string shellCommand)
        {
            var info = new ProcessStartInfo("/bin/sh", "-c \"" + shellCommand + "\"")
            { UseShellExecute = false, RedirectStandardOutput = true, CreateNoWindow = true };
            return Process.Start(info);
        }

        static bool Becomes(Func<bool> condition, double seconds)
        {
            var clock = Stopwatch.StartNew();
            while (clock.Elapsed.TotalSeconds < seconds) { if (condition()) return true; Thread.Sleep(20); }
            return condition();
        }

        [SetUp]
        public void PosixOnly()
        {
            if (Path.DirectorySeparatorChar == '\\') Assert.Ignore("the POSIX path (this machine runs the Windows one nowhere)");
        }

        [Test]
        public void ThisBuildAsksLibcByName()
        {
            // the package's tests compile without Unity's platform defines: the OS is told apart
            // at run time and the C library is named (never "__Internal", which IL2CPP links
            // statically and only iOS-family players have)
            Assert.AreEqual("libc", ProcessWatch.Library);
        }

        [Test]
        [Timeout(20000)]
        public void AChildIsAliveUntilKilledThenDead()
        {
            using (var child = Child("exec sleep 30"))
            using (var watch = new ProcessWatch(child.Id))
            {
                Assert.IsFalse(watch.HasExited, "running");
                Assert.IsNull(watch.Unsupported);
                Thread.Sleep(100);
                Assert.IsFalse(watch.HasExited, "still running");
                Process.Start("kill", "-9 " + child.Id).WaitForExit();
                Assert.IsTrue(Becomes(() => watch.HasExited, 5), "dead after kill -9");
                if (watch.ExitCode.HasValue) Assert.AreEqual(128 + 9, watch.ExitCode.Value, "killed by signal 9");
            }
        }

        [Test]
        [Timeout(20000)]
        public void AProcessThatIsNotOurChildIsWatchedByKill()
        {
            // sh starts sleep in the background and waits for it: sleep is sh's child, not ours
            using (var shell = Child("sleep 30 & echo $!; wait"))
            {
                int pid = int.Parse(shell.StandardOutput.ReadLine().Trim());
                using (var watch = new ProcessWatch(pid))
                {
                    Assert.IsFalse(watch.HasExited, "running (kill(pid, 0) answers 0)");
                    Process.Start("kill", "-9 " + pid).WaitForExit();
                    Assert.IsTrue(Becomes(() => watch.HasExited, 5), "dead once its parent reaped it (ESRCH)");
                    Assert.IsNull(watch.ExitCode, "not our child: no exit status");
                }
                shell.WaitForExit(5000);
            }
        }

        [Test]
        [Timeout(20000)]
        public void TheSidecarProcessGivesItsExitCode()
        {
            string dir = Path.Combine(Path.GetTempPath(), "igi-watch-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            var launch = new SidecarLaunch { Executable = "/bin/sh", LogPath = Path.Combine(dir, "x.log") };
            launch.Arguments.AddRange(new[] { "-c", "sleep 0.3; exit 2" });
            using (var process = SidecarProcess.Start(launch))
            {
                Assert.Greater(process.Pid, 0);
                Assert.IsFalse(process.HasExited);
                Assert.IsTrue(Becomes(() => process.HasExited, 10), "exited");
                Assert.AreEqual(2, process.ExitCode, "the exit status (2: igi-sdk refused its arguments)");
            }
            Directory.Delete(dir, true);
        }

        [Test]
        public void APidThatDoesNotExistIsDead()
        {
            // PIDs are below 2^22 on Linux; this one is far past any
            using (var watch = new ProcessWatch(int.MaxValue - 7)) Assert.IsTrue(watch.HasExited);
        }
    }

    [TestFixture]
    public class SidecarIdentityTests
    {
        [Test]
        public void TheEditorPortAndInstanceFollowTheProject()
        {
            int a = SidecarIdentity.EditorPort("/home/dev/Games/Forge");
            Assert.AreEqual(a, SidecarIdentity.EditorPort("/home/dev/Games/Forge/"), "one spelling per folder");
            Assert.That(a, Is.InRange(SidecarIdentity.FirstEditorPort, SidecarIdentity.FirstEditorPort + SidecarIdentity.EditorPorts - 1));
            Assert.AreNotEqual(SidecarIdentity.EditorInstance("/home/dev/Games/Forge"), SidecarIdentity.EditorInstance("/home/dev/Games/Mill"));
            Assert.AreEqual(SidecarIdentity.EditorInstance("/p/x"), SidecarIdentity.EditorInstance("/p/x"));
            Assert.IsTrue(SidecarIdentity.IsValidInstance(SidecarIdentity.EditorInstance("/p/x")));
            Assert.IsTrue(SidecarIdentity.IsValidInstance(SidecarIdentity.NewInstance()));
            Assert.AreNotEqual(SidecarIdentity.NewInstance(), SidecarIdentity.NewInstance());
            var ports = new HashSet<int>();
            for (int i = 0; i < 200; i++) ports.Add(SidecarIdentity.EditorPort("/projects/p" + i));
            Assert.Greater(ports.Count, 180, "projects spread over the range");
            Assert.IsFalse(SidecarIdentity.IsValidInstance("a b"));
            Assert.IsFalse(SidecarIdentity.IsValidInstance(new string('a', 65)));
        }

        [Test]
        public void TheEndpointFileIsReadOnlyWhenItNamesALoopbackPort()
        {
            string file = Path.GetTempFileName();
            try
            {
                Assert.IsNull(SidecarIdentity.ReadEndpointFile(file + ".none"));
                File.WriteAllText(file, "tcp://127.0.0.1:41234\n");
                Assert.AreEqual("tcp://127.0.0.1:41234", SidecarIdentity.ReadEndpointFile(file));
                File.WriteAllText(file, "tcp://10.0.0.5:41234");
                Assert.IsNull(SidecarIdentity.ReadEndpointFile(file), "not loopback");
                File.WriteAllText(file, "");
                Assert.IsNull(SidecarIdentity.ReadEndpointFile(file), "not written yet");
            }
            finally { File.Delete(file); }
        }

        [Test]
        public void TheServeArgumentsCarryTheIdentity()
        {
            var argv = SidecarArguments.Build("tcp://127.0.0.1:0", 42, "/save", "", "", "/sa", null, "game-abc", "/tmp/igi-sdk/game-abc.endpoint");
            Assert.AreEqual("serve --endpoint tcp://127.0.0.1:0 --save-dir /save --instance game-abc --endpoint-file /tmp/igi-sdk/game-abc.endpoint --game-pid 42",
                string.Join(" ", argv.ToArray()));
        }
    }

    [TestFixture]
    public class SidecarComponentTests
    {
        readonly List<MonoBehaviour> live = new List<MonoBehaviour>();
        string data;
        string models;
        readonly List<Process> foreign = new List<Process>();

        [SetUp]
        public void Setup()
        {
            if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable("IGI_SDK_EXE"))) Assert.Ignore("IGI_SDK_EXE is not set");
            data = Path.Combine(Path.GetTempPath(), "igi-unity-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            models = Path.Combine(data, "models"); // empty: the sidecar starts at once, without a model
            Directory.CreateDirectory(models);
            Environment.SetEnvironmentVariable("IGI_STUB_DATA", data);
            Environment.SetEnvironmentVariable("IGI_STUB_EDITOR", "0");
            Engine.ResetStatics(typeof(IgiSidecar));
            Engine.ResetStatics(typeof(NpcDialogue));
        }

        [TearDown]
        public void TearDown()
        {
            foreach (var c in live) Engine.Call(c, "OnApplicationQuit");
            foreach (var c in live) Engine.Call(c, "OnDisable");
            foreach (var c in live) Engine.Call(c, "OnDestroy");
            live.Clear();
            foreach (var p in foreign) { try { p.Kill(); p.WaitForExit(5000); } catch (InvalidOperationException) { } }
            foreign.Clear();
            // the sidecars the components started watch this process (--game-pid) and exit with
            // the run; the launch records are this process's and go with the test
            SidecarKeys.ForgetLaunch(0);
            try { Directory.Delete(data, true); } catch (IOException) { } catch (UnauthorizedAccessException) { }
        }

        IgiSidecar NewSidecar(int port = 0)
        {
            var sidecar = Engine.Add<IgiSidecar>("Igi Sidecar", live);
            sidecar.Port = port;
            sidecar.ModelDir = models;
            return sidecar;
        }

        static int FreePort()
        {
            var listener = new TcpListener(IPAddress.Loopback, 0);
            listener.Start();
            int port = ((IPEndPoint)listener.LocalEndpoint).Port;
            listener.Stop();
            return port;
        }

        int StartForeignSidecar(string instance, string token = null)
        {
            int port = FreePort();
            var info = new ProcessStartInfo(Environment.GetEnvironmentVariable("IGI_SDK_EXE"),
                "serve --endpoint tcp://127.0.0.1:" + port + " --model-dir \"" + models + "\" --save-dir \"" + Path.Combine(data, "foreign") +
                "\" --instance " + instance + " --game-pid " + Process.GetCurrentProcess().Id)
            { UseShellExecute = false, RedirectStandardOutput = true, RedirectStandardError = true, CreateNoWindow = true };
            info.EnvironmentVariables.Remove("IGI_SDK_TOKEN");
            if (token != null) info.EnvironmentVariables["IGI_SDK_TOKEN"] = token; // another program's sidecar: this game is its guest
            var p = Process.Start(info);
            foreign.Add(p);
            // its one stdout line says it is bound
            string line = p.StandardOutput.ReadLine();
            StringAssert.StartsWith("igi-sdk endpoint tcp://127.0.0.1:" + port, line ?? "(none: " + p.StandardError.ReadToEnd() + ")");
            return port;
        }

        [Test]
        [Timeout(120000)]
        public void APlayerStartsItsSidecarOnAFreePortWithAFreshInstanceAndSurvivesAScriptReload()
        {
            var sidecar = NewSidecar();
            sidecar.ModelDir = ""; // the default model: the NPC needs one for its session
            var npc = Engine.Add<NpcDialogue>("Brom", live);
            npc.Persona = "Brom";
            Assert.IsTrue(Engine.Frames(live, () => sidecar.IsReady && npc.IsReady, 90), "ready: " + sidecar.State + " " + sidecar.LastError);
            Assert.IsTrue(sidecar.StartedHere);
            Assert.AreNotEqual("tcp://127.0.0.1:0", sidecar.Endpoint);
            StringAssert.StartsWith("tcp://127.0.0.1:", sidecar.Endpoint);
            StringAssert.StartsWith("game-", sidecar.ExpectedInstance);
            Assert.AreEqual(sidecar.ExpectedInstance, sidecar.Client.Server.Instance, "hello echoes the instance it was started with");
            Assert.IsTrue(sidecar.IsGame);
            int pid = sidecar.SidecarPid;
            Assert.Greater(pid, 0);
            string session = npc.SessionId;
            string endpoint = sidecar.Endpoint;

            // the reload: OnDisable on the old components, fresh ones with the serialized fields, statics cleared
            foreach (var c in live) Engine.Call(c, "OnDisable");
            var reloadedSidecar = Engine.Reload(sidecar);
            var reloadedNpc = Engine.Reload(npc);
            live.Clear();
            live.Add(reloadedSidecar);
            live.Add(reloadedNpc);
            Engine.ResetStatics(typeof(IgiSidecar));
            Engine.ResetStatics(typeof(NpcDialogue));
            Assert.IsNull(reloadedSidecar.Client, "the client is runtime state: not restored");
            Assert.AreEqual(SidecarState.Stopped, reloadedSidecar.State, "nor is the state (a restored Ready without a client was the bug)");
            foreach (var c in live) Engine.Call(c, "OnEnable");

            Assert.IsTrue(Engine.Frames(live, () => reloadedSidecar.IsReady && reloadedNpc.IsReady, 60),
                "reconnected after the reload: " + reloadedSidecar.State + " " + reloadedSidecar.LastError);
            Assert.AreEqual(endpoint, reloadedSidecar.Endpoint, "the same sidecar");
            Assert.AreEqual(pid, reloadedSidecar.SidecarPid, "its PID watched again");
            Assert.IsFalse(reloadedSidecar.StartedHere, "none started after the reload");
            Assert.AreEqual(session, reloadedNpc.SessionId, "the NPC's session adopted");
            Assert.IsTrue(reloadedSidecar.IsGame, "still the game (the token survived the reload)");
            string log = File.ReadAllText(reloadedSidecar.LogPath);
            Assert.AreEqual(1, log.Split(new[] { "---- " }, StringSplitOptions.None).Length - 1, "one sidecar started:\n" + log);
        }

        void Updates(int n)
        {
            for (int i = 0; i < n; i++)
            {
                foreach (var c in live.ToArray()) Engine.Call(c, "Update");
                Thread.Sleep(5);
            }
        }

        static void Signal(int pid, string signal)
        {
            using (var kill = Process.Start("kill", "-" + signal + " " + pid)) kill.WaitForExit();
        }

        [Test]
        [Timeout(60000)]
        public void BeginLevelLoadIsGrantedAtOnceByASidecarThatHoldsNoVram()
        {
            var sidecar = NewSidecar(); // no model: it holds no VRAM, on a GPU machine or not
            var early = sidecar.BeginLevelLoad(1L << 30);
            Assert.IsTrue(early.IsDone, "before the sidecar is connected: ended at once");
            Assert.AreEqual(IgiError.Unavailable, early.ErrorCode);
            Assert.IsTrue(Engine.Frames(live, () => sidecar.IsReady, 40), "ready: " + sidecar.State + " " + sidecar.LastError);
            Assert.IsTrue(sidecar.IsGame);

            const long level = 3L << 30;
            var load = sidecar.BeginLevelLoad(level, 30);
            Assert.IsFalse(load.IsDone, "answered through Update's pump, on the main thread");
            int frames = 0;
            while (!load.IsDone && frames < 31) { Updates(1); frames++; }
            Console.WriteLine("measured: BeginLevelLoad on a sidecar without VRAM: " + load + " after " + frames + " frames");
            Assert.IsTrue(load.Granted, load.ToString());
            Assert.IsNull(load.ErrorCode);
            Assert.IsTrue(load.GetAwaiter().GetResult(), "await gives the same answer");
            Assert.IsTrue(load.Task.Result);
            Assert.IsFalse(load.keepWaiting, "a coroutine's yield ends");

            // the sidecar recorded it with the frames the game gave it
            var stats = sidecar.Client.Stats();
            Assert.IsTrue(Engine.Frames(live, () => stats.IsDone, 10), "stats");
            var recorded = MsgValue.GetList(stats.Result, "reservations");
            Assert.IsNotNull(recorded, "stats.reservations");
            var last = (Dictionary<string, object>)recorded[recorded.Count - 1];
            Assert.AreEqual(level, MsgValue.GetLong(last, "bytes"));
            Assert.AreEqual(30L, MsgValue.GetLong(last, "deadline_frames"));
        }

        [Test]
        [Timeout(60000)]
        public void ALevelLoadStopsWaitingWhenItsFramesRunOut()
        {
            var sidecar = NewSidecar();
            Assert.IsTrue(Engine.Frames(live, () => sidecar.IsReady, 40), "ready: " + sidecar.State + " " + sidecar.LastError);
            int pid = sidecar.SidecarPid;
            Assert.Greater(pid, 0);
            Signal(pid, "STOP"); // a sidecar that cannot answer in time
            try
            {
                var load = sidecar.BeginLevelLoad(1L << 30, 3);
                Updates(2);
                Assert.IsFalse(load.IsDone, "two of its three frames");
                Updates(1);
                Assert.IsTrue(load.IsDone, "ended at its third frame");
                Assert.IsFalse(load.Granted);
                Assert.AreEqual(VramReservation.DeadlineMissed, load.ErrorCode, load.ToString());
                Assert.IsFalse(load.Task.Result);
            }
            finally
            {
                Signal(pid, "CONT");
            }
            // the late answer changes nothing, and the next level load is granted
            var next = sidecar.BeginLevelLoad(1L << 20);
            Assert.IsTrue(Engine.Frames(live, () => next.IsDone, 20), "answered after SIGCONT");
            Assert.IsTrue(next.Granted, next.ToString());
        }

        [Test]
        [Timeout(60000)]
        public void AGuestsLevelLoadIsForbidden()
        {
            // a sidecar another program started with its own launch token: this game is a guest
            int port = StartForeignSidecar("launcher-9", token: "someone-elses-token");
            string file = Path.Combine(data, "endpoint.txt");
            File.WriteAllText(file, "tcp://127.0.0.1:" + port + "\n");
            var sidecar = NewSidecar();
            sidecar.Launch = false;
            sidecar.EndpointFile = file;
            sidecar.InstanceId = "launcher-9";
            Assert.IsTrue(Engine.Frames(live, () => sidecar.IsReady, 30), "connected: " + sidecar.State + " " + sidecar.LastError);
            Assert.IsFalse(sidecar.IsGame, "a guest");
            var load = sidecar.BeginLevelLoad(1L << 30);
            Assert.IsTrue(Engine.Frames(live, () => load.IsDone, 20), "answered");
            Assert.IsFalse(load.Granted);
            Assert.AreEqual(IgiError.Forbidden, load.ErrorCode, load.ToString());
        }

        [Test]
        public void BeginLevelLoadRefusesWhatTheProtocolCannotCarry()
        {
            var sidecar = NewSidecar();
            Assert.Throws<ArgumentOutOfRangeException>(() => sidecar.BeginLevelLoad(-1));
            Assert.Throws<ArgumentOutOfRangeException>(() => sidecar.BeginLevelLoad(1, -1));
            Assert.Throws<ArgumentOutOfRangeException>(() => sidecar.BeginLevelLoad(1, 100001));
        }

        [Test]
        [Timeout(30000)]
        public void APortProbeReadsOnlyARefusalAsFree()
        {
            // a probe that timed out on a loaded machine was read as a free port, and the
            // component started a second sidecar on a port another one held
            Assert.AreEqual(PortState.Free, PortProbe.Check(FreePort(), 2000));
            var listener = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
            var clients = new List<Socket>();
            try
            {
                listener.Bind(new IPEndPoint(IPAddress.Loopback, 0));
                listener.Listen(1);
                int port = ((IPEndPoint)listener.LocalEndPoint).Port;
                Assert.AreEqual(PortState.Listening, PortProbe.Check(port, 2000));
                // nobody accepts: the backlog fills and a further connection gets no answer
                for (int i = 0; i < 16; i++)
                {
                    var c = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
                    clients.Add(c);
                    c.BeginConnect(IPAddress.Loopback, port, null, null);
                }
                Thread.Sleep(200);
                Assert.AreEqual(PortState.Unknown, PortProbe.Check(port, 300), "a port that does not answer is not free");
                Assert.IsFalse(PortProbe.IsListening(port, 300));
            }
            finally
            {
                foreach (var c in clients) c.Close();
                listener.Close();
            }
        }

        [Test]
        [Timeout(60000)]
        public void ASidecarWithAnotherInstanceOnThePortIsRefusedNeverReused()
        {
            int port = StartForeignSidecar("someone-else");
            var sidecar = NewSidecar(port);
            Assert.IsTrue(Engine.Frames(live, () => sidecar.State == SidecarState.Failed, 30), "refused: " + sidecar.State + " " + sidecar.LastError);
            StringAssert.StartsWith(IgiError.WrongSidecar, sidecar.LastError);
            StringAssert.Contains("someone-else", sidecar.LastError);
            Assert.IsFalse(sidecar.StartedHere, "no second sidecar started on a taken port");
            Assert.IsNull(sidecar.Client.Server, "never used");
        }

        [Test]
        [Timeout(60000)]
        public void TheLaunchersSidecarIsUsedWithItsInstanceAndRefusedWithAnother()
        {
            int port = StartForeignSidecar("launcher-7");
            string file = Path.Combine(data, "endpoint.txt");
            File.WriteAllText(file, "tcp://127.0.0.1:" + port + "\n");
            var sidecar = NewSidecar();
            sidecar.Launch = false;
            sidecar.EndpointFile = file;
            sidecar.InstanceId = "launcher-7";
            Assert.IsTrue(Engine.Frames(live, () => sidecar.IsReady, 30), "connected: " + sidecar.State + " " + sidecar.LastError);
            Assert.AreEqual("launcher-7", sidecar.Client.Server.Instance);
            Assert.IsFalse(sidecar.StartedHere);
            foreach (var c in live) { Engine.Call(c, "OnDisable"); Engine.Call(c, "OnDestroy"); }
            live.Clear();

            Engine.ResetStatics(typeof(IgiSidecar));
            var wrong = NewSidecar();
            wrong.Launch = false;
            wrong.EndpointFile = file;
            wrong.InstanceId = "launcher-8";
            Assert.IsTrue(Engine.Frames(live, () => wrong.State == SidecarState.Failed, 30), "refused: " + wrong.State + " " + wrong.LastError);
            StringAssert.StartsWith(IgiError.WrongSidecar, wrong.LastError);
        }
    }
}
