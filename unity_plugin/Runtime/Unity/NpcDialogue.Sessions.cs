using System.Collections.Generic;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    // NpcDialogue, continued: finding the NPC's session on a (new) connection. In order: ours
    // already (a reconnect), orphaned (adopt it: a play-mode restart), none (open it by name).
    public sealed partial class NpcDialogue
    {
        // ---- finding the session ----------------------------------------------------------------

        void Acquire()
        {
            int generation = ++_acquireGeneration;
            _acquiring = true;
            _session = null;
            if (SidecarSpeaks11 && Client.Server.HasFeature(IgiFeatures.ListSessions))
            {
                Client.ListSessions()
                    .OnOk(body => { if (generation == _acquireGeneration) Choose(body, generation); })
                    .OnError(error => { if (generation == _acquireGeneration) Retry(error); });
            }
            else
            {
                Open(generation);
            }
        }

        void Choose(Dictionary<string, object> body, int generation)
        {
            string mine = null, orphan = null;
            var leftovers = new List<KeyValuePair<string, string>>(); // (id, owner)
            foreach (object item in MsgValue.GetList(body, "sessions"))
            {
                var entry = item as Dictionary<string, object>;
                string id = MsgValue.GetString(entry, "session");
                if (id != _baseName && id != _baseName + AlternateSuffix) continue;
                string owner = MsgValue.GetString(entry, "owner");
                if (owner == "you" && mine == null) mine = id;
                else if (owner == "orphaned" && orphan == null) orphan = id;
                else leftovers.Add(new KeyValuePair<string, string>(id, owner));
            }
            if (mine != null)
            {
                // still ours (a reconnect, or an NpcDialogue of this name kept it on destroy)
                if (orphan != null) leftovers.Add(new KeyValuePair<string, string>(orphan, "orphaned"));
                CloseLeftovers(leftovers);
                Use(mine, false);
                return;
            }
            CloseLeftovers(leftovers);
            if (orphan == null) { Open(generation); return; }
            Client.AdoptSession(orphan)
                .OnOk(ok => { if (generation == _acquireGeneration) Use(orphan, false); })
                .OnError(error =>
                {
                    if (generation != _acquireGeneration) return;
                    if (error.Code == "unknown_session") Open(generation); // closed meanwhile (its orphan time ran out)
                    else Retry(error);
                });
        }

        void CloseLeftovers(List<KeyValuePair<string, string>> sessions)
        {
            // the other name of the pair, left by a restore before a restart: it would block the next restore
            foreach (var session in sessions)
            {
                string id = session.Key;
                if (session.Value == "you") Client.CloseSession(id);
                else if (session.Value == "orphaned") Client.AdoptSession(id).OnOk(ok => Client.CloseSession(id));
            }
        }

        void Open(int generation)
        {
            var options = new SessionOptions
            {
                Persona = persona,
                SystemPrompt = systemPrompt,
                Sampling = sampling.ToOptions(),
                Priority = DesiredPriority,
                Name = SidecarSpeaks11 ? _baseName : null, // a 1.0 sidecar refuses the field
            };
            Client.OpenSession(options)
                .OnOk(ok =>
                {
                    if (generation != _acquireGeneration) return;
                    _sentPriority = options.Priority.Value;
                    Use(MsgValue.GetString(ok, "session") ?? _baseName, true);
                })
                .OnError(error => { if (generation == _acquireGeneration) Retry(error); });
        }

        void Use(string session, bool fresh)
        {
            _acquiring = false;
            _retryUntil = -1f;
            _session = session;
            if (!fresh) _sentPriority = int.MinValue; // an adopted session has the priority it was left with
            if (fresh && _hadSession)
                RaiseError("session_lost", "the sidecar lost " + _baseName + "'s session (it restarted, or its model was reloaded): the conversation starts over; restore a save to go on");
            _hadSession = true;
            if (_pendingLine != null)
            {
                string line = _pendingLine;
                var images = _pendingImages;
                _pendingLine = null;
                _pendingImages = null;
                Say(line, images);
            }
        }

        void Retry(IgiError error)
        {
            // session_exists: the last play mode's client still owns it until its lease ends;
            // too_many_sessions, loading, unavailable: back-pressure. Other errors are final.
            float now = Time.realtimeSinceStartup;
            bool worthRetrying = error.Retryable || error.Code == "session_exists" || error.Code == "session_owned";
            if (_retryUntil < 0f) _retryUntil = now + RetryWindowSeconds();
            if (worthRetrying && now < _retryUntil && !_destroyed)
            {
                _retryAt = now + RetryEverySeconds;
                return;
            }
            _acquiring = false;
            _retryUntil = -1f;
            _pendingLine = null;
            _pendingImages = null;
            RaiseError(error.Code, "no session for " + _baseName + ": " + error.Message);
        }

        float RetryWindowSeconds()
        {
            double lease = Client != null && Client.Server != null && Client.Server.LeaseSeconds > 0 ? Client.Server.LeaseSeconds : 15;
            return (float)lease + 10f;
        }

        string ResolveName()
        {
            string raw = string.IsNullOrEmpty(sessionName) ? "npc." + name : sessionName;
            var chars = raw.ToCharArray();
            for (int i = 0; i < chars.Length; i++)
            {
                char c = chars[i];
                bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
                if (!allowed) chars[i] = '_';
            }
            string clean = new string(chars);
            if (clean.Length == 0) clean = "npc";
            return clean.Length <= MaxBaseNameLength ? clean : clean.Substring(0, MaxBaseNameLength);
        }
    }
}
