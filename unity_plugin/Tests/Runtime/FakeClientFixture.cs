using System;
using System.Collections.Generic;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    /// <summary>A fixture whose tests drive one client over a <see cref="FakeTransport"/>: a new
    /// fake for every test, and the test's client disposed when it ends.</summary>
    public abstract class FakeClientFixture
    {
        protected FakeTransport fake;
        protected IgiClient client;

        [SetUp]
        public void NewFake() { fake = new FakeTransport(); }

        [TearDown]
        public void DisposeClient()
        {
            if (client != null) client.Dispose();
            client = null;
        }

        /// <summary>The test's client over the fake, optionally configured; by default once its
        /// hello is answered (the fake answers it unless the test says otherwise).</summary>
        protected IgiClient Start(Action<IgiClientOptions> configure = null, bool waitReady = true)
        {
            var options = new IgiClientOptions { TransportFactory = () => fake };
            if (configure != null) configure(options);
            client = new IgiClient(options);
            if (waitReady) Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 5, "fake hello");
            return client;
        }

        /// <summary>A map of alternating keys and values.</summary>
        protected static Dictionary<string, object> Map(params object[] pairs)
        {
            var map = new Dictionary<string, object>();
            for (int i = 0; i < pairs.Length; i += 2) map[(string)pairs[i]] = pairs[i + 1];
            return map;
        }
    }
}
