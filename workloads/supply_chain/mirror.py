"""Supply chain: every image and chart the stack deploys, copied into the stack's own
registry and pinned there by digest.

Each upstream artifact has a *source* (where it is published), a *target* in the stack's
CR instance (`<registry host>/<registry.mirror_namespace>/<upstream path>:<tag>`; charts
under `charts/`) and a *digest*. Digests are not typed by hand and not guessed: they are
resolved when the artifact is copied (`dsvolc images STACK --script` prints the copy
commands, which write each digest to a file) and recorded in the lock file
(`registry.mirror_lock`, `dsvolc images STACK --record DIR`). A recorded digest makes the
rendered reference `<target>:<tag>@<digest>`; an artifact not yet recorded renders by tag
and the `images-by-digest` policy reports it (mandatory for prod).

Where the charts take their image settings, and which images they run by default, was
read from the charts at the versions `workloads.supply_chain.versions` pins (sources in
tests/data/SOURCES.md, "Chart image settings").

Pure: reads the lock file, touches nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from stacks.plan import StackPlan
from workloads.supply_chain import versions

ROOT = Path(__file__).resolve().parents[2]
DIGEST_PREFIX = "sha256:"


@dataclass(frozen=True)
class Image:
    key: str  # stable short name, used by the renderers
    source: str  # upstream reference, registry/path:tag
    release: str | None  # the Helm release whose values set it; None for our own manifests
    style: str = ""  # how that chart spells an image (see `_image_values`)
    paths: tuple[tuple[str, ...], ...] = ()  # where in the release's values
    purpose: str = ""

    @property
    def path(self) -> str:
        """The upstream repository path without registry and tag."""
        return self.source.split("/", 1)[1].rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.source.rsplit(":", 1)[1]


@dataclass(frozen=True)
class Chart:
    release: str
    chart: versions.Chart

    @property
    def name(self) -> str:
        return self.chart.chart.rstrip("/").rsplit("/", 1)[-1]

    @property
    def source(self) -> str:
        c = self.chart
        if c.chart.startswith("oci://"):
            return f"{c.chart}:{c.version}"
        return f"{c.repository_url} {c.chart} {c.version}"


@dataclass(frozen=True)
class File:
    key: str
    source: str  # URL of the upstream file
    path: str  # the image our build packs it into (repository path under the mirror namespace)
    tag: str
    purpose: str = ""


EG, KEDA, ARGO, LWS, KPS = "envoy-gateway", "keda", "argo-rollouts", "lws", "kube-prometheus-stack"
NVDP, OTEL = "nvidia-device-plugin", "otel-collector"  # release names (OTEL: workloads/observability/telemetry.py COLLECTOR)

IMAGES: tuple[Image, ...] = (
    # envoyproxy/gateway v1.9.0: charts/gateway-helm/values.tmpl.yaml (global.images.*) and
    # api/v1alpha1/shared_types.go (DefaultEnvoyProxyImage, DefaultRateLimitImage). The
    # controller image also runs the certgen job and the proxies' shutdown manager.
    Image("envoy-gateway", f"docker.io/envoyproxy/gateway:{versions.ENVOY_GATEWAY.app_version}", EG, "full",
          (("global", "images", "envoyGateway", "image"),), "Envoy Gateway controller, certgen, shutdown manager"),
    Image("envoy-ratelimit", f"docker.io/envoyproxy/ratelimit:{versions.ENVOY_RATELIMIT_TAG}", EG, "full",
          (("global", "images", "ratelimit", "image"),), "global rate-limit service"),
    Image("envoy-proxy", f"docker.io/envoyproxy/envoy:{versions.ENVOY_PROXY_TAG}", EG, "full",
          (("global", "images", "envoyProxy", "image"),), "the gateway's proxies (also set in our EnvoyProxy)"),
    # kedacore/charts v2.20.2 keda/values.yaml: image.{keda,metricsApiServer,webhooks}, tag = appVersion.
    Image("keda", f"ghcr.io/kedacore/keda:{versions.KEDA.app_version}", KEDA, "registry+tag",
          (("image", "keda"),), "KEDA operator"),
    Image("keda-metrics-apiserver", f"ghcr.io/kedacore/keda-metrics-apiserver:{versions.KEDA.app_version}", KEDA,
          "registry+tag", (("image", "metricsApiServer"),), "KEDA metrics API server"),
    Image("keda-admission-webhooks", f"ghcr.io/kedacore/keda-admission-webhooks:{versions.KEDA.app_version}", KEDA,
          "registry+tag", (("image", "webhooks"),), "KEDA admission webhooks"),
    # argoproj/argo-helm charts/argo-rollouts/values.yaml: controller.image (the dashboard is off).
    Image("argo-rollouts", f"quay.io/argoproj/argo-rollouts:{versions.ARGO_ROLLOUTS.app_version}", ARGO,
          "registry+tag", (("controller", "image"),), "Argo Rollouts controller"),
    # kubernetes-sigs/lws v0.10.0 charts/lws/values.yaml: image.manager.repository is a full path.
    Image("lws", f"registry.k8s.io/lws/lws:{versions.LWS.app_version}", LWS, "repository+tag",
          (("image", "manager"),), "LeaderWorkerSet controller"),
    # prometheus-community/helm-charts kube-prometheus-stack-88.2.0 values.yaml (sha: hex
    # digest without "sha256:"); its subcharts kube-state-metrics 8.2.0 (sha: "sha256:..."),
    # prometheus-node-exporter 4.56.1 (digest: "sha256:...") and grafana-community's
    # grafana 12.10.4 (sha: hex). Tags left empty there default to the chart's appVersion.
    Image("prometheus-operator", f"quay.io/prometheus-operator/prometheus-operator:{versions.KPS_OPERATOR_TAG}", KPS,
          "kps", (("prometheusOperator", "image"),), "Prometheus Operator"),
    Image("prometheus-config-reloader",
          f"quay.io/prometheus-operator/prometheus-config-reloader:{versions.KPS_OPERATOR_TAG}", KPS, "kps",
          (("prometheusOperator", "prometheusConfigReloader", "image"),), "config reloader sidecar"),
    Image("kube-webhook-certgen", f"ghcr.io/jkroepke/kube-webhook-certgen:{versions.KPS_CERTGEN_TAG}", KPS, "kps",
          (("prometheusOperator", "admissionWebhooks", "patch", "image"),), "admission webhook certificates job"),
    Image("prometheus", f"quay.io/prometheus/prometheus:{versions.KPS_PROMETHEUS_TAG}", KPS, "kps",
          (("prometheus", "prometheusSpec", "image"),), "Prometheus"),
    Image("alertmanager", f"quay.io/prometheus/alertmanager:{versions.KPS_ALERTMANAGER_TAG}", KPS, "kps",
          (("alertmanager", "alertmanagerSpec", "image"),), "Alertmanager"),
    Image("kube-state-metrics", f"registry.k8s.io/kube-state-metrics/kube-state-metrics:{versions.KSM_TAG}", KPS,
          "sha-full", (("kube-state-metrics", "image"),), "kube-state-metrics"),
    Image("node-exporter", f"quay.io/prometheus/node-exporter:{versions.NODE_EXPORTER_TAG}", KPS, "digest-full",
          (("prometheus-node-exporter", "image"),), "node exporter"),
    Image("grafana", f"docker.io/grafana/grafana:{versions.GRAFANA_TAG}", KPS, "kps", (("grafana", "image"),),
          "Grafana"),
    Image("grafana-sidecar", f"quay.io/kiwigrid/k8s-sidecar:{versions.GRAFANA_SIDECAR_TAG}", KPS, "kps",
          (("grafana", "sidecar", "image"),), "Grafana dashboard/datasource sidecar"),
    # NVIDIA/k8s-device-plugin v0.18.2 deployments/helm/nvidia-device-plugin/values.yaml:
    # image.repository (a full path), tag = appVersion (MIG pools run this chart).
    Image("nvidia-device-plugin", f"nvcr.io/nvidia/k8s-device-plugin:{versions.NVIDIA_DEVICE_PLUGIN.app_version}",
          NVDP, "repository+tag", (("image",),), "NVIDIA device plugin, MIG strategy per node"),
    # open-telemetry/opentelemetry-helm-charts opentelemetry-collector-0.170.0 values.yaml:
    # image.repository (empty upstream: the stack names the k8s distribution), tag.
    Image("otel-collector", f"docker.io/{versions.OTEL_COLLECTOR_IMAGE}:{versions.OTEL_COLLECTOR.app_version}",
          OTEL, "repository+tag", (("image",),), "OpenTelemetry Collector (traces)"),
    # Our own manifests.
    Image("dcgm-exporter", versions.DCGM_EXPORTER_IMAGE, None, purpose="GPU metrics (workloads/observability/monitoring.py)"),
    Image("redis", versions.REDIS_IMAGE, None, purpose="rate-limit counters (workloads/platform/controllers.py)"),
    Image("alert-relay", versions.ALERT_RELAY_IMAGE, None, purpose="alert relay (workloads/observability/alerting.py)"),
    Image("vllm-router", versions.VLLM_ROUTER_IMAGE, None, purpose="routing tier (workloads/edge/router.py)"),
    # Not deployed: the base of the serving image (runtime/Dockerfile), built from the mirror.
    Image("vllm-base", versions.VLLM_BASE_IMAGE, None, purpose="base of the serving image (runtime/build.sh)"),
    Image("plugin-base", versions.PLUGIN_BASE_IMAGE, None,
          purpose="base of the Argo plugin image (runtime/plugins.Dockerfile)"),
)

# The Argo Rollouts Gateway API plugin is a binary on GitHub, which the controller would
# download at start. We pack it, checked against its recorded sha256, into an image of
# the mirror (runtime/plugins.Dockerfile); an init container copies it for the controller.
GATEWAYAPI_PLUGIN = File(
    "gatewayapi-plugin",
    "https://github.com/argoproj-labs/rollouts-plugin-trafficrouter-gatewayapi/releases/download/"
    f"{versions.ARGO_GATEWAYAPI_PLUGIN}/gatewayapi-plugin-linux-amd64",
    "argoproj-labs/rollouts-plugin-trafficrouter-gatewayapi", versions.ARGO_GATEWAYAPI_PLUGIN,
    "Argo Rollouts traffic router for the Gateway API",
)

CHARTS: tuple[Chart, ...] = (
    Chart(EG, versions.ENVOY_GATEWAY), Chart(KEDA, versions.KEDA), Chart(ARGO, versions.ARGO_ROLLOUTS),
    Chart(LWS, versions.LWS), Chart(KPS, versions.KUBE_PROMETHEUS_STACK),
    Chart(NVDP, versions.NVIDIA_DEVICE_PLUGIN), Chart(OTEL, versions.OTEL_COLLECTOR),
)
BY_KEY = {i.key: i for i in IMAGES}


# --------------------------------------------------------------------------- the lock


@dataclass(frozen=True)
class Lock:
    images: dict[str, str | None]
    charts: dict[str, str | None]
    files: dict[str, str | None]
    path: Path


def lock_path(plan: StackPlan) -> Path:
    settings = plan.settings
    p = Path(settings.registry.mirror_lock)
    return p if p.is_absolute() else ROOT / p


@lru_cache(maxsize=8)
def _read_lock(path: str, mtime: float) -> Lock:
    doc = yaml.safe_load(Path(path).read_text()) or {}
    return Lock({k: v for k, v in (doc.get("images") or {}).items()},
                {k: v for k, v in (doc.get("charts") or {}).items()},
                {k: v for k, v in (doc.get("files") or {}).items()}, Path(path))


def read_lock(plan: StackPlan) -> Lock:
    p = lock_path(plan)
    if not p.is_file():
        return Lock({}, {}, {}, p)
    return _read_lock(str(p), p.stat().st_mtime)


def write_lock(path: Path, lock: Lock) -> None:
    header = ("# Digests of every artifact the stacks mirror into their own registry (workloads/supply_chain/mirror.py).\n"
              "# Written by `dsvolc images STACK --record DIR` from what the copy commands of\n"
              "# `dsvolc images STACK --script` resolved; null: not mirrored yet. Never edit by hand.\n")
    body = {"images": dict(sorted(lock.images.items())), "charts": dict(sorted(lock.charts.items())),
            "files": dict(sorted(lock.files.items()))}
    path.write_text(header + yaml.safe_dump(body, sort_keys=False, width=200))
    _read_lock.cache_clear()


# --------------------------------------------------------------------------- references


def registry_host(plan: StackPlan) -> str:
    return plan.names.registry_host


def mirror_prefix(plan: StackPlan) -> str:
    settings = plan.settings
    return f"{registry_host(plan)}/{settings.registry.mirror_namespace}"


def target(plan: StackPlan, image: Image | File) -> str:
    return f"{mirror_prefix(plan)}/{image.path}:{image.tag}"


def digest(plan: StackPlan, image: Image) -> str | None:
    return read_lock(plan).images.get(image.source)


def ref(plan: StackPlan, key: str) -> str:
    """The reference a pod pulls: the mirror's copy, by digest once recorded."""
    image = BY_KEY[key]
    d = digest(plan, image)
    return f"{target(plan, image)}@{d}" if d else target(plan, image)


def chart_ref(plan: StackPlan, chart: versions.Chart) -> str:
    name = chart.chart.rstrip("/").rsplit("/", 1)[-1]
    return f"oci://{mirror_prefix(plan)}/charts/{name}"


def plugin_image(plan: StackPlan) -> str:
    d = read_lock(plan).images.get(target_key(GATEWAYAPI_PLUGIN))
    t = target(plan, GATEWAYAPI_PLUGIN)
    return f"{t}@{d}" if d else t


def target_key(f: File) -> str:
    """Lock key of an image we build ourselves from a file: its mirror path and tag."""
    return f"mirror/{f.path}:{f.tag}"


def file_key(f: File) -> str:
    return f"{f.key}:{f.tag}"


def plugin_sha256(plan: StackPlan) -> str | None:
    return read_lock(plan).files.get(file_key(GATEWAYAPI_PLUGIN))


# --------------------------------------------------------------------------- chart values


def _image_values(plan: StackPlan, image: Image) -> dict:
    settings = plan.settings
    host = registry_host(plan)
    repo = f"{settings.registry.mirror_namespace}/{image.path}"
    d = digest(plan, image)
    hexd = d[len(DIGEST_PREFIX):] if d else None
    style = image.style
    if style == "full":
        return ref(plan, image.key)  # type: ignore[return-value]
    if style == "registry+tag":  # the chart prints registry/repository:tag
        return {"registry": host, "repository": repo, "tag": f"{image.tag}@{d}" if d else image.tag}
    if style == "repository+tag":  # repository is the whole path
        return {"repository": f"{host}/{repo}", "tag": f"{image.tag}@{d}" if d else image.tag}
    if style == "kps":  # registry/repository:tag@sha256:<sha>
        return {"registry": host, "repository": repo, "tag": image.tag, "sha": hexd or ""}
    if style == "sha-full":  # registry/repository:tag@<sha>
        return {"registry": host, "repository": repo, "tag": image.tag, "sha": d or ""}
    if style == "digest-full":  # registry/repository:tag@<digest>
        return {"registry": host, "repository": repo, "tag": image.tag, "digest": d or ""}
    raise ValueError(f"unknown image style {style!r} of {image.key}")


def _put(values: dict, path: tuple[str, ...], leaf) -> None:
    node = values
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = leaf


def release_values(plan: StackPlan, release: str) -> dict:
    """The values that point a release's images at the mirror."""
    out: dict = {}
    for image in IMAGES:
        if image.release == release:
            for path in image.paths:
                _put(out, path, _image_values(plan, image))
    if release == ARGO:
        out.update(argo_plugin_values(plan))
    return out


PLUGIN_DIR = "/plugin-bin"
PLUGIN_FILE = "gatewayapi-plugin"


def argo_plugin_values(plan: StackPlan) -> dict:
    """The Gateway API plugin from the mirror: an init container copies it out of the
    plugin image (content-addressed by its digest) into a shared volume, and the controller
    loads it from there, checking the sha256 recorded for the upstream binary."""
    plugin = {"name": "argoproj-labs/gatewayAPI", "location": f"file://{PLUGIN_DIR}/{PLUGIN_FILE}"}
    sha = plugin_sha256(plan)
    if sha:
        plugin["sha256"] = sha
    volume = {"name": "gatewayapi-plugin", "emptyDir": {}}
    mount = {"name": "gatewayapi-plugin", "mountPath": PLUGIN_DIR}
    init = {"name": "gatewayapi-plugin", "image": plugin_image(plan),
            "command": ["cp", f"/plugin/{PLUGIN_FILE}", f"{PLUGIN_DIR}/{PLUGIN_FILE}"],
            "volumeMounts": [mount],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}}
    return {"controller": {"trafficRouterPlugins": [plugin], "initContainers": [init], "volumes": [volume],
                           "volumeMounts": [mount]}}


def merge_values(base: dict, extra: dict) -> dict:
    """Helm's own merge of values maps: maps merge key by key, anything else replaces."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_values(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def mirrored_release(name: str, namespace: str, chart: versions.Chart, values: dict,
                     plan: StackPlan) -> dict:
    """The release from the stack's own registry: the chart's mirror copy (OCI), and its
    images pointed at the mirror (workloads/supply_chain/mirror.py)."""
    return {"name": name, "namespace": namespace, "chart": chart_ref(plan, chart),
            "version": chart.version, "repository_url": None,
            "values": merge_values(values, release_values(plan, name))}
