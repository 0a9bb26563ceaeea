"""The sidecar's wire protocol (schemas, framing, typed errors) and its server.

Clients import :mod:`igi_sdk.client`; the server (:mod:`igi_sdk.bridge.server`) is assembled
with a model host by :mod:`igi_sdk.sidecar`."""

from igi_sdk.bridge.protocol import PROTOCOL_VERSION, ProtocolError

__all__ = ["PROTOCOL_VERSION", "ProtocolError"]
