"""Scale-out: sessions served by an OpenAI-compatible cluster (vLLM, SGLang, NVIDIA Dynamo,
llama-server replicas) behind the sidecar's own faces, with session affinity.

``config`` and ``transcript`` are pure; ``client`` speaks HTTP to the upstream; ``routing`` is the
:class:`~igi_sdk.serving.backend.Backend` that sends each line to the local model or the upstream.
"""

from igi_sdk.upstream.config import Policy, UpstreamConfig

__all__ = ["Policy", "UpstreamConfig"]
