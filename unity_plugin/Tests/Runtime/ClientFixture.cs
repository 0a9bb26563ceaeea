using System;
using System.Collections.Generic;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    /// <summary>A fixture whose tests connect clients to real sidecars: every client a test
    /// connected is disposed at its end.</summary>
    public abstract class ClientFixture
    {
        readonly List<IgiClient> clients = new List<IgiClient>();

        /// <summary>A client connected (hello done) to <paramref name="endpoint"/>, disposed when the test ends.</summary>
        protected IgiClient Connect(string endpoint, Action<IgiClientOptions> configure = null)
        {
            return DisposedAtEnd(Pumping.Connect(endpoint, configure));
        }

        /// <summary><paramref name="client"/>, disposed when the test ends.</summary>
        protected IgiClient DisposedAtEnd(IgiClient client)
        {
            clients.Add(client);
            return client;
        }

        [TearDown]
        public void DisposeClients()
        {
            foreach (var client in clients) client.Dispose();
            clients.Clear();
        }
    }
}
