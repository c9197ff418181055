"""Image pulls: every pod image can be pulled the way the stack provides.

A private CR Enterprise repository needs a route from the nodes (a CR VPC endpoint on the
stack's VPC) and a credential (VKE's cr-credential-controller add-on, or a pull Secret in
the pod's imagePullSecrets); without both, pods wait in ImagePullBackOff. An image from
anywhere else must come from a public registry this stack's policy config allows (pulled
through the NAT gateway).
"""

from __future__ import annotations

from stacks.regions import cr_registry_host

from .common import (
    CR_REGISTRY,
    cfg,
    dig,
    items,
    iter_workload_containers,
    k8s_kind,
    name_of,
    of_type,
    pod_templates,
    stack_policy,
)

CR_VPC_ENDPOINT = "volcengine:cr/vpcEndpoint:VpcEndpoint"
VKE_ADDON = "volcengine:vke/addon:Addon"
VPC = "volcengine:vpc/vpc:Vpc"
CREDENTIAL_ADDON = "cr-credential-controller"


def registry_host(image: str) -> str:
    """The registry an image reference names (Docker's rule: a first path part with a dot,
    a colon or `localhost` is a host; otherwise the image is on docker.io)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _stack_registries(resources) -> dict[str, str]:
    """CR host -> CR instance name, for the stack's CR Enterprise instances."""
    out = {}
    for reg in of_type(resources, CR_REGISTRY):
        region = dig(reg.provider.props, "region") if reg.provider is not None else None
        name = dig(reg.props, "name")
        if region and name:
            out[cr_registry_host(str(name), str(region))] = str(name)
    return out


def _routed(resources, registry: str) -> bool:
    """A VPC endpoint exposes `registry` to a VPC of this stack."""
    for ep in of_type(resources, CR_VPC_ENDPOINT):
        if dig(ep.props, "registry") != registry or not items(dig(ep.props, "vpcs")):
            continue
        if any(d.resource_type == VPC for d in (ep.dependencies or [])):
            return True
    return False


def _addon(resources) -> bool:
    return any(dig(a.props, "name") == CREDENTIAL_ADDON for a in of_type(resources, VKE_ADDON))


def _pullable(args, report):
    allowed = {str(h) for h in cfg(args, "allowedPublicRegistries", [])}
    registries = _stack_registries(args.resources)
    addon = _addon(args.resources)
    for w in args.resources:
        kind = k8s_kind(w.resource_type)
        templates = pod_templates(kind, w.props)
        if not templates:
            continue
        secrets = {role: bool(items(dig(t, "spec", "imagePullSecrets"))) for role, t in templates}
        for role, _, c in iter_workload_containers(kind, w.props):
            image = str(dig(c, "image", default=""))
            host = registry_host(image)
            where = f"{kind} {name_of(w.props)} container {dig(c, 'name')!r} ({image})"
            if host in registries:
                missing = []
                if not _routed(args.resources, registries[host]):
                    missing.append(f"a CR VPC endpoint for {registries[host]!r} on the stack's VPC")
                if not (addon or secrets.get(role)):
                    missing.append(f"a pull credential (the {CREDENTIAL_ADDON} add-on or imagePullSecrets)")
                if missing:
                    report(f"{where} cannot be pulled from the private registry: no {' and no '.join(missing)}; "
                           "pods would wait in ImagePullBackOff. Fix: keep infra/registry.py's cr.VpcEndpoint and "
                           "set registry.pull_credentials (cr-credential-controller, or image-pull-secret with "
                           "registry.image_pull_secret).", w.urn)
            elif host not in allowed:
                report(f"{where} comes from {host}, neither the stack's registry "
                       f"({', '.join(registries) or 'none'}) nor a public registry this stack allows "
                       f"({', '.join(sorted(allowed)) or 'none'}). Fix: push the image to the stack's CR "
                       "repository, or add the registry to allowedPublicRegistries in the stack's policy config.",
                       w.urn)


POLICIES = [
    stack_policy(
        "image-pullable",
        "Every pod image is pullable: the stack's CR with a VPC endpoint and a pull credential, or an allowed "
        "public registry.",
        _pullable,
        fix="Keep the CR VPC endpoint, set registry.pull_credentials, or allow the public registry in the config.",
        config={"allowedPublicRegistries": {
            "type": "array", "items": {"type": "string"}, "default": [],
            "description": "public registries (hosts) pods may pull from through the NAT gateway"}},
        tags=["images"],
    ),
]
