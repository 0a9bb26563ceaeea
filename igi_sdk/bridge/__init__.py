"""The sidecar's protocol (ZeroMQ + msgpack), its server and the Python client."""

from igi_sdk.bridge.client import AsyncClient, BridgeError, ChatStream, Client, SidecarUnavailable
from igi_sdk.bridge.protocol import PROTOCOL_VERSION, ProtocolError
from igi_sdk.bridge.server import Server, ServerConfig

__all__ = [
    "PROTOCOL_VERSION",
    "AsyncClient",
    "BridgeError",
    "ChatStream",
    "Client",
    "ProtocolError",
    "Server",
    "ServerConfig",
    "SidecarUnavailable",
]
