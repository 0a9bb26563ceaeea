using System;
using System.Collections.Generic;
using System.IO;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Finds the <c>igi-sdk</c> executable. Order: the path set in the Inspector, the
    /// <c>IGI_SDK_EXE</c> environment variable, a sidecar bundled under StreamingAssets, then
    /// <c>PATH</c>. Plain file checks only: callers run it off the main thread anyway.
    /// </summary>
    public static class SidecarLocator
    {
        public const string EnvironmentVariable = "IGI_SDK_EXE";
        public const string BundledFolder = "igi-sdk";

        /// <summary>Where <see cref="Find"/> looks, in order (for error messages and docs).</summary>
        public static List<string> Candidates(string configured, string streamingAssets, bool windows)
        {
            var names = windows ? new[] { "igi-sdk.exe", "igi-sdk.cmd", "igi-sdk.bat" } : new[] { "igi-sdk" };
            var found = new List<string>();
            if (!string.IsNullOrEmpty(configured)) found.Add(configured);
            string env = Environment.GetEnvironmentVariable(EnvironmentVariable);
            if (!string.IsNullOrEmpty(env)) found.Add(env);
            if (!string.IsNullOrEmpty(streamingAssets))
            {
                // a frozen sidecar (one folder) or a virtual environment copied into the build
                string root = Path.Combine(streamingAssets, BundledFolder);
                foreach (string sub in new[] { "", "bin", "Scripts", Path.Combine(".venv", "bin"), Path.Combine(".venv", "Scripts") })
                    foreach (string name in names)
                        found.Add(Path.Combine(Path.Combine(root, sub), name));
            }
            string path = Environment.GetEnvironmentVariable("PATH") ?? "";
            foreach (string dir in path.Split(Path.PathSeparator))
            {
                if (dir.Length == 0) continue;
                foreach (string name in names)
                    found.Add(Path.Combine(dir.Trim('"'), name));
            }
            return found;
        }

        /// <summary>The first candidate that exists, or null.</summary>
        public static string Find(string configured, string streamingAssets, bool windows)
        {
            foreach (string candidate in Candidates(configured, streamingAssets, windows))
            {
                try
                {
                    if (File.Exists(candidate)) return Path.GetFullPath(candidate);
                }
                catch (Exception)
                {
                    // a malformed PATH entry is not worth failing the search for
                }
            }
            return null;
        }
    }
}
