// A minimal stand-in for the parts of UnityEditor that unity_plugin/Editor uses, so that mcs can
// type-check the package's Editor code outside Unity (with UnityEngineStub.cs).
using System;

namespace UnityEditor
{
    [AttributeUsage(AttributeTargets.Method, AllowMultiple = true)]
    public sealed class MenuItem : Attribute
    {
        public MenuItem(string itemName) { }
    }

    public static class EditorUtility
    {
        public static void RevealInFinder(string path) { }
    }

    public static class EditorApplication
    {
        public delegate void CallbackFunction();

        public static CallbackFunction update;
        public static bool isPlaying { get { return false; } }
        public static double timeSinceStartup { get { return 0; } }
    }
}
