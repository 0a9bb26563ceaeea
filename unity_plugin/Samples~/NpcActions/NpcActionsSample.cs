using System;
using Igi.Sdk.Unity;
using UnityEngine;

namespace Igi.Sdk.Samples
{
    /// <summary>
    /// The NPC Actions sample (protocol 1.3 tools): add this to an empty GameObject in an empty
    /// scene and press Play. Brom the blacksmith may follow the player, trade and attack; each
    /// line the player says goes with those three actions, the sidecar holds every call to a
    /// declared action with valid arguments, this script carries the call out on the game's own
    /// state (the player's gold and inventory, Brom's distance, the wolf) and answers it
    /// (<see cref="NpcDialogue.AnswerAction"/>); Brom's reply then continues from the result.
    /// An OnGUI panel shows the calls and the replies. No UI package needed.
    /// </summary>
    [AddComponentMenu("Igi SDK/Samples/NPC Actions Sample")]
    public sealed class NpcActionsSample : MonoBehaviour
    {
        [Tooltip("Leave empty to let IgiSidecar search (IGI_SDK_EXE, StreamingAssets/igi-sdk/, PATH).")]
        [SerializeField] string executablePath = "";
        [Tooltip("Empty: the sidecar's embedded default model.")]
        [SerializeField] string modelDir = "";
        [SerializeField] string model = "";

        IgiSidecar _sidecar;
        NpcDialogue _brom;
        string _playerLine = "Brom, follow me to the mill.";
        string _choice = ActionChoice.Required;
        string _log = "";
        string _status = "";
        int _gold = 120;
        string _inventory = "";
        int _followDistance = -1;
        int _wolfHealth = 10;

        void Awake()
        {
            _sidecar = IgiSidecar.Instance;
            if (_sidecar == null)
            {
                _sidecar = new GameObject("Igi Sidecar").AddComponent<IgiSidecar>();
                _sidecar.ExecutablePath = executablePath;
                _sidecar.ModelDir = modelDir;
                _sidecar.Model = model;
            }

            _brom = new GameObject("Brom").AddComponent<NpcDialogue>();
            _brom.Persona = "Brom";
            _brom.SystemPrompt = "You are Brom, the blacksmith of Oakvale in a fantasy game. You can follow the player, " +
                "trade your wares and attack threats. Answer in one short sentence.";
            _brom.MaxTokens = 96;
            _brom.Sampling.temperature = 0f;
            _brom.DeclareAction(new NpcAction("follow", "Follow the player, keeping a distance in metres.",
                ActionParameters.Object().Integer("distance", "metres behind the player", minimum: 1, maximum: 10)));
            _brom.DeclareAction(new NpcAction("trade", "Offer the player an item for a price in gold coins.",
                ActionParameters.Object().String("item", "what is offered").Integer("price", "gold coins", minimum: 1, maximum: 500)));
            _brom.DeclareAction(new NpcAction("attack", "Attack a target.",
                ActionParameters.Object().Enum("target", "whom to attack", "wolf", "bandit", "player")));

            // called on the main thread as soon as a call is whole; answered at once
            _brom.OnAction += call =>
            {
                string outcome = CarryOut(call);
                _log += "  Brom does " + call.Name + call.Arguments + " → " + outcome + "\n";
                _brom.AnswerAction(call.Id, outcome);
            };
            _brom.OnToken += piece => _status = "Brom is talking…";
            _brom.OnReply += text => { if (text.Length > 0) _log += "Brom: " + text + "\n"; _status = ""; };
            _brom.OnError += (code, message) => _status = code + ": " + message;
        }

        // The game decides what a call does to its own state; the model only asks.
        string CarryOut(ActionCall call)
        {
            switch (call.Name)
            {
                case "follow":
                    _followDistance = (int)call.GetLong("distance", 2);
                    return "Brom now follows the player " + _followDistance + " m behind.";
                case "trade":
                    string item = call.GetString("item", "item");
                    long price = call.GetLong("price", 1);
                    if (price > _gold) return "The player cannot pay " + price + " gold for the " + item + ".";
                    _gold -= (int)price;
                    _inventory += (_inventory.Length > 0 ? ", " : "") + item;
                    return "The player paid " + price + " gold for the " + item + "; " + _gold + " gold left.";
                case "attack":
                    string target = call.GetString("target", "");
                    if (target != "wolf") return "Brom refuses to attack the " + target + ".";
                    _wolfHealth = Math.Max(0, _wolfHealth - 6);
                    return _wolfHealth <= 4 ? "Brom hits the wolf; it flees." : "Brom hits the wolf.";
                default:
                    return "Nothing happens.";
            }
        }

        void Say()
        {
            if (string.IsNullOrEmpty(_playerLine)) return;
            _brom.ActionChoiceSetting = _choice;
            if (_brom.Say(_playerLine))
            {
                _log += "You: " + _playerLine + "   (" + _choice + ")\n";
                _playerLine = "";
            }
        }

        void OnGUI()
        {
            GUILayout.BeginArea(new Rect(10, 10, Math.Min(Screen.width - 20, 720), Screen.height - 20));
            GUILayout.Label("Sidecar: " + _sidecar.State + (_sidecar.IsReady ? "" : " (loading the model can take a while)"));
            GUILayout.Label("Gold " + _gold + " · inventory: " + (_inventory.Length > 0 ? _inventory : "nothing") +
                " · Brom follows: " + (_followDistance > 0 ? _followDistance + " m" : "no") + " · wolf health " + _wolfHealth);
            GUILayout.Label(_log);
            GUILayout.Label(_brom.IsReplying ? "Brom: " + _brom.CurrentReply : "");
            GUILayout.Label(_status);

            GUILayout.BeginHorizontal();
            bool enter = Event.current.type == EventType.KeyDown && Event.current.keyCode == KeyCode.Return;
            _playerLine = GUILayout.TextField(_playerLine, GUILayout.ExpandWidth(true));
            if (GUILayout.Button("Say", GUILayout.Width(70)) || enter) Say();
            GUILayout.EndHorizontal();

            // how much the NPC must act: any action, exactly trade, or as it likes
            GUILayout.BeginHorizontal();
            foreach (string choice in new[] { ActionChoice.Required, "trade", ActionChoice.Auto, ActionChoice.None })
                if (GUILayout.Toggle(_choice == choice, choice, GUILayout.Width(90))) _choice = choice;
            GUILayout.EndHorizontal();
            GUILayout.EndArea();
        }
    }
}
