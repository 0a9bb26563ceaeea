// Which library the PID checks call is fixed when the player is built, by Unity's platform
// defines. IL2CPP turns "__Internal" into a direct reference to the C symbol, resolved when the
// player links: Windows' CRT has no kill or waitpid (LNK2019), so "__Internal" is kept to the
// iOS-family players, whose native code is linked into the app with libSystem. Desktop players
// name their library and load it when first called: kernel32 on Windows, libc on Linux,
// libSystem on macOS.
// The Editor follows the machine it runs on, not the build target (an Editor on Windows
// switched to iOS still calls kernel32).
#if UNITY_EDITOR_WIN || (UNITY_STANDALONE_WIN && !UNITY_EDITOR)
#define IGI_PID_WINDOWS
#elif UNITY_EDITOR_OSX || (UNITY_STANDALONE_OSX && !UNITY_EDITOR)
#define IGI_PID_POSIX
#define IGI_PID_LIBSYSTEM
#elif UNITY_EDITOR_LINUX || ((UNITY_STANDALONE_LINUX || UNITY_ANDROID) && !UNITY_EDITOR)
#define IGI_PID_POSIX
#elif (UNITY_IOS || UNITY_TVOS || UNITY_VISIONOS) && !UNITY_EDITOR
#define IGI_PID_POSIX
#define IGI_PID_INTERNAL
#elif UNITY_WEBGL && !UNITY_EDITOR
#define IGI_PID_NONE
#else
// outside Unity (mono or .NET running the package's tests) or a platform not named above:
// both named libraries are declared and the OS is told apart at run time
#define IGI_PID_ANY
#endif
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
    /// No call allocates managed memory; each is one system call. Every signature is blittable
    /// (ints, pointers, <c>out</c> of an int) with its calling convention spelled out, so IL2CPP
    /// needs no marshalling code for them.
    /// </summary>
    public sealed class ProcessWatch : IDisposable
    {
#if IGI_PID_INTERNAL
        const string LibC = "__Internal"; // linked into the app with libSystem
#elif IGI_PID_LIBSYSTEM
        // a full path: found in the dyld shared cache on every macOS, no search-path rules
        const string LibC = "/usr/lib/libSystem.dylib";
#elif IGI_PID_POSIX || IGI_PID_ANY
        const string LibC = "libc"; // Mono and IL2CPP on Linux open the C library by this name
#endif

#if IGI_PID_WINDOWS
        /// <summary>The library the checks call in this build: "kernel32", "libc",
        /// "/usr/lib/libSystem.dylib", "__Internal" (iOS-family players), or null where a
        /// player runs no processes (WebGL).</summary>
        public static readonly string Library = "kernel32";
        static readonly bool Windows = true; // readonly, not const: the other branch stays compiled-in and warning-free
#elif IGI_PID_NONE
        public static readonly string Library = null;
        static readonly bool Windows = false;
#elif IGI_PID_ANY
        static readonly bool Windows = Path.DirectorySeparatorChar == '\\';
        public static readonly string Library = Windows ? "kernel32" : LibC;
#else
        public static readonly string Library = LibC;
        static readonly bool Windows = false;
#endif

#if IGI_PID_POSIX || IGI_PID_ANY
        const int WNOHANG = 1;          // Linux and macOS alike
        const int ESRCH = 3, ECHILD = 10, EINTR = 4;

        [DllImport(LibC, EntryPoint = "kill", CallingConvention = CallingConvention.Cdecl, SetLastError = true)]
        static extern int Kill(int pid, int signal);
        [DllImport(LibC, EntryPoint = "waitpid", CallingConvention = CallingConvention.Cdecl, SetLastError = true)]
        static extern int WaitPid(int pid, out int status, int options);
#endif

#if IGI_PID_WINDOWS || IGI_PID_ANY
        const uint SYNCHRONIZE = 0x00100000, PROCESS_QUERY_LIMITED_INFORMATION = 0x1000;
        const uint WAIT_OBJECT_0 = 0, WAIT_TIMEOUT = 0x102;
        const int ERROR_INVALID_PARAMETER = 87;

        // BOOLs as int: blittable, no bool marshalling
        [DllImport("kernel32", CallingConvention = CallingConvention.Winapi, ExactSpelling = true, SetLastError = true)]
        static extern IntPtr OpenProcess(uint access, int inherit, int pid);
        [DllImport("kernel32", CallingConvention = CallingConvention.Winapi, ExactSpelling = true, SetLastError = true)]
        static extern uint WaitForSingleObject(IntPtr handle, uint milliseconds);
        [DllImport("kernel32", CallingConvention = CallingConvention.Winapi, ExactSpelling = true, SetLastError = true)]
        static extern int GetExitCodeProcess(IntPtr handle, out uint exitCode);
        [DllImport("kernel32", CallingConvention = CallingConvention.Winapi, ExactSpelling = true, SetLastError = true)]
        static extern int CloseHandle(IntPtr handle);
#endif

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
#if IGI_PID_NONE
            unsupported = "no processes on this platform";
            exitCode = null; // never known here
#elif IGI_PID_WINDOWS || IGI_PID_ANY
            if (!Windows) return;
            try
            {
                handle = OpenProcess(SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
                if (handle == IntPtr.Zero && Marshal.GetLastWin32Error() == ERROR_INVALID_PARAMETER) exited = true;
            }
            catch (Exception e) when (IsMissingEntryPoint(e))
            {
                unsupported = e.GetType().Name;
            }
#endif
        }

        public int Pid { get { return pid; } }

        /// <summary>The exit status once <see cref="HasExited"/> and this process could read it
        /// (its own child, or any process on Windows); else null.</summary>
        public int? ExitCode { get { return exitCode; } }

        /// <summary>Why the OS cannot be asked here (no libc or kernel32 entry point, a platform
        /// without processes), else null: then <see cref="HasExited"/> is always false and
        /// liveness rests on heartbeats.</summary>
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
#if IGI_PID_POSIX || IGI_PID_ANY
            int status, r;
            do r = WaitPid(pid, out status, WNOHANG);
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
            if (Kill(pid, 0) == 0) return false;
            return Marshal.GetLastWin32Error() == ESRCH; // EPERM: it exists, someone else's
#else
            return false;
#endif
        }

        bool WindowsExited()
        {
#if IGI_PID_WINDOWS || IGI_PID_ANY
            if (handle == IntPtr.Zero) return false; // no access to it: cannot tell, heartbeats decide
            uint wait = WaitForSingleObject(handle, 0);
            if (wait == WAIT_TIMEOUT) return false;
            if (wait != WAIT_OBJECT_0) return false;
            uint code;
            if (GetExitCodeProcess(handle, out code) != 0) exitCode = unchecked((int)code);
            return true;
#else
            return false;
#endif
        }

        static bool IsMissingEntryPoint(Exception e)
        {
            return e is DllNotFoundException || e is EntryPointNotFoundException || e is NotSupportedException;
        }

        public void Dispose()
        {
            if (handle == IntPtr.Zero) return;
#if IGI_PID_WINDOWS || IGI_PID_ANY
            try { CloseHandle(handle); }
            catch (Exception e) when (IsMissingEntryPoint(e)) { }
#endif
            handle = IntPtr.Zero;
        }
    }
}
