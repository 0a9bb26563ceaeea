using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;

namespace Igi.Sdk.Unity
{
    /// <summary>What to start: the executable, its arguments, where its output goes.</summary>
    public sealed class SidecarLaunch
    {
        public string Executable;
        public List<string> Arguments = new List<string>();
        public string LogPath;
        public bool Windows;
        /// <summary>Set in the child's environment only: what other local processes must not
        /// read (the launch token) goes here, never into <see cref="Arguments"/>, which every
        /// process of the machine can list.</summary>
        public Dictionary<string, string> Variables = new Dictionary<string, string>();
    }

    /// <summary>
    /// A started <c>igi-sdk serve</c>. Its output goes to a log file through a shell redirect
    /// rather than through pipes to this process: in the Editor the sidecar outlives the play
    /// mode (and the scripting domain that would read the pipes), and a sidecar writing into a
    /// pipe nobody reads would block once the pipe is full.
    ///
    /// <c>System.Diagnostics.Process</c> is used for one thing, starting it, and every call to it
    /// is guarded: under IL2CPP it may refuse (<see cref="PlatformNotSupportedException"/>,
    /// <see cref="NotSupportedException"/>), and then <see cref="Start"/> throws
    /// <see cref="LaunchUnsupportedException"/> (the game's launcher starts the sidecar instead).
    /// Whether it still runs is asked of the OS by PID (<see cref="ProcessWatch"/>).
    /// </summary>
    public sealed class SidecarProcess : IDisposable
    {
        readonly Process _process; // kept only for an exit code the PID watch could not read
        readonly ProcessWatch _watch;

        public string LogPath { get; private set; }
        public int Pid { get { return _watch.Pid; } }

        SidecarProcess(Process process, int pid, string logPath)
        {
            _process = process;
            _watch = new ProcessWatch(pid);
            LogPath = logPath;
        }

        /// <summary>Watches a sidecar this process did not start through this class (one started
        /// before a domain reload, or by the game's launcher).</summary>
        public static SidecarProcess Attach(int pid, string logPath)
        {
            return new SidecarProcess(null, pid, logPath);
        }

        /// <summary>True once the process (or its shell wrapper) has ended. One system call, no allocation.</summary>
        public bool HasExited { get { return _watch.HasExited; } }

        /// <summary>Its exit status once it has exited; -1 when it cannot be known.</summary>
        public int ExitCode
        {
            get
            {
                if (_watch.ExitCode.HasValue) return _watch.ExitCode.Value;
                if (_process == null) return -1;
                // the runtime reaped it first (Mono does for the children it starts)
                try { return _process.HasExited ? _process.ExitCode : -1; }
                catch (InvalidOperationException) { return -1; }
                catch (NotSupportedException) { return -1; } // PlatformNotSupportedException too
                catch (System.ComponentModel.Win32Exception) { return -1; }
            }
        }

        public void Dispose()
        {
            _watch.Dispose();
            if (_process == null) return;
            try { _process.Dispose(); }
            catch (InvalidOperationException) { }
            catch (NotSupportedException) { }
        }

        const long MaxLogBytes = 8L << 20;

        // the log is appended to by every start: past 8 MiB the old part moves to <log>.old
        static void KeepLogSmall(string logPath)
        {
            try
            {
                var info = new FileInfo(logPath);
                if (!info.Exists || info.Length < MaxLogBytes) return;
                string old = logPath + ".old";
                if (File.Exists(old)) File.Delete(old);
                File.Move(logPath, old);
            }
            catch (IOException)
            {
                // a sidecar still writing it (Windows keeps it locked): append anyway
            }
            catch (UnauthorizedAccessException)
            {
                // not ours to move: append anyway
            }
        }

        /// <summary>Starts the sidecar; throws when the OS refuses. Call off the main thread.</summary>
        public static SidecarProcess Start(SidecarLaunch launch)
        {
            Directory.CreateDirectory(Path.GetDirectoryName(launch.LogPath));
            KeepLogSmall(launch.LogPath);
            var info = new ProcessStartInfo
            {
                UseShellExecute = false,
                CreateNoWindow = true,
                WorkingDirectory = Path.GetDirectoryName(launch.LogPath),
            };
            // the sidecar's own prints are line-by-line in the log, not held in a buffer
            info.EnvironmentVariables["PYTHONUNBUFFERED"] = "1";
            SidecarKeys.RemoveFrom(info.EnvironmentVariables); // this process's owner keys stay here
            foreach (var variable in launch.Variables) info.EnvironmentVariables[variable.Key] = variable.Value;
            if (launch.Windows)
            {
                // cmd /s /c "<command>": cmd strips the outer quotes and runs the rest as written;
                // quoted arguments keep & | < > ^ literal (a %NAME% in a path would still expand)
                var command = new List<string> { launch.Executable };
                command.AddRange(launch.Arguments);
                info.FileName = Environment.GetEnvironmentVariable("ComSpec") ?? "cmd.exe";
                info.Arguments = "/d /s /c \"" + CommandLine.Join(command, true, true)
                    + " >>" + CommandLine.QuoteWindows(launch.LogPath, true) + " 2>&1\"";
            }
            else
            {
                // exec: the shell becomes the sidecar, so the process watched here is the sidecar
                var command = new List<string> { "-c", "log=$1; shift; exec \"$0\" \"$@\" >>\"$log\" 2>&1",
                    launch.Executable, launch.LogPath };
                command.AddRange(launch.Arguments);
                info.FileName = "/bin/sh";
                info.Arguments = CommandLine.Join(command, false);
            }
            File.AppendAllText(launch.LogPath, "---- " + DateTime.Now.ToString("u") + " starting "
                + launch.Executable + " " + CommandLine.Join(launch.Arguments, launch.Windows) + Environment.NewLine);
            Process process;
            int pid;
            try
            {
                process = Process.Start(info);
                if (process == null) throw new InvalidOperationException("the OS started no process for " + launch.Executable);
                pid = process.Id;
            }
            catch (NotSupportedException e) // PlatformNotSupportedException included: IL2CPP
            {
                throw new LaunchUnsupportedException("this player cannot start processes (" + e.GetType().Name + ": " + e.Message + ")", e);
            }
            catch (MissingMethodException e) // stripped out of the build
            {
                throw new LaunchUnsupportedException("this player cannot start processes (" + e.Message + ")", e);
            }
            return new SidecarProcess(process, pid, launch.LogPath);
        }
    }

    /// <summary>The platform cannot start processes (IL2CPP's class libraries on some targets):
    /// start the sidecar from the game's launcher and connect to it (docs/unity.md).</summary>
    public sealed class LaunchUnsupportedException : Exception
    {
        public LaunchUnsupportedException(string message, Exception inner) : base(message, inner) { }
    }
}
