"""Which optional platform pieces a stack runs, decided once from the settings (the
renderers that create them and those that depend on them ask here)."""

from __future__ import annotations

from stacks.settings import StackSettings


def global_rate_limit(settings: StackSettings) -> bool:
    """Envoy Gateway's global rate limit is in use (needs Redis and the EnvoyGateway config)."""
    sv = settings.serving
    return sv.in_cluster_gateway and sv.auth.enabled and sv.rate_limits.enabled
