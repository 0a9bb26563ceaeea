// Starts the real sidecar (`igi-sdk serve`, path in env IGI_SDK_EXE) on a free loopback port
// with its own save directory, and waits for its "ready" line. One shared instance is started
// lazily for the whole run; tests that kill or restart a sidecar start their own. A sidecar
// started with a launch token gets it the way a game hands it over: env IGI_SDK_TOKEN only.
using System;
using System.Diagnostics;
using System.IO;
using System.Net;
using System.Net.Sockets;
using System.Text;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    public sealed class Sidecar : IDisposable
    {
        static Sidecar shared;
        static readonly object SharedLock = new object();

        public readonly int Port;
        public readonly string SaveDir;
        /// <summary>The launch token it was started with (IGI_SDK_TOKEN); null: none (then every
        /// client is the game).</summary>
        public readonly string Token;
        Process process;
        readonly StringBuilder log = new StringBuilder();
        volatile bool ready;

        string endpoint; // null: tcp on the loopback port
        public string Endpoint { get { return endpoint ?? "tcp://127.0.0.1:" + Port; } }
        public string Log { get { lock (log) return log.ToString(); } }
        public bool IsRunning { get { return process != null && !process.HasExited; } }

        /// <summary>The sidecar shared by the tests that leave it as they found it.</summary>
        public static Sidecar Shared
        {
            get
            {
                lock (SharedLock)
                {
                    if (shared == null || !shared.IsRunning)
                    {
                        shared = Start();
                        AppDomain.CurrentDomain.DomainUnload += delegate { shared.Dispose(); };
                        AppDomain.CurrentDomain.ProcessExit += delegate { shared.Dispose(); };
                    }
                    return shared;
                }
            }
        }

        /// <summary>A sidecar of its own; <paramref name="endpoint"/> null: a free loopback TCP port.</summary>
        public static Sidecar Start(string extraArgs = "", string endpoint = null, string token = null)
        {
            string save = Path.Combine(Path.GetTempPath(), "igi-cs-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            Directory.CreateDirectory(save);
            var sidecar = new Sidecar(FreePort(), save, token);
            sidecar.endpoint = endpoint;
            sidecar.Launch(extraArgs);
            return sidecar;
        }

        Sidecar(int port, string saveDir, string token)
        {
            Port = port;
            SaveDir = saveDir;
            Token = token;
        }

        public static string Exe
        {
            get
            {
                string exe = Environment.GetEnvironmentVariable("IGI_SDK_EXE");
                if (string.IsNullOrEmpty(exe)) Assert.Ignore("IGI_SDK_EXE is not set (path of the igi-sdk command)");
                return exe;
            }
        }

        /// <summary>Starts (or starts again, same port and save directory) and waits for ready.</summary>
        public void Launch(string extraArgs = "")
        {
            ready = false;
            var info = new ProcessStartInfo(Exe,
                "serve --endpoint " + Endpoint + " --save-dir \"" + SaveDir + "\" --game-pid " +
                Process.GetCurrentProcess().Id + " " + extraArgs)
            {
                UseShellExecute = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
                CreateNoWindow = true,
                WorkingDirectory = Path.GetTempPath(), // not the test's folder, which a later run may delete
            };
            // never inherited from whoever runs the tests: a sidecar has exactly the token asked for
            info.EnvironmentVariables.Remove("IGI_SDK_TOKEN");
            if (Token != null) info.EnvironmentVariables["IGI_SDK_TOKEN"] = Token;
            process = new Process { StartInfo = info };
            process.OutputDataReceived += OnLine;
            process.ErrorDataReceived += OnLine;
            process.Start();
            process.BeginOutputReadLine();
            process.BeginErrorReadLine();
            var clock = Stopwatch.StartNew();
            while (!ready)
            {
                if (process.HasExited) Assert.Fail("the sidecar exited at start:\n" + Log);
                if (clock.Elapsed.TotalSeconds > 60) Assert.Fail("the sidecar was not ready within 60 s:\n" + Log);
                Thread.Sleep(20);
            }
        }

        void OnLine(object sender, DataReceivedEventArgs e)
        {
            if (e.Data == null) return;
            lock (log) log.AppendLine(e.Data);
            if (e.Data.Contains("ready")) ready = true;
        }

        /// <summary>Kills the process at once (no goodbye, no flush): a crash.</summary>
        public void Kill()
        {
            if (!IsRunning) return;
            process.Kill();
            process.WaitForExit(5000);
        }

        static int FreePort()
        {
            var listener = new TcpListener(IPAddress.Loopback, 0);
            listener.Start();
            int port = ((IPEndPoint)listener.LocalEndpoint).Port;
            listener.Stop();
            return port;
        }

        public void Dispose()
        {
            try { Kill(); } catch (InvalidOperationException) { }
            try { Directory.Delete(SaveDir, true); } catch (IOException) { } catch (UnauthorizedAccessException) { }
        }
    }
}
