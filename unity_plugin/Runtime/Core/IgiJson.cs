// A small JSON reader and writer for what the client itself handles as JSON text: the arguments
// of an NPC's action call (read) and the parameter schemas ActionParameters builds (written).
// No reflection: objects read as Dictionary<string, object>, arrays as List<object>, strings,
// long (integers without fraction or exponent that fit), double, bool and null, the shapes
// MsgValue reads. Reading is bounded (length, nesting, items) and never throws.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;

namespace Igi.Sdk
{
    public static class IgiJson
    {
        /// <summary>The longest text <see cref="TryParse"/> reads (an action call's arguments
        /// are one model reply: far shorter).</summary>
        public const int MaxLength = 1 << 20;
        public const int MaxDepth = 32;
        /// <summary>Values in all (objects, arrays and scalars together).</summary>
        public const int MaxValues = 1 << 16;

        /// <summary>Reads one JSON value spanning all of <paramref name="text"/>. False (with a
        /// reason) for anything else: malformed, trailing text, or past a bound.</summary>
        public static bool TryParse(string text, out object value, out string error)
        {
            value = null;
            error = null;
            if (text == null) { error = "no text"; return false; }
            if (text.Length > MaxLength) { error = "longer than " + MaxLength + " characters"; return false; }
            var reader = new Reader(text);
            value = reader.Value(0);
            if (reader.Error == null)
            {
                reader.Skip();
                if (reader.At != text.Length) reader.Fail("text after the value");
            }
            error = reader.Error;
            if (error != null) value = null;
            return error == null;
        }

        /// <summary>The JSON object <paramref name="text"/> holds; null when it is not one.</summary>
        public static Dictionary<string, object> ParseObject(string text)
        {
            object value;
            string error;
            return TryParse(text, out value, out error) ? value as Dictionary<string, object> : null;
        }

        sealed class Reader
        {
            readonly string s;
            public int At;
            public string Error;
            int values;

            public Reader(string text) { s = text; }

            public void Fail(string why)
            {
                if (Error == null) Error = why + " (at " + At + ")";
            }

            public void Skip()
            {
                while (At < s.Length && (s[At] == ' ' || s[At] == '\t' || s[At] == '\n' || s[At] == '\r')) At++;
            }

            public object Value(int depth)
            {
                if (Error != null) return null;
                if (depth > MaxDepth) { Fail("nested deeper than " + MaxDepth); return null; }
                if (++values > MaxValues) { Fail("more than " + MaxValues + " values"); return null; }
                Skip();
                if (At >= s.Length) { Fail("unexpected end"); return null; }
                char c = s[At];
                if (c == '{') return Object(depth);
                if (c == '[') return Array(depth);
                if (c == '"') return String();
                if (Word("true")) return true;
                if (Word("false")) return false;
                if (Word("null")) return null;
                if (c == '-' || (c >= '0' && c <= '9')) return Number();
                Fail("unexpected '" + c + "'");
                return null;
            }

            bool Word(string word)
            {
                if (string.CompareOrdinal(s, At, word, 0, word.Length) != 0) return false;
                At += word.Length;
                return true;
            }

            Dictionary<string, object> Object(int depth)
            {
                var map = new Dictionary<string, object>();
                At++; // {
                Skip();
                if (At < s.Length && s[At] == '}') { At++; return map; }
                while (Error == null)
                {
                    Skip();
                    if (At >= s.Length || s[At] != '"') { Fail("expected a key"); return null; }
                    string key = String();
                    Skip();
                    if (At >= s.Length || s[At] != ':') { Fail("expected ':'"); return null; }
                    At++;
                    object item = Value(depth + 1);
                    if (Error != null) return null;
                    map[key] = item; // a repeated key: the last one wins, as in most readers
                    Skip();
                    if (At < s.Length && s[At] == ',') { At++; continue; }
                    if (At < s.Length && s[At] == '}') { At++; return map; }
                    Fail("expected ',' or '}'");
                }
                return null;
            }

            List<object> Array(int depth)
            {
                var list = new List<object>();
                At++; // [
                Skip();
                if (At < s.Length && s[At] == ']') { At++; return list; }
                while (Error == null)
                {
                    object item = Value(depth + 1);
                    if (Error != null) return null;
                    list.Add(item);
                    Skip();
                    if (At < s.Length && s[At] == ',') { At++; continue; }
                    if (At < s.Length && s[At] == ']') { At++; return list; }
                    Fail("expected ',' or ']'");
                }
                return null;
            }

            string String()
            {
                At++; // "
                var b = new StringBuilder();
                while (At < s.Length)
                {
                    char c = s[At++];
                    if (c == '"') return b.ToString();
                    if (c < 0x20) { Fail("a control character in a string"); return null; }
                    if (c != '\\') { b.Append(c); continue; }
                    if (At >= s.Length) break;
                    char e = s[At++];
                    switch (e)
                    {
                        case '"': b.Append('"'); break;
                        case '\\': b.Append('\\'); break;
                        case '/': b.Append('/'); break;
                        case 'b': b.Append('\b'); break;
                        case 'f': b.Append('\f'); break;
                        case 'n': b.Append('\n'); break;
                        case 'r': b.Append('\r'); break;
                        case 't': b.Append('\t'); break;
                        case 'u':
                            int code = 0;
                            for (int k = 0; k < 4; k++)
                            {
                                int d = At < s.Length ? Hex(s[At]) : -1;
                                if (d < 0) { Fail("a bad \\u escape"); return null; }
                                code = code * 16 + d;
                                At++;
                            }
                            b.Append((char)code);
                            break;
                        default: Fail("a bad escape"); return null;
                    }
                }
                Fail("an unterminated string");
                return null;
            }

            static int Hex(char c)
            {
                if (c >= '0' && c <= '9') return c - '0';
                if (c >= 'a' && c <= 'f') return c - 'a' + 10;
                if (c >= 'A' && c <= 'F') return c - 'A' + 10;
                return -1;
            }

            object Number()
            {
                int start = At;
                if (s[At] == '-') At++;
                int digits = At;
                while (At < s.Length && s[At] >= '0' && s[At] <= '9') At++;
                if (At == digits) { Fail("a number without digits"); return null; }
                bool integral = true;
                if (At < s.Length && s[At] == '.')
                {
                    integral = false;
                    At++;
                    int frac = At;
                    while (At < s.Length && s[At] >= '0' && s[At] <= '9') At++;
                    if (At == frac) { Fail("a number without digits after '.'"); return null; }
                }
                if (At < s.Length && (s[At] == 'e' || s[At] == 'E'))
                {
                    integral = false;
                    At++;
                    if (At < s.Length && (s[At] == '+' || s[At] == '-')) At++;
                    int exp = At;
                    while (At < s.Length && s[At] >= '0' && s[At] <= '9') At++;
                    if (At == exp) { Fail("a number without exponent digits"); return null; }
                }
                string text = s.Substring(start, At - start);
                long whole;
                if (integral && long.TryParse(text, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out whole))
                    return whole;
                double real;
                if (double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out real)) return real;
                Fail("a number out of range");
                return null;
            }
        }

        // ---- writing ------------------------------------------------------------------------

        /// <summary><paramref name="text"/> as a JSON string literal (quotes included).</summary>
        public static string Quote(string text)
        {
            var b = new StringBuilder((text ?? "").Length + 2);
            AppendQuoted(b, text ?? "");
            return b.ToString();
        }

        static void AppendQuoted(StringBuilder b, string text)
        {
            b.Append('"');
            foreach (char c in text)
            {
                switch (c)
                {
                    case '"': b.Append("\\\""); break;
                    case '\\': b.Append("\\\\"); break;
                    case '\n': b.Append("\\n"); break;
                    case '\r': b.Append("\\r"); break;
                    case '\t': b.Append("\\t"); break;
                    default:
                        if (c < 0x20) b.Append("\\u").Append(((int)c).ToString("x4", CultureInfo.InvariantCulture));
                        else b.Append(c);
                        break;
                }
            }
            b.Append('"');
        }

        /// <summary>JSON text of a value of the shapes <see cref="TryParse"/> gives (also int,
        /// float, string[]); null for anything else (no reflection). Keys keep the
        /// dictionary's order.</summary>
        public static string Write(object value)
        {
            var b = new StringBuilder();
            return Append(b, value, 0) ? b.ToString() : null;
        }

        static bool Append(StringBuilder b, object value, int depth)
        {
            if (depth > MaxDepth) return false;
            if (value == null) { b.Append("null"); return true; }
            if (value is bool) { b.Append((bool)value ? "true" : "false"); return true; }
            if (value is string) { AppendQuoted(b, (string)value); return true; }
            if (value is long) { b.Append(((long)value).ToString(CultureInfo.InvariantCulture)); return true; }
            if (value is int) { b.Append(((int)value).ToString(CultureInfo.InvariantCulture)); return true; }
            if (value is double || value is float)
            {
                double d = value is double ? (double)value : (float)value;
                if (double.IsNaN(d) || double.IsInfinity(d)) return false; // JSON has no such number
                b.Append(d.ToString("R", CultureInfo.InvariantCulture));
                return true;
            }
            var map = value as Dictionary<string, object>;
            if (map != null)
            {
                b.Append('{');
                bool first = true;
                foreach (var entry in map)
                {
                    if (!first) b.Append(',');
                    first = false;
                    AppendQuoted(b, entry.Key);
                    b.Append(':');
                    if (!Append(b, entry.Value, depth + 1)) return false;
                }
                b.Append('}');
                return true;
            }
            var strings = value as string[];
            if (strings != null) value = new List<object>(strings);
            var list = value as List<object>;
            if (list == null) return false;
            b.Append('[');
            for (int i = 0; i < list.Count; i++)
            {
                if (i > 0) b.Append(',');
                if (!Append(b, list[i], depth + 1)) return false;
            }
            b.Append(']');
            return true;
        }
    }
}
