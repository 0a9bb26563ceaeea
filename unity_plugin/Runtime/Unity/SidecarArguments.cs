using System.Collections.Generic;
using System.IO;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// The <c>igi-sdk serve</c> command line for this game. A plain function of its inputs
    /// (read from Unity on the main thread beforehand), so it can run on any thread.
    /// </summary>
    public static class SidecarArguments
    {
        public static List<string> Build(string endpoint, int gamePid, string saveDir,
            string modelDir, string model, string streamingAssets, IList<string> extra)
        {
            return Build(endpoint, gamePid, saveDir, modelDir, model, streamingAssets, extra, null, null);
        }

        /// <summary>With the sidecar's identity: <paramref name="instance"/> (hello echoes it) and
        /// the file it writes its bound endpoint to (for <c>tcp://127.0.0.1:0</c>); null: none.</summary>
        public static List<string> Build(string endpoint, int gamePid, string saveDir,
            string modelDir, string model, string streamingAssets, IList<string> extra,
            string instance, string endpointFile)
        {
            var args = new List<string> { "serve", "--endpoint", endpoint, "--save-dir", saveDir };
            if (instance != null) { args.Add("--instance"); args.Add(instance); }
            if (endpointFile != null) { args.Add("--endpoint-file"); args.Add(endpointFile); }
            // the sidecar exits by itself within 2 s after this process ends, crash included
            args.Add("--game-pid");
            args.Add(gamePid.ToString());
            if (!string.IsNullOrEmpty(modelDir))
            {
                args.Add("--model-dir");
                args.Add(ResolveModelDir(modelDir, streamingAssets));
            }
            if (!string.IsNullOrEmpty(model))
            {
                args.Add("--model");
                args.Add(model);
            }
            if (extra != null)
                foreach (string arg in extra)
                    if (!string.IsNullOrEmpty(arg)) args.Add(arg);
            return args;
        }

        /// <summary>A relative model folder is inside StreamingAssets (shipped with the build).</summary>
        public static string ResolveModelDir(string modelDir, string streamingAssets)
        {
            if (Path.IsPathRooted(modelDir) || string.IsNullOrEmpty(streamingAssets)) return modelDir;
            return Path.GetFullPath(Path.Combine(streamingAssets, modelDir));
        }

        public static string Endpoint(int port)
        {
            return "tcp://127.0.0.1:" + port;
        }
    }
}
