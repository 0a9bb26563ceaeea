using System;
using System.Collections;
using Igi.Sdk.Unity;
using UnityEngine;
using UnityEngine.SceneManagement;

namespace Igi.Sdk.Samples
{
    /// <summary>
    /// The NPC Dialogue sample: add this to an empty GameObject in an empty scene and press Play.
    /// It builds the scene at runtime (an IgiSidecar, a VramReporter, the NPC Brom) and draws an
    /// OnGUI panel: Brom's reply streaming in, a field for the player's line, Say, Cancel,
    /// Save, Restore and a "facing Brom" toggle, and Load Level: the level-load hook
    /// (<see cref="IgiSidecar.BeginLevelLoad"/>) before a scene loads. No UI package needed.
    /// </summary>
    [AddComponentMenu("Igi SDK/Samples/NPC Dialogue Sample")]
    public sealed class NpcDialogueSample : MonoBehaviour
    {
        const string SaveName = "brom-demo";

        [Tooltip("Leave empty to let IgiSidecar search (IGI_SDK_EXE, StreamingAssets/igi-sdk/, PATH).")]
        [SerializeField] string executablePath = "";
        [Tooltip("Empty: the sidecar's embedded default model.")]
        [SerializeField] string modelDir = "";
        [SerializeField] string model = "";
        [SerializeField] int port = IgiSidecar.DefaultPort;
        [Tooltip("The scene Load Level loads additively (it must be in Build Settings). Empty: only the VRAM is reserved.")]
        [SerializeField] string levelScene = "";
        [Tooltip("The VRAM the level will allocate, asked of the sidecar before it loads.")]
        [SerializeField] int levelVramMiB = 1024;

        IgiSidecar _sidecar;
        NpcDialogue _brom;
        string _playerLine = "Greetings, smith! What can you offer me?";
        string _log = "";
        string _status = "";
        bool _loading;

        void Awake()
        {
            // a scene's own IgiSidecar keeps its settings; one made here takes the sample's (read
            // when it starts, in its Start on the next frame)
            _sidecar = IgiSidecar.Instance != null ? IgiSidecar.Instance : FindSidecar(); // its Awake may come later
            if (_sidecar == null)
            {
                _sidecar = new GameObject("Igi Sidecar").AddComponent<IgiSidecar>();
                _sidecar.ExecutablePath = executablePath;
                _sidecar.ModelDir = modelDir;
                _sidecar.Model = model;
                _sidecar.Port = port;
            }
            if (_sidecar.GetComponent<VramReporter>() == null) _sidecar.gameObject.AddComponent<VramReporter>();

            _brom = new GameObject("Brom").AddComponent<NpcDialogue>();
            _brom.Persona = "Brom";
            _brom.SystemPrompt = "You are Brom, the blacksmith of Oakvale: gruff, honest, proud of your steel. " +
                "Answer the traveller in one or two short sentences.";
            _brom.MaxTokens = 96;
            _brom.Sampling.seed = 7;
            _brom.OnToken += piece => _status = "Brom is talking…";
            _brom.OnReply += text => { _log += "Brom: " + text + "\n"; _status = ""; };
            _brom.OnError += (code, message) => _status = code + ": " + message;
        }

        void Say()
        {
            if (string.IsNullOrEmpty(_playerLine)) return;
            if (_brom.Say(_playerLine))
            {
                _log += "You: " + _playerLine + "\n";
                _playerLine = "";
            }
        }

        async void Save()
        {
            _status = "saving…";
            bool saved = await _brom.SaveTo(SaveName); // continues on the main thread
            if (saved) _status = "saved as " + SaveName;
        }

        async void Restore()
        {
            _status = "restoring…";
            bool restored = await _brom.RestoreFrom(SaveName);
            if (restored) { _status = "restored " + SaveName; _log += "(conversation restored from " + SaveName + ")\n"; }
        }

        // The level-load hook: ask the sidecar for the level's VRAM, wait a few frames at most,
        // then load whatever the answer (a level that loads anyway just shares the GPU for a while)
        IEnumerator LoadLevel()
        {
            _loading = true;
            _status = "reserving " + levelVramMiB + " MiB of VRAM for the level…";
            VramReservation vram = _sidecar.BeginLevelLoad((long)levelVramMiB << 20);
            yield return vram;  // at most IgiSidecar.DefaultLevelLoadFrames frames
            _status = vram.Granted ? "VRAM free for the level" : "loading anyway (" + vram.ErrorCode + ")";
            if (!string.IsNullOrEmpty(levelScene))
            {
                yield return SceneManager.LoadSceneAsync(levelScene, LoadSceneMode.Additive);
                _status += "; " + levelScene + " loaded";
            }
            _loading = false;
        }

        void OnGUI()
        {
            // the same controls in every OnGUI pass of a frame (IMGUI lays out, then paints):
            // lines that may be empty are drawn empty rather than left out
            GUILayout.BeginArea(new Rect(10, 10, Math.Min(Screen.width - 20, 640), Screen.height - 20));
            GUILayout.Label("Sidecar: " + _sidecar.State + Health());
            GUILayout.Label(_sidecar.LastError ?? "");
            GUILayout.Label(_log);
            GUILayout.Label(_brom.IsReplying ? "Brom: " + _brom.CurrentReply : "");
            GUILayout.Label(_status);

            GUILayout.BeginHorizontal();
            bool enter = Event.current.type == EventType.KeyDown && Event.current.keyCode == KeyCode.Return;
            _playerLine = GUILayout.TextField(_playerLine, GUILayout.ExpandWidth(true));
            if (GUILayout.Button("Say", GUILayout.Width(70)) || enter) Say();
            if (GUILayout.Button("Cancel", GUILayout.Width(70))) _brom.Cancel();
            GUILayout.EndHorizontal();

            GUILayout.BeginHorizontal();
            if (GUILayout.Button("Save", GUILayout.Width(70))) Save();
            if (GUILayout.Button("Restore", GUILayout.Width(70))) Restore();
            _brom.FacingPlayer = GUILayout.Toggle(_brom.FacingPlayer, "Facing Brom (priority)");
            if (GUILayout.Button("Load Level", GUILayout.Width(100)) && !_loading) StartCoroutine(LoadLevel());
            GUILayout.EndHorizontal();
            GUILayout.EndArea();
        }

        string Health()
        {
            if (!_sidecar.IsReady) return _sidecar.StartedHere ? " (started here; loading the model can take a while)" : "";
            return " — last answer " + _sidecar.SecondsSinceLastAnswer.ToString("0.0") + " s ago" +
                (_brom.IsReady ? ", session " + _brom.SessionId : ", opening Brom's session…");
        }

        static IgiSidecar FindSidecar()
        {
#if UNITY_2023_1_OR_NEWER
            return FindAnyObjectByType<IgiSidecar>();
#else
            return FindObjectOfType<IgiSidecar>();
#endif
        }
    }
}
