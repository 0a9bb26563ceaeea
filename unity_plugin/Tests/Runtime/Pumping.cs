using System;
using System.Diagnostics;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    /// <summary>The test thread plays the game: it pumps the client until something happened.</summary>
    public static class Pumping
    {
        public static void Until(IgiClient client, Func<bool> condition, double seconds, string what)
        {
            var clock = Stopwatch.StartNew();
            while (true)
            {
                client.Pump();
                if (condition()) return;
                if (clock.Elapsed.TotalSeconds > seconds) Assert.Fail("timed out after " + seconds + " s waiting for " + what);
                Thread.Sleep(1);
            }
        }

        /// <summary>Waits for the request and asserts it succeeded.</summary>
        public static T Ok<T>(IgiClient client, T request, double seconds = 30) where T : IgiRequest
        {
            Until(client, () => request.IsDone, seconds, request.ToString());
            if (!request.Succeeded) Assert.Fail(request.Type + " failed: " + request.Error);
            return request;
        }

        /// <summary>Waits for the request and asserts it failed with <paramref name="code"/>.</summary>
        public static IgiError Fails(IgiClient client, IgiRequest request, string code, double seconds = 30)
        {
            Until(client, () => request.IsDone, seconds, request.ToString());
            Assert.IsFalse(request.Succeeded, request.Type + " should have failed with " + code);
            Assert.AreEqual(code, request.Error.Code, request.Error.ToString());
            return request.Error;
        }

        public static IgiClient Connect(string endpoint, Action<IgiClientOptions> configure = null)
        {
            var options = new IgiClientOptions { Endpoint = endpoint, ClientName = "nunit" };
            if (configure != null) configure(options);
            var client = new IgiClient(options);
            Until(client, () => client.State == IgiConnectionState.Ready, 30, "hello on " + endpoint);
            return client;
        }

        public static SamplingOptions Greedy { get { return new SamplingOptions { Temperature = 0, Seed = 1 }; } }
    }
}
