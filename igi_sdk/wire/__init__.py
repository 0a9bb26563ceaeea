"""The sidecar's wire protocol, a leaf package: the request schemas, framing and limits
(:mod:`~igi_sdk.wire.protocol`) and the typed replies and error codes
(:mod:`~igi_sdk.wire.contract`). It imports nothing of the SDK, so clients, faces and tools
share it without pulling in the sidecar; ``bridge/PROTOCOL.md`` is its normative text."""

from igi_sdk.wire.protocol import PROTOCOL_VERSION, ProtocolError

__all__ = ["PROTOCOL_VERSION", "ProtocolError"]
