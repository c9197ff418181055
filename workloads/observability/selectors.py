"""PromQL label selectors and names shared by the monitoring, autoscaling and rollout
renderers (one place, so the three never disagree about which series they read).

May import: workloads.engine.context.
"""

from __future__ import annotations

from workloads.engine.context import ServingContext

VLLM_JOB = "vllm"  # the PodMonitor's job label of the serving pods
DCGM_NAME = "dcgm-exporter"  # job label (and name) of the DCGM exporter
# Argo Rollouts labels every pod it manages with its template hash.
ROLLOUT_HASH_POD_LABEL = "rollouts-pod-template-hash"
ROLLOUT_HASH_LABEL = "rollouts_pod_template_hash"  # as Prometheus sanitises it


def vllm_selector(ctx: ServingContext) -> str:
    """Label matchers (without braces) of the serving pods' vLLM series."""
    return f'namespace="{ctx.namespace}",job="{VLLM_JOB}"'


def gpu_selector(ctx: ServingContext) -> str:
    """Label matchers of the DCGM series of GPUs held by the serving pods."""
    return f'namespace="{ctx.namespace}",job="{DCGM_NAME}"'


def dcgm_selector() -> str:
    """Label matchers of every DCGM series (all GPU nodes, whoever holds the GPU)."""
    return f'job="{DCGM_NAME}"'


def hpa_name(ctx: ServingContext) -> str:
    """The HPA KEDA creates for the ScaledObject (named explicitly in autoscaling.py)."""
    return f"keda-hpa-{ctx.release}"
