"""Metrics into the stack's VMP workspace: Prometheus remote write.

The in-cluster Prometheus (kube-prometheus-stack, workloads/platform/controllers.py) scrapes the serving
pods, DCGM and the gateway, and writes every sample on to the workspace's intranet write
endpoint with basic auth. The credentials live in a Secret of the Prometheus namespace and
are referenced from the Prometheus resource (prometheus-operator's RemoteWriteSpec
`basicAuth.username/password` are SecretKeySelectors), so they never appear in the Helm
values or the Prometheus object.
"""

from __future__ import annotations

from typing import Any

from stacks.constants import MANAGED_BY, PART_OF
from stacks.settings import StackSettings

REMOTE_WRITE_SECRET = "vmp-remote-write"
REMOTE_WRITE_NAME = "vmp"


def remote_write_values(write_url: Any) -> dict:
    """kube-prometheus-stack values that add the VMP remote write (merged into the release)."""
    ref = {"name": REMOTE_WRITE_SECRET}
    return {
        "prometheus": {
            "prometheusSpec": {
                "remoteWrite": [
                    {
                        "name": REMOTE_WRITE_NAME,
                        "url": write_url,
                        "basicAuth": {
                            "username": {**ref, "key": "username"},
                            "password": {**ref, "key": "password"},
                        },
                    }
                ]
            }
        }
    }


def credentials_secret(settings: StackSettings, username: Any, password: Any) -> dict:
    """The Secret the remote write reads its basic-auth user from."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": REMOTE_WRITE_SECRET,
            "namespace": settings.monitoring.namespace,
            "labels": {
                "app.kubernetes.io/name": "prometheus",
                "app.kubernetes.io/instance": "kube-prometheus-stack",
                "app.kubernetes.io/component": "remote-write",
                "app.kubernetes.io/part-of": PART_OF,
                "app.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "type": "Opaque",
        "stringData": {"username": username, "password": password},
    }


def merge(base: dict, extra: dict) -> dict:
    """Helm-style deep merge of values (maps merge, anything else is replaced)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
