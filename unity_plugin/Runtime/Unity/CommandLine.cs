using System.Collections.Generic;
using System.Text;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Joins arguments into the single string <c>ProcessStartInfo.Arguments</c> takes
    /// (Unity's .NET profile has no <c>ArgumentList</c>). The quoting differs by OS because the
    /// string is split differently: by <c>CommandLineToArgvW</c> rules on Windows, by a POSIX
    /// shell-like parser in Mono/IL2CPP elsewhere.
    /// </summary>
    public static class CommandLine
    {
        /// <param name="forCmd">Windows only: every argument in quotes, so that <c>cmd.exe</c>
        /// reads <c>&amp; | &lt; &gt; ^ ( )</c> in a path as text.</param>
        public static string Join(IList<string> args, bool windows, bool forCmd = false)
        {
            var sb = new StringBuilder();
            for (int i = 0; i < args.Count; i++)
            {
                if (i > 0) sb.Append(' ');
                sb.Append(windows ? QuoteWindows(args[i], forCmd) : QuotePosix(args[i]));
            }
            return sb.ToString();
        }

        /// <summary>CommandLineToArgvW: backslashes are literal except before a quote.</summary>
        public static string QuoteWindows(string arg, bool always = false)
        {
            if (!always && arg.Length > 0 && arg.IndexOfAny(new[] { ' ', '\t', '\n', '"' }) < 0) return arg;
            var sb = new StringBuilder("\"");
            int backslashes = 0;
            foreach (char c in arg)
            {
                if (c == '\\') { backslashes++; continue; }
                // backslashes before a quote (ours or the closing one) must be doubled
                sb.Append('\\', c == '"' ? backslashes * 2 + 1 : backslashes);
                backslashes = 0;
                sb.Append(c);
            }
            sb.Append('\\', backslashes * 2);
            return sb.Append('"').ToString();
        }

        /// <summary>Double quotes, escaping what a POSIX shell would expand inside them.</summary>
        public static string QuotePosix(string arg)
        {
            var sb = new StringBuilder("\"");
            foreach (char c in arg)
            {
                if (c == '\\' || c == '"' || c == '$' || c == '`') sb.Append('\\');
                sb.Append(c);
            }
            return sb.Append('"').ToString();
        }
    }
}
