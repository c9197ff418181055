"""Supply chain: the stack pulls nothing from outside its own registry, and pins what it
pulls by digest.

Every image a workload runs (containers and init containers), the image of the gateway's
proxies (EnvoyProxy), every image a Helm release's values name, and every chart, must
come from the stack's own CR instance. `images-by-digest` then asks for a digest on each:
a tag in the mirror can be pushed over, a digest cannot. Chart internals the values do not
name are invisible here; tests/test_mirror.py checks that the values name every image the
pinned charts run by default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stacks.regions import cr_registry_host

from .common import (
    CR_REGISTRY,
    dig,
    iter_workload_containers,
    k8s_kind,
    name_of,
    of_type,
    serving_workloads,
    stack_policy,
)

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
DIGEST_MARK = "@sha256:"


def _registry_host(resources) -> str | None:
    regs = of_type(resources, CR_REGISTRY)
    if not regs:
        return None
    reg = regs[0]
    region = dig(reg.provider.props, "region") if reg.provider is not None else None
    return cr_registry_host(str(dig(reg.props, "name")), str(region)) if region else None


def _value_images(values, path: str = "values"):
    """(where, reference, pinned) of every image a chart's values name: a string under a
    key `image`, or a mapping with `repository` (+ registry, tag, sha/digest)."""
    if isinstance(values, Mapping):
        if "repository" in values and isinstance(values.get("repository"), str):
            reg = str(values.get("registry") or "")
            repo = str(values["repository"])
            tag = str(values.get("tag") or "")
            sha = str(values.get("sha") or values.get("digest") or "")
            ref = f"{reg}/{repo}" if reg else repo
            yield path, ref, bool(sha) or DIGEST_MARK in tag
            return
        for k in values:
            v = values[k]
            if k == "image" and isinstance(v, str):
                yield f"{path}.{k}", v, DIGEST_MARK in v
            else:
                yield from _value_images(v, f"{path}.{k}")
    elif isinstance(values, Sequence) and not isinstance(values, str):
        for i, v in enumerate(values):
            yield from _value_images(v, f"{path}[{i}]")


def _pulled(resources, serving: bool = True):
    """(resource, where, reference, pinned) of everything the stack pulls; without the
    model server's workloads and the serving image when `serving` is false
    (image-from-stack-registry holds those to the stack's serving repository, a stricter rule)."""
    skip = set() if serving else {w.urn for w in serving_workloads(resources)}
    # Other workloads that run the serving image (the GPU health controller, the pre-warm
    # pull) are judged with it: one verdict for one image.
    serving_images = set() if serving else {
        str(dig(c, "image", default="")) for w in serving_workloads(resources)
        for _, _, c in iter_workload_containers(k8s_kind(w.resource_type), w.props)}
    for r in resources:
        if r.urn in skip:
            continue
        kind = k8s_kind(r.resource_type)
        if r.resource_type == HELM_RELEASE:
            name = dig(r.props, "name", default=r.name)
            chart = str(dig(r.props, "chart", default=""))
            yield r, f"Helm release {name} chart", chart, True  # charts: version-pinned (docs/limits.md)
            for where, ref, pinned in _value_images(dig(r.props, "values", default={})):
                yield r, f"Helm release {name} {where}", ref, pinned
        elif kind == "EnvoyProxy":
            ref = dig(r.props, "spec", "provider", "kubernetes", "envoyDeployment", "container", "image")
            if ref:
                yield r, f"EnvoyProxy {name_of(r.props)}", str(ref), DIGEST_MARK in str(ref)
        elif kind is not None:
            for _, _, c in iter_workload_containers(kind, r.props):
                ref = str(dig(c, "image", default=""))
                if ref in serving_images:
                    continue
                yield r, f"{kind} {name_of(r.props)} container {dig(c, 'name')!r}", ref, DIGEST_MARK in ref


def _mirrored(args, report):
    host = _registry_host(args.resources)
    for r, where, ref, _ in _pulled(args.resources, serving=False):
        bare = ref.removeprefix("oci://")
        if host is None or not bare.startswith(host + "/"):
            registry = host or "no CR registry in the stack"
            report(f"{where} pulls {ref!r} from outside the stack's registry ({registry}): cn-beijing clusters do not reliably reach docker.io, quay.io, ghcr.io, nvcr.io, "
                   "registry.k8s.io or GitHub, and a public tag can change under the stack. Fix: render it from "
                   "the mirror (workloads/supply_chain/mirror.py) and copy it there (dsvolc images <stack> --script).", r.urn)


def _by_digest(args, report):
    by_resource: dict[str, tuple[object, list[str]]] = {}
    for r, where, ref, pinned in _pulled(args.resources):
        if not pinned:
            by_resource.setdefault(r.urn, (r, []))[1].append(f"{where}: {ref}")
    for r, refs in by_resource.values():
        shown = "; ".join(refs[:3]) + (f"; and {len(refs) - 3} more" if len(refs) > 3 else "")
        report(f"{len(refs)} image(s) pulled by tag, which can be pushed over: {shown}. Fix: mirror them and "
               "record their digests (dsvolc images <stack> --script, then --record); the serving image's "
               "digest comes from its build (runtime/build.sh serving <stack>).", r.urn)


POLICIES = [
    stack_policy(
        "images-from-stack-mirror",
        "Every chart and image the stack deploys comes from the stack's own registry.",
        _mirrored,
        fix="Copy the artifact into the stack's mirror (dsvolc images <stack>) and render it from there.",
        tags=["supply-chain"],
    ),
    stack_policy(
        "images-by-digest",
        "Every image the stack deploys is pinned by digest (mandatory for prod).",
        _by_digest,
        fix="Record mirror digests with dsvolc images <stack> --record; build the serving image with runtime/build.sh.",
        tags=["supply-chain"],
    ),
]
