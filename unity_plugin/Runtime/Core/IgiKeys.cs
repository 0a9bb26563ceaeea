using System;
using System.Security.Cryptography;
using System.Text;

namespace Igi.Sdk
{
    /// <summary>
    /// Owner keys and launch tokens (protocol 1.2): secrets of 16..128 characters of
    /// [A-Za-z0-9_-]. <see cref="New"/> makes one from the OS's cryptographic random source;
    /// <see cref="Problem"/> says what is wrong with one.
    /// </summary>
    public static class IgiKeys
    {
        public const int MinLength = 16;
        public const int MaxLength = 128;
        const int RandomBytes = 32; // 256 bits: not guessable, 43 characters once encoded

        /// <summary>A new secret: 32 random bytes as unpadded base64url (43 characters).</summary>
        public static string New()
        {
            var bytes = new byte[RandomBytes];
            using (var random = RandomNumberGenerator.Create()) random.GetBytes(bytes);
            var text = new StringBuilder(Convert.ToBase64String(bytes));
            text.Replace('+', '-').Replace('/', '_');
            return text.ToString().TrimEnd('=');
        }

        /// <summary>Null when <paramref name="key"/> is a valid owner key or launch token, else why
        /// not (the key itself is never in the text: it is a secret).</summary>
        public static string Problem(string key)
        {
            if (key == null) return "is null";
            if (key.Length < MinLength || key.Length > MaxLength)
                return "has " + key.Length + " characters (" + MinLength + ".." + MaxLength + " needed)";
            for (int i = 0; i < key.Length; i++)
            {
                char c = key[i];
                bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
                if (!allowed) return "has a character other than A-Z a-z 0-9 _ - at index " + i;
            }
            return null;
        }

        /// <summary>Null when the options' keys are absent or valid, else a message naming the field.</summary>
        internal static string OptionsProblem(string ownerKey, string launchToken)
        {
            if (ownerKey != null && Problem(ownerKey) != null)
                return "IgiClientOptions.OwnerKey " + Problem(ownerKey) + " (hello.owner: 16..128 characters of A-Z a-z 0-9 _ -; IgiKeys.New() makes one)";
            if (launchToken != null && Problem(launchToken) != null)
                return "IgiClientOptions.LaunchToken " + Problem(launchToken) + " (hello.token: the IGI_SDK_TOKEN the sidecar was started with, 16..128 characters of A-Z a-z 0-9 _ -)";
            return null;
        }
    }
}
