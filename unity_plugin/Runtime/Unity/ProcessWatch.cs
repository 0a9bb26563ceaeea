using System;
using System.IO;
using System.Runtime.InteropServices;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Is a process (found by its PID) still running? Asked of the OS directly through a few
    /// P/Invokes, not through <c>System.Diagnostics.Process</c>: Unity's IL2CPP class libraries
    /// throw <see cref="PlatformNotSupportedException"/> from <c>Process.HasExited</c> while the
    /// process runs, so a watch built on it stops watching exactly in shipped players.
    ///
    /// Linux and macOS: <c>waitpid(pid, WNOHANG)</c> first (our own child: it reaps it, gives the
    /// exit status, and the PID cannot be reused while we hold it unreaped), else
    /// <c>kill(pid, 0)</c> (ESRCH: gone; 0 or EPERM: there). Windows: a handle from
    /// <c>OpenProcess</c> kept for the watch's life (the PID cannot be reused while it is open),
    /// <c>WaitForSingleObject(handle, 0)</c> and <c>GetExitCodeProcess</c>.
    /// No call allocates managed memory; each is one system call.
    /// </summary>
    public sealed class ProcessWatch : IDisposable
    {
        // IL2CPP links libc into the player: its symbols resolve through "__Internal". Mono maps
        // "libc" to the C library (its dllmap); both are declared, the build picks one.
        /// <summary>True: libc through "__Internal" (the default under IL2CPP); false: through "libc".</summary>
#if ENABLE_IL2CPP
        public static bool UseInternal = true;
#else
        public static bool UseInternal = false;
#endif
        const int WNOHANG = 1;          // Linux and macOS alike
        const int ESRCH = 3, ECHILD = 10, EINTR = 4;

        [DllImport("libc", EntryPoint = "kill", SetLastError = true)]
        static extern int KillLibc(int pid, int signal);
        [DllImport("libc", EntryPoint = "waitpid", SetLastError = true)]
        static extern int WaitPidLibc(int pid, out int status, int options);
        [DllImport("__Internal", EntryPoint = "kill", SetLastError = true)]
        static extern int KillInternal(int pid, int signal);
        [DllImport("__Internal", EntryPoint = "waitpid", SetLastError = true)]
        static extern int WaitPidInternal(int pid, out int status, int options);

        const uint SYNCHRONIZE = 0x00100000, PROCESS_QUERY_LIMITED_INFORMATION = 0x1000;
        const uint WAIT_OBJECT_0 = 0, WAIT_TIMEOUT = 0x102;
        const int ERROR_INVALID_PARAMETER = 87;

        [DllImport("kernel32", SetLastError = true)]
        static extern IntPtr OpenProcess(uint access, bool inherit, int pid);
        [DllImport("kernel32", SetLastError = true)]
        static extern uint WaitForSingleObject(IntPtr handle, uint milliseconds);
        [DllImport("kernel32", SetLastError = true)]
        static extern bool GetExitCodeProcess(IntPtr handle, out uint exitCode);
        [DllImport("kernel32", SetLastError = true)]
        static extern bool CloseHandle(IntPtr handle);

        static readonly bool Windows = Path.DirectorySeparatorChar == '\\';

        readonly int pid;
        IntPtr handle; // Windows only
        bool exited;
        int? exitCode;
        string unsupported;

        /// <summary>Starts watching <paramref name="pid"/> (it should be running now).</summary>
        public ProcessWatch(int pid)
        {
            if (pid <= 0) throw new ArgumentOutOfRangeException("pid", "a PID is positive");
            this.pid = pid;
            if (!Windows) return;
            try
            {
                handle = OpenProcess(SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, false, pid);
                if (handle == IntPtr.Zero && Marshal.GetLastWin32Error() == ERROR_INVALID_PARAMETER) exited = true;
            }
            catch (Exception e) when (IsMissingEntryPoint(e))
            {
                unsupported = e.GetType().Name;
            }
        }

        public int Pid { get { return pid; } }

        /// <summary>The exit status once <see cref="HasExited"/> and this process could read it
        /// (its own child, or any process on Windows); else null.</summary>
        public int? ExitCode { get { return exitCode; } }

        /// <summary>Why the OS cannot be asked here (no libc or kernel32 entry point), else null:
        /// then <see cref="HasExited"/> is always false and liveness rests on heartbeats.</summary>
        public string Unsupported { get { return unsupported; } }

        /// <summary>True once the process has ended. False while it runs, and when the OS
        /// cannot be asked (<see cref="Unsupported"/>).</summary>
        public bool HasExited
        {
            get
            {
                if (exited || unsupported != null) return exited;
                try
                {
                    exited = Windows ? WindowsExited() : PosixExited();
                }
                catch (Exception e) when (IsMissingEntryPoint(e))
                {
                    unsupported = e.GetType().Name;
                }
                return exited;
            }
        }

        bool PosixExited()
        {
            int status, r;
            do r = UseInternal ? WaitPidInternal(pid, out status, WNOHANG) : WaitPidLibc(pid, out status, WNOHANG);
            while (r < 0 && Marshal.GetLastWin32Error() == EINTR);
            if (r == pid)
            {
                // exited normally: the code is bits 8..15; killed by a signal: 128 + signal, as shells say
                int signal = status & 0x7f;
                exitCode = signal == 0 ? (status >> 8) & 0xff : 128 + signal;
                return true;
            }
            if (r == 0) return false; // our child, running
            // not our child (or the runtime reaped it first): does the PID exist at all?
            if (Marshal.GetLastWin32Error() != ECHILD) return false;
            if ((UseInternal ? KillInternal(pid, 0) : KillLibc(pid, 0)) == 0) return false;
            return Marshal.GetLastWin32Error() == ESRCH; // EPERM: it exists, someone else's
        }

        bool WindowsExited()
        {
            if (handle == IntPtr.Zero) return false; // no access to it: cannot tell, heartbeats decide
            uint wait = WaitForSingleObject(handle, 0);
            if (wait == WAIT_TIMEOUT) return false;
            if (wait != WAIT_OBJECT_0) return false;
            uint code;
            if (GetExitCodeProcess(handle, out code)) exitCode = unchecked((int)code);
            return true;
        }

        static bool IsMissingEntryPoint(Exception e)
        {
            return e is DllNotFoundException || e is EntryPointNotFoundException || e is NotSupportedException;
        }

        public void Dispose()
        {
            if (handle == IntPtr.Zero) return;
            try { CloseHandle(handle); }
            catch (Exception e) when (IsMissingEntryPoint(e)) { }
            handle = IntPtr.Zero;
        }
    }
}
