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

# The Gateway API traffic-router plugin; packed into an image of the stack's mirror
# (workloads/supply_chain/mirror.py) instead of being downloaded by the controller at start.
ARGO_GATEWAYAPI_PLUGIN = "v0.17.0"

# LWS publishes an OCI chart without the "v". CRD: leaderworkerset.x-k8s.io at v0.10.0.
LWS = Chart("oci://registry.k8s.io/lws/charts/lws", "0.10.0", None, "v0.10.0")

# kube-prometheus-stack 88.2.0 ships prometheus-operator v0.93.0 (CRDs: monitoring.coreos.com_*).
KUBE_PROMETHEUS_STACK = Chart(
    "kube-prometheus-stack", "88.2.0", "https://prometheus-community.github.io/helm-charts", "v0.93.0"
)

# NVIDIA's device plugin, deployed instead of VKE's add-on when a pool is cut into MIG
# slices: its per-node config (nvidia.com/device-plugin.config) gives MIG nodes the mixed
# strategy. Chart values checked against NVIDIA/k8s-device-plugin v0.18.2
# (commit fb1242add205d8563f9c604b8ba239607b4083e6) deployments/helm/nvidia-device-plugin/values.yaml.
NVIDIA_DEVICE_PLUGIN = Chart("nvidia-device-plugin", "0.18.2", "https://nvidia.github.io/k8s-device-plugin", "v0.18.2")

# Counter store of Envoy Gateway's global rate-limit service (plain manifests, see
# workloads/platform/controllers.py: no maintained Redis chart without a vendor image licence).
REDIS_IMAGE = "docker.io/library/redis:7.4.2-alpine"

# The OpenTelemetry Collector chart 0.170.0 deploys collector 0.158.0 (Chart.yaml appVersion,
# open-telemetry/opentelemetry-helm-charts tag opentelemetry-collector-0.170.0, commit
# f5178cb9). The chart no longer picks an image: the k8s distribution carries the otlp
# receiver, the otlphttp exporter and the batch, memory_limiter and resource processors.
OTEL_COLLECTOR = Chart(
    "opentelemetry-collector", "0.170.0", "https://open-telemetry.github.io/opentelemetry-helm-charts", "0.158.0"
)
OTEL_COLLECTOR_IMAGE = "otel/opentelemetry-collector-k8s"

# vLLM Router (vllm-project/router), the routing tier (workloads/edge/router.py): the image its
# release pipeline publishes for each PyPI release (.buildkite/scripts/publish-release-images.sh
# at e0c942d4: vllm/vllm-router:v<version>), the same version the tests run (pyproject's engine extra).
VLLM_ROUTER_IMAGE = "docker.io/vllm/vllm-router:v0.1.17"

# Runs the alert relay (runtime/alert_relay.py, standard library only, from a ConfigMap):
# the Docker official Python image.
ALERT_RELAY_IMAGE = "docker.io/library/python:3.12-slim"

# ---------------------------------------------------------------- images the charts run
# Read from the charts at the versions above (workloads/supply_chain/mirror.py says where each chart
# takes them; tests/data/SOURCES.md, "Chart image settings", names the files):
# envoyproxy/gateway v1.9.0 api/v1alpha1/shared_types.go
ENVOY_PROXY_TAG = "distroless-v1.39.0"
ENVOY_RATELIMIT_TAG = "17b1956c"
# kube-prometheus-stack-88.2.0 values.yaml and Chart.yaml (appVersion v0.93.0)
KPS_OPERATOR_TAG = "v0.93.0"
KPS_CERTGEN_TAG = "1.8.5"
KPS_PROMETHEUS_TAG = "v3.13.2-distroless"
KPS_ALERTMANAGER_TAG = "v0.33.1"
# its subcharts: kube-state-metrics 8.2.0 (appVersion 2.19.1, tag "v" + appVersion),
# prometheus-node-exporter 4.56.1 (appVersion 1.12.1, likewise), grafana 12.10.4
# (grafana-community/helm-charts; appVersion 13.1.3, sidecar 2.10.1)
KSM_TAG = "v2.19.1"
NODE_EXPORTER_TAG = "v1.12.1"
GRAFANA_TAG = "13.1.3"
GRAFANA_SIDECAR_TAG = "2.10.1"

# nvcr.io tag of the upstream manifest (NVIDIA/dcgm-exporter dcgm-exporter.yaml: DCGM
# 4.2.3, exporter 4.1.3). Pinned: a floating tag would change the metric set under us.
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"

# Build inputs (not deployed): the serving image's base (runtime/Dockerfile, vLLM 0.32,
# the APIs the kernels plugin targets) and the plugin image's base (the busybox tag the
# grafana 12.10.4 chart uses).
VLLM_BASE_IMAGE = "docker.io/vllm/vllm-openai:v0.32.0"
PLUGIN_BASE_IMAGE = "docker.io/library/busybox:1.38.0"
