"""Every chart, plugin and image version the platform controllers use, pinned in one place.

Where a chart corresponds to a CRD in tests/data/crds (tests/data/SOURCES.md), its version is the one
those CRDs were taken from, so the schemas our tests validate against are the schemas the
cluster serves. Bump a version here and in SOURCES.md together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    chart: str  # chart name, or a full oci:// reference (then repository_url is None)
    version: str
    repository_url: str | None
    app_version: str  # what the chart deploys; matches SOURCES.md where a CRD corresponds


# Envoy Gateway publishes its chart as an OCI artifact whose versions carry the "v".
# CRDs: gateway.envoyproxy.io_* at envoyproxy/gateway v1.9.0.
ENVOY_GATEWAY = Chart("oci://docker.io/envoyproxy/gateway-helm", "v1.9.0", None, "v1.9.0")

# KEDA's chart version equals the app version. CRDs: keda.sh_* at kedacore/keda v2.20.2.
KEDA = Chart("keda", "2.20.2", "https://kedacore.github.io/charts", "2.20.2")

# argo-helm chart 2.41.1 ships Argo Rollouts v1.9.1 (CRDs: argoproj.io_* at v1.9.1).
ARGO_ROLLOUTS = Chart("argo-rollouts", "2.41.1", "https://argoproj.github.io/argo-helm", "v1.9.1")

# The Gateway API traffic-router plugin, downloaded by the Rollouts controller at start.
ARGO_GATEWAYAPI_PLUGIN = "v0.17.0"

# LWS publishes an OCI chart without the "v". CRD: leaderworkerset.x-k8s.io at v0.10.0.
LWS = Chart("oci://registry.k8s.io/lws/charts/lws", "0.10.0", None, "v0.10.0")

# kube-prometheus-stack 88.2.0 ships prometheus-operator v0.93.0 (CRDs: monitoring.coreos.com_*).
KUBE_PROMETHEUS_STACK = Chart(
    "kube-prometheus-stack", "88.2.0", "https://prometheus-community.github.io/helm-charts", "v0.93.0"
)

# Counter store of Envoy Gateway's global rate-limit service (plain manifests, see
# workloads/platform.py: no maintained Redis chart without a vendor image licence).
REDIS_IMAGE = "docker.io/library/redis:7.4.2-alpine"

# Runs the alert relay (runtime/alert_relay.py, standard library only, from a ConfigMap):
# the Docker official Python image.
ALERT_RELAY_IMAGE = "docker.io/library/python:3.12-slim"
