"""The sidecar's serving side: the session service that holds every rule
(:mod:`~igi_sdk.serving.service`) and its ZeroMQ face (:mod:`~igi_sdk.serving.server`), with
the bookkeeping they keep (clients, ownership, floods). Clients import :mod:`igi_sdk.client`;
the server is assembled with a model host by :mod:`igi_sdk.sidecar`; the wire's types live in
:mod:`igi_sdk.wire`."""
