using System;
using System.Collections;
using System.Collections.Generic;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    /// <summary>Deep comparison of decoded trees: numbers by value (JSON 1.0 == msgpack 1),
    /// maps without regard to order, a JSON twin's {"$bin": hex} equal to the bytes.</summary>
    public static class ValueAssert
    {
        public static void AreEqual(object expected, object actual, string where)
        {
            string difference = Difference(expected, actual, where);
            if (difference != null) Assert.Fail(difference);
        }

        public static string Difference(object expected, object actual, string path)
        {
            if (expected == null || actual == null)
                return expected == actual ? null : path + ": expected " + Show(expected) + ", got " + Show(actual);
            if (IsNumber(expected) && IsNumber(actual))
            {
                if (IsInteger(expected) && IsInteger(actual))
                    return Convert.ToDecimal(expected) == Convert.ToDecimal(actual) ? null : path + ": " + expected + " != " + actual;
                return Convert.ToDouble(expected) == Convert.ToDouble(actual) ? null : path + ": " + expected + " != " + actual;
            }
            string hex = BinHex(expected);
            if (hex != null && actual is byte[])
                return hex == BitConverter.ToString((byte[])actual).Replace("-", "").ToLowerInvariant() ? null : path + ": bytes differ";
            var em = expected as IDictionary<string, object>;
            var am = actual as IDictionary<string, object>;
            if (em != null || am != null)
            {
                if (em == null || am == null) return path + ": map vs " + Show(em == null ? expected : actual);
                if (em.Count != am.Count) return path + ": " + em.Count + " keys, got " + am.Count;
                foreach (var entry in em)
                {
                    object other;
                    if (!am.TryGetValue(entry.Key, out other)) return path + ": missing key " + entry.Key;
                    string d = Difference(entry.Value, other, path + "." + entry.Key);
                    if (d != null) return d;
                }
                return null;
            }
            if (expected is string || actual is string)
                return Equals(expected, actual) ? null : path + ": " + Show(expected) + " != " + Show(actual);
            var el = expected as IList;
            var al = actual as IList;
            if (el != null && al != null && !(expected is byte[]))
            {
                if (el.Count != al.Count) return path + ": " + el.Count + " items, got " + al.Count;
                for (int i = 0; i < el.Count; i++)
                {
                    string d = Difference(el[i], al[i], path + "[" + i + "]");
                    if (d != null) return d;
                }
                return null;
            }
            if (expected is byte[] && actual is byte[])
                return Convert.ToBase64String((byte[])expected) == Convert.ToBase64String((byte[])actual) ? null : path + ": bytes differ";
            return Equals(expected, actual) ? null : path + ": " + Show(expected) + " != " + Show(actual);
        }

        /// <summary>The hex of a JSON twin's bin ({"$bin": "0a1b..."}), or null.</summary>
        public static string BinHex(object o)
        {
            var map = o as IDictionary<string, object>;
            if (map == null || map.Count != 1 || !map.ContainsKey("$bin")) return null;
            return map["$bin"] as string;
        }

        static bool IsNumber(object o) { return o is long || o is ulong || o is double || o is int; }
        static bool IsInteger(object o) { return o is long || o is ulong || o is int; }
        static string Show(object o) { return o == null ? "null" : o.GetType().Name + " " + o; }
    }
}
