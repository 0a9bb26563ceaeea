using System;
using System.IO;
using System.Text;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Which sidecar is this game's. A player starts its sidecar on a free port (<c>--endpoint
    /// tcp://127.0.0.1:0</c>, the port read back from <c>--endpoint-file</c>) with a fresh
    /// <c>--instance</c> id per launch; the Editor uses a port and an instance id derived from the
    /// project's path, so each project finds its own sidecar across play modes and two Editors do
    /// not share one. hello's answer echoes the instance: a sidecar with another is refused
    /// (<see cref="IgiError.WrongSidecar"/>), never reused. Plain functions: any thread.
    /// </summary>
    public static class SidecarIdentity
    {
        /// <summary>Editor ports are FirstEditorPort .. FirstEditorPort + EditorPorts - 1: below the
        /// OS's ephemeral ranges (Linux 32768+, Windows and macOS 49152+), so no outgoing
        /// connection holds one by chance.</summary>
        public const int FirstEditorPort = 23000, EditorPorts = 2000;
        /// <summary>The game's launcher hands these to a player that does not start the sidecar itself.</summary>
        public const string EndpointFileVariable = "IGI_SDK_ENDPOINT_FILE", InstanceVariable = "IGI_SDK_INSTANCE";

        static readonly bool Windows = Path.DirectorySeparatorChar == '\\';

        /// <summary>The Editor's port for the project at <paramref name="projectPath"/> (stable).</summary>
        public static int EditorPort(string projectPath)
        {
            return FirstEditorPort + (int)(Fnv1a32(Normalize(projectPath)) % EditorPorts);
        }

        /// <summary>The Editor's instance id for the project (stable, 23 characters).</summary>
        public static string EditorInstance(string projectPath)
        {
            return "editor-" + Fnv1a64(Normalize(projectPath)).ToString("x16");
        }

        /// <summary>A fresh instance id for one launch of a player's sidecar.</summary>
        public static string NewInstance()
        {
            return "game-" + Guid.NewGuid().ToString("N").Substring(0, 24);
        }

        /// <summary>1 to 64 characters of [A-Za-z0-9_.-], as <c>igi-sdk serve --instance</c> takes.</summary>
        public static bool IsValidInstance(string id)
        {
            if (string.IsNullOrEmpty(id) || id.Length > 64) return false;
            foreach (char c in id)
                if (!(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-')) return false;
            return true;
        }

        /// <summary>Where a player's sidecar writes its endpoint: a file of its own per launch.</summary>
        public static string EndpointFilePath(string instance)
        {
            return Path.Combine(Path.Combine(Path.GetTempPath(), "igi-sdk"), instance + ".endpoint");
        }

        /// <summary>The loopback endpoint in the file <c>serve --endpoint-file</c> writes (one line,
        /// written atomically); null while there is none (not yet written, or not a loopback TCP
        /// endpoint: the package connects to nothing else without keys).</summary>
        public static string ReadEndpointFile(string path)
        {
            string text;
            try
            {
                if (string.IsNullOrEmpty(path) || !File.Exists(path)) return null;
                // one short line: anything longer is not the sidecar's, and is not read
                if (new FileInfo(path).Length > 256) return null;
                text = File.ReadAllText(path).Trim();
            }
            catch (IOException) { return null; }
            catch (UnauthorizedAccessException) { return null; }
            const string prefix = "tcp://127.0.0.1:";
            int port;
            if (!text.StartsWith(prefix, StringComparison.Ordinal) || !int.TryParse(text.Substring(prefix.Length), out port)
                || port < 1 || port > 65535) return null;
            return text;
        }

        // one spelling per folder: full, '/' separators, no trailing separator; case folded
        // where file names ignore case (Windows, macOS's default)
        static string Normalize(string projectPath)
        {
            string full = Path.GetFullPath(string.IsNullOrEmpty(projectPath) ? "." : projectPath).Replace('\\', '/').TrimEnd('/');
            bool caseless = Windows || Directory.Exists("/System/Library"); // macOS
            return caseless ? full.ToLowerInvariant() : full;
        }

        static uint Fnv1a32(string text)
        {
            uint hash = 2166136261;
            foreach (byte b in Encoding.UTF8.GetBytes(text)) { hash ^= b; hash *= 16777619; }
            return hash;
        }

        static ulong Fnv1a64(string text)
        {
            ulong hash = 14695981039346656037;
            foreach (byte b in Encoding.UTF8.GetBytes(text)) { hash ^= b; hash *= 1099511628211; }
            return hash;
        }
    }
}
