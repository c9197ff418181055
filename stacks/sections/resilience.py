"""`resilience`: GPU node quarantine, pre-warm and warm capacity."""

from __future__ import annotations

from pydantic import Field

from stacks.sections.common import Model


class GpuHealthSettings(Model):
    enabled: bool = Field(
        True, description="turn DCGM XID/ECC and device-plugin signals into a NoSchedule taint and drain bad GPU "
        "nodes (runtime/gpu_health.py; needs monitoring)",
    )
    interval_seconds: int = Field(60, ge=15, le=3600, description="how often the signals are read")
    max_unhealthy_fraction: float = Field(
        0.34, gt=0, le=1, description="most GPU nodes quarantined at once (a broken exporter must not drain the fleet)"
    )
    evict: bool = Field(True, description="evict serving pods from a node to drain (PDB honoured); off: taint only")


class PrewarmSettings(Model):
    enabled: bool = Field(
        True, description="on every node of the serving pool, pull the serving image and (weights_mode sync) fill "
        "the node's model cache as soon as the node joins, before a serving pod needs them",
    )


class WarmCapacitySettings(Model):
    replicas: int = Field(
        0, ge=0, le=20,
        description="placeholder pods, each holding the GPUs of one serving pod at the lowest priority; a serving "
        "pod preempts one at once instead of waiting for a new node (0: off)",
    )


class ResilienceSettings(Model):
    gpu_health: GpuHealthSettings = Field(default_factory=GpuHealthSettings, description="GPU node quarantine")
    prewarm: PrewarmSettings = Field(default_factory=PrewarmSettings, description="image and model cache pre-warm")
    warm_capacity: WarmCapacitySettings = Field(
        default_factory=WarmCapacitySettings, description="idle GPU capacity held for the next replica"
    )
