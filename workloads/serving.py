"""The serving stack on the cluster, as one ComponentResource.

It receives the infra layer only through component outputs (kubeconfig, bucket name,
reader role, registry, VMP workspace) and wraps what the pure renderers produce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
import pulumi_volcengine as volc

from stacks.constants import HTTP_PORT, MANAGED_BY, PART_OF
from stacks.plan import StackPlan
from workloads.engine import autoscaling
from workloads.engine import disaggregation
from workloads.edge import gateway
from workloads.edge import router
from workloads.engine import manifests
from workloads.observability import monitoring
from workloads.platform import namespaces
from workloads.edge import network_policy
from workloads.platform import controllers as platform
from workloads.engine import resilience
from workloads.engine import rollout
from workloads.platform import secrets
from workloads.observability import vmp
from workloads.platform import k8s as k8s_apply
from workloads.engine.context import ServingContext, build_context

Renderer = Callable[[ServingContext], list[dict]]


@dataclass(frozen=True)
class ServingArgs:
    context: ServingContext
    kubeconfig: pulumi.Input[str]
    reader_role_trn: pulumi.Input[str]
    static_access_key_id: pulumi.Input[str] | None
    static_secret_access_key: pulumi.Input[str] | None
    volcengine_provider: pulumi.ProviderResource
    vmp_workspace_id: pulumi.Input[str] | None
    # (write endpoint, username, password) of the VMP workspace the in-cluster Prometheus
    # remote-writes to; None without VMP
    vmp_remote_write: tuple[pulumi.Input[str], str, pulumi.Input[str]] | None = None
    trace_topic_id: pulumi.Input[str] | None = None  # TLS trace topic the collector writes to
    # the cluster's id: the Kubernetes provider is replaced only when it changes, not when the
    # rotated kubeconfig does (pulumi-kubernetes clusterIdentifier)
    cluster_id: pulumi.Input[str] | None = None


def renderers(ctx: ServingContext) -> list[Renderer]:
    """Every renderer whose objects join the serving objects, in dependency order."""
    out: list[Renderer] = [network_policy.render, router.render, gateway.render]
    s = ctx.settings
    if ctx.plan.rollout.argo:
        out.append(rollout.render)
    if s.autoscaling.enabled:
        # each side of a disaggregated stack on its own signal, else the aggregated replicas
        out.append(disaggregation.render_autoscaling if disaggregation.enabled(ctx) else autoscaling.render)
    if s.monitoring.enabled:
        out.append(monitoring.render)
    return out


def render_all(ctx: ServingContext, role_trn: pulumi.Input[str] | str) -> list[dict]:
    """All Kubernetes objects of the serving stack (what the component registers)."""
    objs = manifests.render(ctx, role_trn)  # type: ignore[arg-type]
    # prefill and decode workloads in place of the aggregated one
    objs = [o for o in objs if not disaggregation.replaces(ctx, o)]
    objs += disaggregation.render(ctx, role_trn)  # type: ignore[arg-type]
    objs += resilience.render(ctx, role_trn)  # type: ignore[arg-type]
    for render in renderers(ctx):
        objs.extend(render(ctx))
    pods = objs + platform.manifests(ctx.plan)
    return [namespaces.label(o, pods, ctx.plan) if o["kind"] == "Namespace" else o for o in objs]


class Serving(pulumi.ComponentResource):
    endpoint: pulumi.Output[str]

    def __init__(self, name: str, args: ServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:serving:Serving", name, None, opts)
        ctx = args.context
        provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=args.kubeconfig,
            cluster_identifier=args.cluster_id,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        base = pulumi.ResourceOptions(parent=self, provider=provider)
        # every Service registered, by (namespace, name): the edge's upstreams depend on theirs
        self.services: dict[tuple[str, str], pulumi.Resource] = {}

        objs = render_all(ctx, args.reader_role_trn)
        # The platform's namespaces first, labelled (workloads/platform/namespaces.py): the charts go
        # into them rather than into namespaces Helm would create without labels.
        platform_ns = {
            obj["metadata"]["name"]: k8s_apply.apply(name, obj, base)
            for obj in namespaces.platform_namespaces(ctx.plan, objs + platform.manifests(ctx.plan),
                                                      ctx.release)
        }
        # Generated credentials next: the charts and manifests below read them.
        generated = generated_secrets(name, ctx, base, platform_ns)

        releases = []
        remote_write = args.vmp_remote_write if ctx.settings.monitoring.enabled else None
        for rel in platform.releases(ctx.plan, args.trace_topic_id):
            values = rel.get("values", {})
            if remote_write is not None and rel["name"] == "kube-prometheus-stack":
                values = vmp.merge(values, vmp.remote_write_values(remote_write[0]))
            release = k8s.helm.v3.Release(
                f"{name}-helm-{rel['name']}",
                name=rel["name"],
                chart=rel["chart"],
                version=rel["version"],
                namespace=rel["namespace"],
                create_namespace=False,
                repository_opts={"repo": rel["repository_url"]},
                values=values,
                atomic=True,
                timeout=900,
                opts=pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(
                    depends_on=generated + [platform_ns[rel["namespace"]]])),
            )
            releases.append(release)
            if remote_write is not None and rel["name"] == "kube-prometheus-stack":
                # In the namespace the release creates; the operator picks the Secret up when
                # it appears and only then writes to VMP.
                k8s_apply.apply(name, vmp.credentials_secret(ctx.settings, remote_write[1], remote_write[2]),
                                pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=[release])))

        # Plain manifests the controllers need besides their charts (e.g. the rate-limit
        # Redis), in namespaces the charts create.
        after_charts = pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=list(releases)))
        releases += [self._apply(name, obj, after_charts) for obj in platform.manifests(ctx.plan)]

        own_ns = {}
        for obj in [o for o in objs if o["kind"] == "Namespace"]:
            own_ns[obj["metadata"]["name"]] = k8s_apply.apply(name, obj, base)

        if not ctx.settings.cluster.irsa:
            # Static reader key for clusters without IRSA (infra/weights.py creates the user).
            k8s.core.v1.Secret(
                f"{name}-tos-reader",
                metadata={"name": f"{ctx.release}-{manifests.STATIC_KEY_SECRET_SUFFIX}",
                          "namespace": ctx.namespace, "labels": ctx.labels("server")},
                type="Opaque",
                string_data={"access_key_id": args.static_access_key_id,
                             "secret_access_key": args.static_secret_access_key},
                opts=pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(
                    depends_on=list(own_ns.values()))),
            )

        scaled = {(o["spec"]["scaleTargetRef"].get("kind", "Deployment"), o["spec"]["scaleTargetRef"]["name"])
                  for o in objs if o["kind"] == "ScaledObject"}
        for obj in objs:
            if obj["kind"] == "Namespace":
                continue
            deps = list(releases)
            ns = obj["metadata"].get("namespace")
            if ns in own_ns:
                deps.append(own_ns[ns])
            ignore = gateway.ignored_changes(ctx, obj)
            if (obj["kind"], obj["metadata"]["name"]) in scaled:
                # The autoscaler owns the replica count after creation; re-applying the
                # configured count on every `pulumi up` would fight it.
                ignore.append("spec.replicas")
            self._apply(
                name, obj,
                pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=deps, ignore_changes=ignore)),
            )

        if args.vmp_workspace_id is not None and ctx.settings.monitoring.enabled:
            volc.vmp.RuleFile(
                f"{name}-vmp-rules",
                workspace_id=args.vmp_workspace_id,
                name=f"{ctx.release}-rules",
                description="DeepSeek serving recording and alerting rules",
                content=monitoring.rule_file_content(ctx),
                opts=pulumi.ResourceOptions(parent=self, provider=args.volcengine_provider),
            )

        self.endpoint = pulumi.Output.from_input(
            f"http://{ctx.stable_service}.{ctx.namespace}.svc:{HTTP_PORT}/v1"
        )
        self.register_outputs({"endpoint": self.endpoint})


    def _apply(self, name: str, obj: dict, opts: pulumi.ResourceOptions) -> pulumi.Resource:
        res = k8s_apply.apply(name, obj, opts)
        if obj["kind"] == "Service":
            self.services[(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = res
        return res


def _labels(name: str, instance: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY}


def generated_secrets(name: str, ctx: ServingContext, base: pulumi.ResourceOptions,
                      namespaces: dict[str, pulumi.Resource]) -> list[pulumi.Resource]:
    """The Secrets of workloads/platform/secrets.py, each random key a RandomPassword kept in the
    stack's state (alphanumeric: it goes into command lines and REDIS_AUTH's user:pass
    form unquoted), in the platform's namespaces (`namespaces`: name -> resource), so the
    Secrets exist before the charts."""
    out: list[pulumi.Resource] = []
    for gs in secrets.generated(ctx.settings):
        data: dict[str, pulumi.Input[str]] = dict(gs.fixed)
        for key in gs.random_keys:
            data[key] = random.RandomPassword(
                f"{name}-{gs.namespace}-{gs.name}-{key}", length=secrets.PASSWORD_LENGTH, special=False,
                opts=pulumi.ResourceOptions(parent=base.parent)).result
        out.append(k8s.core.v1.Secret(
            f"{name}-secret-{gs.namespace}-{gs.name}",
            metadata={"name": gs.name, "namespace": gs.namespace,
                      "labels": _labels(gs.name, ctx.release, "credentials"),
                      "annotations": {"deepseek-volc/purpose": gs.purpose}},
            type="Opaque",
            string_data=data,
            opts=pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=[namespaces[gs.namespace]])),
        ))
    return out


def build_serving(plan: StackPlan, infra) -> Serving:
    """Wire the serving stack to the infra components' outputs."""
    ctx = build_context(plan)
    return Serving(
        plan.names.prefix,
        ServingArgs(
            context=ctx,
            kubeconfig=infra.cluster.kubeconfig,
            reader_role_trn=infra.weights.role_trn,
            static_access_key_id=infra.weights.access_key_id,
            static_secret_access_key=infra.weights.secret_access_key,
            volcengine_provider=infra.provider,
            vmp_workspace_id=infra.observability.workspace_id if infra.observability else None,
            vmp_remote_write=(
                (infra.observability.write_endpoint, infra.observability.write_username,
                 infra.observability.write_password)
                if infra.observability else None
            ),
            trace_topic_id=infra.logs.trace_topic_id if infra.logs else None,
            cluster_id=infra.cluster.cluster_id,
        ),
        opts=pulumi.ResourceOptions(depends_on=[infra.cluster]),
    )
