"""Credentials the stack generates itself, so that no component runs with a default one.

Each `GeneratedSecret` describes a Kubernetes Secret whose `random_keys` are filled with a
password Pulumi generates once (pulumi_random.RandomPassword, kept in the stack's state, so
it is stable across `pulumi up` and never appears in a file); `fixed` keys are plain
values. `workloads.serving` creates them before the Helm releases that read them:

* the rate-limit Redis password (Redis requires it; Envoy Gateway's rate-limit service
  reads it as REDIS_AUTH): `workloads/platform/controllers.py`;
* Grafana's admin user and password (the chart reads them through `admin.existingSecret`
  instead of its built-in default password): `workloads/platform/controllers.py`.

Pure: describes, never touches Pulumi.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stacks.constants import ENTRY_NAMESPACE
from stacks.settings import StackSettings
from workloads.platform.features import global_rate_limit

PASSWORD_LENGTH = 32

REDIS_AUTH_SECRET = "envoy-ratelimit-redis-auth"
REDIS_AUTH_KEY = "password"

GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_USER_KEY = "admin-user"
GRAFANA_PASSWORD_KEY = "admin-password"
GRAFANA_ADMIN_USER = "admin"


@dataclass(frozen=True)
class GeneratedSecret:
    name: str
    namespace: str
    random_keys: tuple[str, ...]
    fixed: dict[str, str] = field(default_factory=dict)
    purpose: str = ""


def redis_auth() -> GeneratedSecret:
    return GeneratedSecret(REDIS_AUTH_SECRET, ENTRY_NAMESPACE, (REDIS_AUTH_KEY,),
                           purpose="password of the rate-limit Redis")


def grafana_admin(settings: StackSettings) -> GeneratedSecret:
    return GeneratedSecret(GRAFANA_ADMIN_SECRET, settings.monitoring.namespace, (GRAFANA_PASSWORD_KEY,),
                           fixed={GRAFANA_USER_KEY: GRAFANA_ADMIN_USER}, purpose="Grafana admin login")


def generated(settings: StackSettings) -> list[GeneratedSecret]:
    """The Secrets this stack generates, given what it deploys."""
    out = []
    if global_rate_limit(settings):
        out.append(redis_auth())
    if settings.monitoring.enabled:
        out.append(grafana_admin(settings))
    return out
