using System.Collections.Generic;

namespace Igi.Sdk
{
    /// <summary>Typed reads from a decoded msgpack map that never throw: a missing key or a
    /// value of another type gives the fallback (replies may grow fields; clients ignore them).</summary>
    public static class MsgValue
    {
        public static object Get(IDictionary<string, object> map, string key)
        {
            object value;
            if (map == null || key == null || !map.TryGetValue(key, out value)) return null;
            return value;
        }

        public static string GetString(IDictionary<string, object> map, string key, string fallback = null)
        {
            return Get(map, key) as string ?? fallback;
        }

        public static long GetLong(IDictionary<string, object> map, string key, long fallback = 0)
        {
            object v = Get(map, key);
            if (v is long) return (long)v;
            if (v is double) return (long)(double)v;
            return fallback;
        }

        public static double GetDouble(IDictionary<string, object> map, string key, double fallback = 0)
        {
            object v = Get(map, key);
            if (v is double) return (double)v;
            if (v is long) return (long)v;
            return fallback;
        }

        public static bool GetBool(IDictionary<string, object> map, string key, bool fallback = false)
        {
            object v = Get(map, key);
            return v is bool ? (bool)v : fallback;
        }

        public static Dictionary<string, object> GetMap(IDictionary<string, object> map, string key)
        {
            return Get(map, key) as Dictionary<string, object>;
        }

        public static List<object> GetList(IDictionary<string, object> map, string key)
        {
            return Get(map, key) as List<object>;
        }

        /// <summary>The strings of a list field (other items skipped); empty when absent.</summary>
        public static List<string> GetStrings(IDictionary<string, object> map, string key)
        {
            var result = new List<string>();
            var list = GetList(map, key);
            if (list == null) return result;
            foreach (var item in list)
            {
                var s = item as string;
                if (s != null) result.Add(s);
            }
            return result;
        }
    }
}
