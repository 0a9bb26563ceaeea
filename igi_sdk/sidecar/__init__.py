"""The sidecar, composed in one place: protocol server (``bridge``) over a model host (engine,
planner, plan ladder, VRAM sources, arbiter, frame pacer), and, with an upstream, the routing
between that host and an OpenAI-compatible cluster (``upstream``)."""

from __future__ import annotations

from igi_sdk.serving.server import Server, ServerConfig
from igi_sdk.sidecar.host import HostConfig, ModelHost
from igi_sdk.upstream.config import UpstreamConfig


def build_server(server: ServerConfig, host: HostConfig,
                 upstream: UpstreamConfig | None = None) -> Server:
    """A protocol server bound to its endpoint, serving a fresh model host (and the upstream,
    by its policy, when one is given)."""
    local = ModelHost(host)
    if upstream is None:
        return Server(server, local)
    from igi_sdk.upstream.routing import RoutingBackend  # httpx only when it is used

    return Server(server, RoutingBackend(local, upstream))


__all__ = ["HostConfig", "ModelHost", "Server", "ServerConfig", "UpstreamConfig",
           "build_server"]
