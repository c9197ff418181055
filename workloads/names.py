"""Names shared by the infra edge and the in-cluster workloads, defined once."""

from __future__ import annotations

# Envoy Gateway runs its proxies in its controller namespace; we put a stable-named
# Service there that selects the proxies of our Gateway, so the edge has a fixed target.
ENTRY_NAMESPACE = "envoy-gateway-system"

# The port vLLM serves /health, /v1/* and /metrics on, and the serving Services expose.
HTTP_PORT = 8000


def entry_service(release: str) -> str:
    return f"{release}-entry"
