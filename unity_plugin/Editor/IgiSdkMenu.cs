using System.IO;
using Igi.Sdk.Unity;
using UnityEditor;
using UnityEngine;

namespace Igi.Sdk.Editor
{
    /// <summary>Editor menu: the sidecar's log and save folder, which live outside the project.</summary>
    public static class IgiSdkMenu
    {
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
    }
}
