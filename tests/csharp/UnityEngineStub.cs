// A minimal stand-in for the parts of UnityEngine that unity_plugin/Runtime/Unity and the
// sample use, so that mono's mcs can type-check them outside Unity. Signatures follow Unity's;
// add a member here only when the package starts using it. The few bodies that matter to a run
// outside Unity (a smoke test driving the components by hand) do the plain thing: real time,
// a data folder from IGI_STUB_DATA, the Editor when IGI_STUB_EDITOR=1, logs on stderr.
using System;
using System.Collections;

namespace UnityEngine
{
    public class Object
    {
        public string name { get; set; }
        public static void DontDestroyOnLoad(Object target) { }
        public static void Destroy(Object obj) { }
        public static T FindObjectOfType<T>() where T : Object { return null; }
        public static T FindAnyObjectByType<T>() where T : Object { return null; }
        public static T FindFirstObjectByType<T>() where T : Object { return null; }
    }

    public class Component : Object
    {
        public GameObject gameObject { get { return null; } }
        public T GetComponent<T>() { return default(T); }
    }

    public class Behaviour : Component
    {
    }

    public class MonoBehaviour : Behaviour
    {
        // outside Unity nothing runs coroutines: the smoke program and tests drive Update by hand
        public Coroutine StartCoroutine(IEnumerator routine) { return null; }
    }

    public class YieldInstruction { }

    public sealed class Coroutine : YieldInstruction { }

    public class AsyncOperation : YieldInstruction
    {
        public bool isDone { get { return true; } }
        public float progress { get { return 1f; } }
    }

    public sealed class GameObject : Object
    {
        public GameObject(string name) { this.name = name; }
        public T AddComponent<T>() where T : Component, new() { var c = new T(); c.name = name; return c; }
    }

    public abstract class CustomYieldInstruction : IEnumerator
    {
        public abstract bool keepWaiting { get; }
        public object Current { get { return null; } }
        public bool MoveNext() { return keepWaiting; }
        public void Reset() { }
    }

    public static class Time
    {
        public static float unscaledDeltaTime { get { return 0.016f; } }
        static readonly System.Diagnostics.Stopwatch Clock = System.Diagnostics.Stopwatch.StartNew();
        public static float realtimeSinceStartup { get { return (float)Clock.Elapsed.TotalSeconds; } }
        public static int frameCount { get { return 0; } }
    }

    public static class Application
    {
        public static string persistentDataPath { get { return Environment.GetEnvironmentVariable("IGI_STUB_DATA") ?? "."; } }
        public static string dataPath { get { return System.IO.Path.Combine(Environment.GetEnvironmentVariable("IGI_STUB_PROJECT") ?? persistentDataPath, "Assets"); } }
        public static string streamingAssetsPath { get { return System.IO.Path.Combine(persistentDataPath, "StreamingAssets"); } }
        public static bool isEditor { get { return Environment.GetEnvironmentVariable("IGI_STUB_EDITOR") == "1"; } }
        public static int targetFrameRate { get; set; }
        public static string productName { get { return ""; } }
    }

    public static class Debug
    {
        public static void Log(object message) { Console.Error.WriteLine(message); }
        public static void LogWarning(object message) { Console.Error.WriteLine("warning: " + message); }
        public static void LogError(object message) { Console.Error.WriteLine("error: " + message); }
        public static void LogException(Exception exception) { Console.Error.WriteLine(exception); }
    }

    public static class SystemInfo
    {
        public static int graphicsMemorySize { get { return 0; } }
    }

    public static class Screen
    {
        public static int width { get { return 0; } }
        public static int height { get { return 0; } }
    }

    public struct Rect
    {
        public Rect(float x, float y, float width, float height) { }
    }

    public enum EventType { MouseDown, MouseUp, KeyDown, KeyUp, Repaint, Layout }

    public enum KeyCode { None, Return }

    public sealed class Event
    {
        public static Event current { get { return null; } }
        public EventType type { get { return EventType.Layout; } }
        public KeyCode keyCode { get { return KeyCode.None; } }
    }

    public sealed class GUILayoutOption { }

    public static class GUILayout
    {
        public static void BeginArea(Rect screenRect) { }
        public static void EndArea() { }
        public static void BeginHorizontal(params GUILayoutOption[] options) { }
        public static void EndHorizontal() { }
        public static void Label(string text, params GUILayoutOption[] options) { }
        public static string TextField(string text, params GUILayoutOption[] options) { return text; }
        public static bool Button(string text, params GUILayoutOption[] options) { return false; }
        public static bool Toggle(bool value, string text, params GUILayoutOption[] options) { return value; }
        public static GUILayoutOption Width(float width) { return null; }
        public static GUILayoutOption ExpandWidth(bool expand) { return null; }
    }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class SerializeField : Attribute { }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class HeaderAttribute : Attribute { public HeaderAttribute(string header) { } }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class TooltipAttribute : Attribute { public TooltipAttribute(string tooltip) { } }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class RangeAttribute : Attribute { public RangeAttribute(float min, float max) { } }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class MinAttribute : Attribute { public MinAttribute(float min) { } }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class TextAreaAttribute : Attribute { public TextAreaAttribute(int minLines, int maxLines) { } }

    [AttributeUsage(AttributeTargets.Class)]
    public sealed class DisallowMultipleComponent : Attribute { }

    [AttributeUsage(AttributeTargets.Class)]
    public sealed class AddComponentMenu : Attribute { public AddComponentMenu(string menuName) { } }

    public enum RuntimeInitializeLoadType { AfterSceneLoad, BeforeSceneLoad, AfterAssembliesLoaded, BeforeSplashScreen, SubsystemRegistration }

    [AttributeUsage(AttributeTargets.Method)]
    public sealed class RuntimeInitializeOnLoadMethodAttribute : Attribute
    {
        public RuntimeInitializeOnLoadMethodAttribute(RuntimeInitializeLoadType loadType) { }
    }

    [AttributeUsage(AttributeTargets.Class)]
    public sealed class DefaultExecutionOrder : Attribute { public DefaultExecutionOrder(int order) { } }
}

namespace UnityEngine.Events
{
    public abstract class UnityEventBase { }

    public class UnityEvent<T0> : UnityEventBase
    {
        public void Invoke(T0 arg0) { }
    }

    public class UnityEvent<T0, T1> : UnityEventBase
    {
        public void Invoke(T0 arg0, T1 arg1) { }
    }

    public class UnityEvent<T0, T1, T2> : UnityEventBase
    {
        public void Invoke(T0 arg0, T1 arg1, T2 arg2) { }
    }
}

namespace UnityEngine.SceneManagement
{
    public enum LoadSceneMode { Single, Additive }

    public static class SceneManager
    {
        public static AsyncOperation LoadSceneAsync(string sceneName, LoadSceneMode mode) { return new AsyncOperation(); }
    }
}

namespace UnityEngine.Profiling
{
    public static class Profiler
    {
        public static long GetAllocatedMemoryForGraphicsDriver() { return 0; }
    }
}
