using System.IO;
using Igi.Sdk.Unity;
using UnityEditor;
using UnityEngine;

namespace Igi.Sdk.Editor
{
    /// <summary>
    /// Editor menu: the sidecar's log and save folder (outside the project), and stopping the
    /// sidecar the Editor keeps between play modes (it keeps the settings it was started with).
    /// </summary>
    public static class IgiSdkMenu
    {
        const double StopWaitSeconds = 5;

        [MenuItem("Igi SDK/Open Sidecar Log")]
        static void OpenSidecarLog()
        {
            string log = IgiSidecar.DefaultLogPath();
            if (File.Exists(log)) EditorUtility.RevealInFinder(log);
            else Debug.Log("Igi SDK: no sidecar log yet (" + log + "); it is written once a sidecar is started");
        }

        [MenuItem("Igi SDK/Open Save Folder")]
        static void OpenSaveFolder()
        {
            string folder = IgiSidecar.DefaultSaveFolder();
            Directory.CreateDirectory(folder);
            EditorUtility.RevealInFinder(folder);
        }

        [MenuItem("Igi SDK/Stop Editor Sidecar")]
        static void StopEditorSidecar()
        {
            if (EditorApplication.isPlaying)
            {
                Debug.Log("Igi SDK: leave play mode first (the game is using the sidecar)");
                return;
            }
#if UNITY_2023_1_OR_NEWER
            var scene = Object.FindAnyObjectByType<IgiSidecar>();
#else
            var scene = Object.FindObjectOfType<IgiSidecar>();
#endif
            // the scene's port, else the project's own (the Editor's sidecar is started there)
            string project = System.IO.Path.GetDirectoryName(Application.dataPath);
            bool automatic = scene == null || scene.Port == 0;
            int port = automatic ? SidecarIdentity.EditorPort(project) : scene.Port;
            string endpoint = SidecarArguments.Endpoint(port);
            var client = new IgiClient(new IgiClientOptions
            {
                Endpoint = endpoint, ClientName = "Unity Editor menu",
                ExpectedInstance = automatic ? SidecarIdentity.EditorInstance(project) : null, // never another project's
                LaunchToken = SidecarKeys.LaunchToken(port), // only the game (this Editor) may shut it down
            });
            IgiRequest shutdown = client.Shutdown();
            double giveUpAt = EditorApplication.timeSinceStartup + StopWaitSeconds;
            // pumped by the Editor's update loop: the menu returns at once
            EditorApplication.CallbackFunction pump = null;
            pump = () =>
            {
                client.Pump();
                if (!shutdown.IsDone && EditorApplication.timeSinceStartup < giveUpAt) return;
                EditorApplication.update -= pump;
                Debug.Log(shutdown.Succeeded
                    ? "Igi SDK: the sidecar on " + endpoint + " is stopping; the next Play starts a new one"
                    : "Igi SDK: no sidecar answered on " + endpoint);
                client.Dispose();
            };
            EditorApplication.update += pump;
        }
    }
}
