// A minimal JSON reader for the golden vectors' readable twins (test-only; the runtime needs
// none). Numbers with a fraction or exponent read as double, others as long.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;

namespace Igi.Sdk.Tests
{
    public static class TestJson
    {
        public static object Parse(string text)
        {
            int at = 0;
            object value = Value(text, ref at);
            Skip(text, ref at);
            if (at != text.Length) throw new FormatException("trailing JSON at " + at);
            return value;
        }

        static void Skip(string s, ref int at)
        {
            while (at < s.Length && char.IsWhiteSpace(s[at])) at++;
        }

        static object Value(string s, ref int at)
        {
            Skip(s, ref at);
            if (at >= s.Length) throw new FormatException("unexpected end of JSON");
            char c = s[at];
            if (c == '{') return Object(s, ref at);
            if (c == '[') return Array(s, ref at);
            if (c == '"') return String(s, ref at);
            if (Literal(s, ref at, "true")) return true;
            if (Literal(s, ref at, "false")) return false;
            if (Literal(s, ref at, "null")) return null;
            return Number(s, ref at);
        }

        static bool Literal(string s, ref int at, string word)
        {
            if (string.CompareOrdinal(s, at, word, 0, word.Length) != 0) return false;
            at += word.Length;
            return true;
        }

        static Dictionary<string, object> Object(string s, ref int at)
        {
            var map = new Dictionary<string, object>();
            at++;
            Skip(s, ref at);
            if (s[at] == '}') { at++; return map; }
            while (true)
            {
                Skip(s, ref at);
                string key = String(s, ref at);
                Skip(s, ref at);
                if (s[at++] != ':') throw new FormatException("expected : at " + at);
                map[key] = Value(s, ref at);
                Skip(s, ref at);
                char c = s[at++];
                if (c == '}') return map;
                if (c != ',') throw new FormatException("expected , or } at " + at);
            }
        }

        static List<object> Array(string s, ref int at)
        {
            var list = new List<object>();
            at++;
            Skip(s, ref at);
            if (s[at] == ']') { at++; return list; }
            while (true)
            {
                list.Add(Value(s, ref at));
                Skip(s, ref at);
                char c = s[at++];
                if (c == ']') return list;
                if (c != ',') throw new FormatException("expected , or ] at " + at);
            }
        }

        static string String(string s, ref int at)
        {
            if (s[at] != '"') throw new FormatException("expected a string at " + at);
            at++;
            var sb = new StringBuilder();
            while (true)
            {
                char c = s[at++];
                if (c == '"') return sb.ToString();
                if (c != '\\') { sb.Append(c); continue; }
                char e = s[at++];
                switch (e)
                {
                    case 'n': sb.Append('\n'); break;
                    case 't': sb.Append('\t'); break;
                    case 'r': sb.Append('\r'); break;
                    case 'b': sb.Append('\b'); break;
                    case 'f': sb.Append('\f'); break;
                    case 'u':
                        sb.Append((char)int.Parse(s.Substring(at, 4), NumberStyles.HexNumber));
                        at += 4;
                        break;
                    default: sb.Append(e); break;
                }
            }
        }

        static object Number(string s, ref int at)
        {
            int start = at;
            bool fraction = false;
            while (at < s.Length && "+-0123456789.eE".IndexOf(s[at]) >= 0)
            {
                if (s[at] == '.' || s[at] == 'e' || s[at] == 'E') fraction = true;
                at++;
            }
            string n = s.Substring(start, at - start);
            if (n.Length == 0) throw new FormatException("bad JSON value at " + start);
            if (!fraction)
            {
                long l;
                if (long.TryParse(n, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out l)) return l;
                ulong u;
                if (ulong.TryParse(n, NumberStyles.None, CultureInfo.InvariantCulture, out u)) return u;
            }
            return double.Parse(n, NumberStyles.Float, CultureInfo.InvariantCulture);
        }
    }
}
