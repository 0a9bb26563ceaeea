// Drives the package's Unity layer outside Unity, against a real sidecar: the components'
// Awake/Start/Update/OnApplicationQuit/OnDestroy are called by hand (through reflection: this is
// test code, not part of the package) with UnityEngineStub.cs standing in for the engine.
// Modes: basic (stream, save/restore, cancel, priority, VRAM reservations, health), editor
// (a second "play mode" adopts the session the first left; IGI_STUB_EDITOR=1), crash (the test
// kills the sidecar after "waiting for the sidecar to be killed"; it is restarted, the session
// opened again), units (quoting, back-off, arguments, locator; no sidecar), refused (a model folder that does not exist: Failed, not restarted). Prints PASS/FAIL lines; exit status 1 on any failure.
// Environment: IGI_SDK_EXE (the sidecar), IGI_STUB_DATA (persistentDataPath), SMOKE_PORT.
using System;
using System.Collections.Generic;
using System.Reflection;
using System.Threading;
using Igi.Sdk;
using Igi.Sdk.Unity;
using UnityEngine;

static class Smoke
{
    static readonly List<MonoBehaviour> Live = new List<MonoBehaviour>();

    static void Call(object o, string method)
    {
        var m = o.GetType().GetMethod(method, BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public);
        if (m != null) m.Invoke(o, null);
    }

    static void ResetStatics(Type t)
    {
        var m = t.GetMethod("ResetStatics", BindingFlags.Static | BindingFlags.NonPublic);
        m.Invoke(null, null);
    }

    static T Add<T>(string name) where T : MonoBehaviour, new()
    {
        var c = new GameObject(name).AddComponent<T>();
        Call(c, "Awake");
        Call(c, "OnEnable"); // as Unity does, right after Awake
        Live.Add(c);
        return c;
    }

    static void StartAll() { foreach (var c in Live.ToArray()) Call(c, "Start"); }

    static bool Frames(Func<bool> until, double seconds)
    {
        var end = DateTime.UtcNow.AddSeconds(seconds);
        while (DateTime.UtcNow < end)
        {
            foreach (var c in Live.ToArray()) Call(c, "Update");
            if (until()) return true;
            Thread.Sleep(16);
        }
        return false;
    }

    static void Check(bool ok, string what)
    {
        Console.WriteLine((ok ? "PASS " : "FAIL ") + what);
        if (!ok) { Environment.ExitCode = 1; }
    }

    static void Quit()
    {
        foreach (var c in Live) Call(c, "OnApplicationQuit");
        foreach (var c in Live) Call(c, "OnDisable");
        foreach (var c in Live) Call(c, "OnDestroy");
        Live.Clear();
        ResetStatics(typeof(IgiSidecar));
        ResetStatics(typeof(NpcDialogue));
    }

    static void Units()
    {
        Environment.SetEnvironmentVariable(SidecarLocator.EnvironmentVariable, null); // the search order itself is tested
        // Windows: CommandLineToArgvW rules (backslashes doubled only before a quote)
        Check(CommandLine.QuoteWindows(@"C:\a b\") == "\"C:\\a b\\\\\"", "QuoteWindows trailing backslash");
        Check(CommandLine.QuoteWindows("x\\\"y") == "\"x\\\\\\\"y\"", "QuoteWindows backslash before a quote");
        Check(CommandLine.QuoteWindows("plain") == "plain" && CommandLine.QuoteWindows("") == "\"\"", "QuoteWindows plain and empty");
        Check(CommandLine.Join(new[] { "a&b", "c" }, true, true) == "\"a&b\" \"c\"", "Join for cmd quotes everything");
        Check(CommandLine.QuotePosix("$HOME `x` \"q\" \\") == "\"\\$HOME \\`x\\` \\\"q\\\" \\\\\"", "QuotePosix escapes $ ` \" \\");
        var backoff = new RestartBackoff { MinSeconds = 1, MaxSeconds = 30 };
        var delays = new List<float>();
        for (int i = 0; i < 7; i++) delays.Add(backoff.NextDelay());
        Check(string.Join(",", delays.ConvertAll(d => d.ToString()).ToArray()) == "1,2,4,8,16,30,30", "back-off doubles to its cap: " + string.Join(",", delays.ConvertAll(d => d.ToString()).ToArray()));
        backoff.Ended(120);
        Check(backoff.NextDelay() == 1, "back-off resets after a stable run");
        var argv = SidecarArguments.Build("tcp://127.0.0.1:5599", 42, "/save", "Models", "npc.gguf", "/game/StreamingAssets", new[] { "--ctx", "", "8192" });
        Check(string.Join(" ", argv.ToArray()) == "serve --endpoint tcp://127.0.0.1:5599 --save-dir /save --game-pid 42 --model-dir /game/StreamingAssets/Models --model npc.gguf --ctx 8192",
            "serve arguments: " + string.Join(" ", argv.ToArray()));
        string root = System.IO.Path.Combine(Application.persistentDataPath, "StreamingAssets");
        string bundled = System.IO.Path.Combine(System.IO.Path.Combine(System.IO.Path.Combine(root, "igi-sdk"), "bin"), "igi-sdk");
        System.IO.Directory.CreateDirectory(System.IO.Path.GetDirectoryName(bundled));
        System.IO.File.WriteAllText(bundled, "");
        Check(SidecarLocator.Find("", root, false) == System.IO.Path.GetFullPath(bundled), "a sidecar bundled in StreamingAssets is found (before PATH)");
        Check(SidecarLocator.Find(bundled + ".configured", root, false) == System.IO.Path.GetFullPath(bundled), "a configured path that does not exist is skipped");
        // owner keys and launch tokens: kept in the process environment, renewed per sidecar started
        Environment.SetEnvironmentVariable(SidecarKeys.TokenVariable, null);
        string owner = SidecarKeys.OwnerKey(7001);
        Check(IgiKeys.Problem(owner) == null && SidecarKeys.OwnerKey(7001) == owner, "the owner key is kept");
        Check(SidecarKeys.OwnerKey(7002) != owner, "one per port");
        Check(SidecarKeys.LaunchToken(7001) == null, "no token before a sidecar is started");
        string token = SidecarKeys.Renew(7001);
        Check(IgiKeys.Problem(token) == null && SidecarKeys.LaunchToken(7001) == token, "Renew keeps the new token");
        Check(SidecarKeys.OwnerKey(7001) != owner, "Renew makes a new owner key (a new sidecar holds no sessions)");
        SidecarKeys.ForgetLaunchToken(7001);
        Environment.SetEnvironmentVariable(SidecarKeys.TokenVariable, "a-developers-own-token-0001");
        Check(SidecarKeys.LaunchToken(7001) == "a-developers-own-token-0001", "IGI_SDK_TOKEN of this process when none is kept");
        Environment.SetEnvironmentVariable(SidecarKeys.TokenVariable, null);
        var child = new System.Diagnostics.ProcessStartInfo("true").EnvironmentVariables;
        SidecarKeys.RemoveFrom(child);
        bool leaked = false;
        foreach (string name in child.Keys) leaked |= name.ToUpperInvariant().StartsWith("IGI_SDK_UNITY_");
        Check(!leaked && child.ContainsKey("PATH"), "a child's environment keeps PATH and loses the owner keys");
    }

    // Linux: what every local process can read (/proc/*/cmdline) must not hold the token; the
    // sidecar's own environment must.
    static void CheckTokenOnlyInTheEnvironment(string token)
    {
        if (!System.IO.Directory.Exists("/proc/self")) return;
        bool inCommandLine = false, inEnvironment = false;
        foreach (string dir in System.IO.Directory.GetDirectories("/proc"))
        {
            try
            {
                if (System.IO.File.ReadAllText(System.IO.Path.Combine(dir, "cmdline")).Contains(token)) inCommandLine = true;
                if (System.IO.File.ReadAllText(System.IO.Path.Combine(dir, "environ")).Contains(SidecarKeys.TokenVariable + "=" + token)) inEnvironment = true;
            }
            catch (Exception) { } // processes of others, or gone
        }
        Check(!inCommandLine, "the launch token is on no process's command line");
        Check(inEnvironment, "the sidecar has the launch token in its environment (IGI_SDK_TOKEN)");
    }

    static int Main(string[] args)
    {
        string mode = args.Length > 0 ? args[0] : "basic";
        if (mode == "units") { Units(); return Environment.ExitCode; }
        var sidecar = Add<IgiSidecar>("Igi Sidecar");
        sidecar.Port = int.Parse(Environment.GetEnvironmentVariable("SMOKE_PORT") ?? "5611");
        Add<VramReporter>("Igi Sidecar");
        if (mode == "refused")
        {
            // igi-sdk refuses a model folder that does not exist (exit status 2): no restart loop
            sidecar.ModelDir = System.IO.Path.Combine(Application.persistentDataPath, "no-such-models");
            StartAll();
            Check(Frames(() => sidecar.State == SidecarState.Failed, 120), "refused settings: " + sidecar.State + " " + sidecar.LastError);
            Check(sidecar.LastError != null && sidecar.LastError.StartsWith("sidecar_refused"), "reported as sidecar_refused");
            Quit();
            return Environment.ExitCode;
        }
        var brom = Add<NpcDialogue>("Brom");
        brom.Persona = "Brom";
        brom.SystemPrompt = "You are Brom, the blacksmith. Answer in one short sentence.";
        brom.MaxTokens = 24;
        var tokens = new List<string>();
        var errors = new List<string>();
        string reply = null;
        brom.OnToken += t => tokens.Add(t);
        brom.OnReply += r => reply = r;
        brom.OnError += (c, m) => { errors.Add(c); Console.WriteLine("  error " + c + ": " + m); };
        StartAll();
        Check(Frames(() => sidecar.IsReady, 180), "sidecar ready (state " + sidecar.State + ", started here " + sidecar.StartedHere + ", " + sidecar.LastError + ")");
        Check(brom.Say("Hello there!"), "Say accepted before the session is ready");
        Check(Frames(() => reply != null, 60), "reply: " + reply + " (" + tokens.Count + " tokens, session " + brom.SessionId + ")");
        Check(string.Join("", tokens) == reply, "tokens join to the reply");
        int port = sidecar.Port;
        if (sidecar.StartedHere)
        {
            Check(sidecar.IsGame, "the game holds the token of the sidecar it started");
            Check(sidecar.Client.Options.LaunchToken == SidecarKeys.LaunchToken(port) && sidecar.Client.Options.OwnerKey == SidecarKeys.OwnerKey(port), "the client uses the kept keys");
            CheckTokenOnlyInTheEnvironment(SidecarKeys.LaunchToken(port));
        }

        if (mode == "basic")
        {
            var save = brom.SaveTo("smoke-save");
            Check(Frames(() => save.IsCompleted, 30) && save.Result, "SaveTo");
            reply = null; brom.Say("What do you sell?");
            Frames(() => reply != null, 60);
            var restore = brom.RestoreFrom("smoke-save");
            Check(Frames(() => restore.IsCompleted, 30) && restore.Result, "RestoreFrom -> session " + brom.SessionId);
            var bad = brom.RestoreFrom("no-such-save");
            Check(Frames(() => bad.IsCompleted, 30) && !bad.Result && brom.SessionId == "npc.Brom.b", "failed restore keeps the session " + brom.SessionId);
            brom.FacingPlayer = true;
            Frames(() => false, 0.3);
            reply = null; tokens.Clear(); brom.Say("Tell me a long story about your forge and your family.");
            Frames(() => tokens.Count >= 2, 60);
            brom.Cancel();
            Check(Frames(() => reply != null, 30) && brom.LastFinishReason == "cancelled", "Cancel ends with OnReply, cancelled: " + brom.LastFinishReason);
            var vram = sidecar.ReserveVram(1 << 20);
            Check(Frames(() => vram.IsCompleted, 10), "ReserveVram completes: " + (vram.IsCompleted ? vram.Result.ToString() : "-"));
            var stuck = sidecar.ReserveVramCoroutine(1 << 20);
            Frames(() => !stuck.keepWaiting, 10);
            Check(!stuck.keepWaiting, "ReserveVramCoroutine: granted " + stuck.Granted + " " + stuck.ErrorCode);
            Check(sidecar.SecondsSinceLastAnswer < 3, "health: last answer " + sidecar.SecondsSinceLastAnswer + " s ago");
        }
        if (mode == "editor")
        {
            string before = brom.SessionId;
            Quit(); // leave play mode: goodbye keep_sessions (IGI_STUB_EDITOR=1)
            sidecar = Add<IgiSidecar>("Igi Sidecar");
            sidecar.Port = int.Parse(Environment.GetEnvironmentVariable("SMOKE_PORT") ?? "5611");
            brom = Add<NpcDialogue>("Brom");
            errors.Clear();
            brom.OnError += (c, m) => { errors.Add(c); Console.WriteLine("  error " + c + ": " + m); };
            StartAll();
            Check(Frames(() => brom.IsReady, 60), "second play mode: session " + brom.SessionId + " (started here " + sidecar.StartedHere + ")");
            Check(brom.SessionId == before && errors.Count == 0, "adopted " + before + ", errors: " + string.Join(",", errors.ToArray()));
            Check(!sidecar.StartedHere && sidecar.IsGame, "the second play mode is still the game (the token survived the reload)");
        }
        if (mode == "crash")
        {
            Console.WriteLine("waiting for the sidecar to be killed");
            Console.Out.Flush();
            Check(Frames(() => sidecar.State == SidecarState.Restarting || !sidecar.IsReady, 60), "crash noticed: " + sidecar.State + " " + sidecar.LastError);
            Check(Frames(() => brom.IsReady && sidecar.IsReady, 180), "restarted; session " + brom.SessionId);
            Check(errors.Contains("session_lost"), "session_lost raised");
            Check(sidecar.IsGame, "the restarted sidecar's new token reached the client");
        }
        Quit();
        return Environment.ExitCode;
    }
}
