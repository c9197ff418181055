"""What a stack needs in its mirror: every chart, image and file it deploys or builds
from, with its source, mirror target and recorded digest (`dsvolc images STACK`).

The catalog and the references live in workloads/supply_chain/mirror.py; this module knows which of
them a given stack uses (which releases it installs, which optional pieces it runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from stacks.plan import StackPlan
from workloads.observability import alerting
from workloads.platform import controllers as platform
from workloads.platform.features import global_rate_limit
from workloads.supply_chain.mirror import (
    ARGO,
    CHARTS,
    GATEWAYAPI_PLUGIN,
    IMAGES,
    chart_ref,
    file_key,
    read_lock,
    target,
    target_key,
)


@dataclass(frozen=True)
class Entry:
    kind: str  # image, chart, file
    name: str
    source: str
    target: str
    digest: str | None
    purpose: str
    lock_section: str
    lock_key: str


def deployed_releases(plan: StackPlan) -> set[str]:
    return {r["name"] for r in platform.releases(plan)}


def entries(plan: StackPlan) -> list[Entry]:
    """What this stack needs in its mirror, in the order to copy it."""
    rels = deployed_releases(plan)
    lock = read_lock(plan)
    out = []
    for c in CHARTS:
        if c.release in rels:
            out.append(Entry("chart", c.name, c.source, f"{chart_ref(plan, c.chart)}:{c.chart.version}",
                             lock.charts.get(c.source), f"Helm chart of {c.release}", "charts", c.source))
    used = _used_images(plan, rels)
    for image in IMAGES:
        if image.key in used:
            out.append(Entry("image", image.key, image.source, target(plan, image), lock.images.get(image.source),
                             image.purpose, "images", image.source))
    if ARGO in rels:
        f = GATEWAYAPI_PLUGIN
        out.append(Entry("file", f.key, f.source, target(plan, f), lock.files.get(file_key(f)),
                         f"{f.purpose} (sha256 of the binary)", "files", file_key(f)))
        out.append(Entry("image", f"{f.key}-image", "built by runtime/build.sh plugin", target(plan, f),
                         lock.images.get(target_key(f)), "image carrying the plugin", "images", target_key(f)))
    return out


def _used_images(plan: StackPlan, rels: set[str]) -> set[str]:
    settings = plan.settings
    used = {i.key for i in IMAGES if i.release in rels}
    if settings.monitoring.enabled:
        used.add("dcgm-exporter")
    if global_rate_limit(settings):
        used.add("redis")
    if alerting.relay(settings):
        used.add("alert-relay")
    used.add("vllm-base")
    if plan.router is not None and plan.router.enabled:  # the routing tier (workloads/edge/router.py)
        used.add("vllm-router")
    if ARGO in rels:
        used.add("plugin-base")
    return used
