"""The sidecar, composed in one place: protocol server (``bridge``) over a model host (engine,
planner, plan ladder, VRAM sources, arbiter, frame pacer)."""

from __future__ import annotations

from igi_sdk.bridge.server import Server, ServerConfig
from igi_sdk.sidecar.host import HostConfig, ModelHost


def build_server(server: ServerConfig, host: HostConfig) -> Server:
    """A protocol server bound to its endpoint, serving a fresh model host."""
    return Server(server, ModelHost(host))


__all__ = ["HostConfig", "ModelHost", "Server", "ServerConfig", "build_server"]
