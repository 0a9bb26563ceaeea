using System;
using System.Collections.Specialized;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// The game's owner key and the launch token of the sidecar it started, per port.
    ///
    /// Where they are kept: in this process's own environment
    /// (<see cref="Environment.SetEnvironmentVariable(string, string)"/>, process scope), not in a
    /// static field. In the Editor, entering play mode reloads the scripting domain, which clears
    /// every static, while
    /// the Editor process and the sidecar it started live on: the process environment survives the
    /// reload, so the next play mode is the game again (the token) and adopts the NPCs the last one
    /// left (the owner key). It lives in memory only and ends with the process. Not EditorPrefs or
    /// PlayerPrefs: they write plain text to the registry or a file, readable by other programs and
    /// by later runs; not SessionState: it is Editor-only (this is runtime code, and a player needs
    /// the same thing). Child processes inherit the environment; the sidecar's own start removes
    /// these variables (<see cref="RemoveFrom"/>) and gets the token as IGI_SDK_TOKEN only.
    ///
    /// Both are renewed whenever this game starts a sidecar (<see cref="Renew"/>): a new sidecar
    /// holds no sessions yet, so a new owner key loses nothing, and a key that ever reached another
    /// process on the port (while ours was down) is worth nothing to it.
    /// </summary>
    public static class SidecarKeys
    {
        /// <summary>The variable a sidecar reads its launch token from.</summary>
        public const string TokenVariable = "IGI_SDK_TOKEN";
        const string Prefix = "IGI_SDK_UNITY_";

        static string OwnerVariable(int port) { return Prefix + "OWNER_" + port; }
        static string LaunchVariable(int port) { return Prefix + "TOKEN_" + port; }

        /// <summary>The owner key for the sidecar on <paramref name="port"/>: the one kept, or a new
        /// one (kept from then on).</summary>
        public static string OwnerKey(int port)
        {
            string key = Read(OwnerVariable(port));
            if (key != null) return key;
            key = IgiKeys.New();
            Environment.SetEnvironmentVariable(OwnerVariable(port), key);
            return key;
        }

        /// <summary>The launch token of the sidecar this process started on <paramref name="port"/>;
        /// else IGI_SDK_TOKEN of this process (a developer who starts the sidecar and the game with
        /// the same token); else null.</summary>
        public static string LaunchToken(int port)
        {
            return Read(LaunchVariable(port)) ?? Read(TokenVariable);
        }

        /// <summary>Before starting a sidecar on <paramref name="port"/>: a new launch token and a
        /// new owner key, kept. Returns the token (hand it to the child as IGI_SDK_TOKEN).</summary>
        public static string Renew(int port)
        {
            string token = IgiKeys.New();
            Environment.SetEnvironmentVariable(LaunchVariable(port), token);
            Environment.SetEnvironmentVariable(OwnerVariable(port), IgiKeys.New());
            return token;
        }

        /// <summary>The sidecar on the port refused the token kept for it (it is not the one this
        /// process started): forget it.</summary>
        public static void ForgetLaunchToken(int port)
        {
            Environment.SetEnvironmentVariable(LaunchVariable(port), null);
        }

        static string LaunchRecordVariable(int port) { return Prefix + "LAUNCH_" + port; }

        /// <summary>Keeps what a reloaded scripting domain needs to find the sidecar this process
        /// started for <paramref name="port"/> (0: the player's free port) again: its PID, its
        /// instance id, its endpoint and log.</summary>
        public static void KeepLaunch(int port, int pid, string instance, string endpoint, string logPath)
        {
            Environment.SetEnvironmentVariable(LaunchRecordVariable(port), pid + "|" + instance + "|" + endpoint + "|" + logPath);
        }

        /// <summary>The launch kept for <paramref name="port"/>, if any.</summary>
        public static bool KeptLaunch(int port, out int pid, out string instance, out string endpoint, out string logPath)
        {
            pid = 0;
            instance = endpoint = logPath = null;
            string value = Environment.GetEnvironmentVariable(LaunchRecordVariable(port));
            if (value == null) return false;
            string[] parts = value.Split(new[] { '|' }, 4);
            if (parts.Length != 4 || !int.TryParse(parts[0], out pid) || pid <= 0 || !SidecarIdentity.IsValidInstance(parts[1])) return false;
            instance = parts[1];
            endpoint = parts[2];
            logPath = parts[3];
            return true;
        }

        public static void ForgetLaunch(int port)
        {
            Environment.SetEnvironmentVariable(LaunchRecordVariable(port), null);
        }

        /// <summary>Takes this process's keys out of a child's environment.</summary>
        public static void RemoveFrom(StringDictionary environment)
        {
            var names = new string[environment.Count];
            environment.Keys.CopyTo(names, 0);
            foreach (string name in names)
                if (name.StartsWith(Prefix, StringComparison.OrdinalIgnoreCase)) environment.Remove(name);
        }

        // a value that is not a valid key (set by hand, truncated) counts as none
        static string Read(string variable)
        {
            string value = Environment.GetEnvironmentVariable(variable);
            return value != null && IgiKeys.Problem(value) == null ? value : null;
        }
    }
}
