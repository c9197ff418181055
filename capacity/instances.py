"""VolcEngine GPU instance types: which GPU, and how many, each one carries."""

from __future__ import annotations

# ---------------------------------------------------------------------------
# VolcEngine instance types -> (GPU key, GPUs per node)
# ---------------------------------------------------------------------------
# Only types whose GPU model and count could be confirmed from a citable source are
# listed. VolcEngine's own instance-type pages were not reachable from the reference
# index; for any type not listed here a stack must state the GPU model and count
# itself (resolve_instance_type returns None).
INSTANCE_TYPES: dict[str, tuple[str, int]] = {
    # "Ecs.gni2.3xlarge: 14 vCPUs, 56 GB, GPU: A10 x 1" -- server specification in a
    # public project README (GitHub code index, file id 24125668149). Family ecs.gni2 =
    # VolcEngine GPU compute type with NVIDIA A10.
    "ecs.gni2.3xlarge": ("A10", 1),
}

def resolve_instance_type(instance_type: str) -> tuple[str, int] | None:
    """(GPU key, GPUs per node) for a confirmed VolcEngine instance type, else None."""
    if not instance_type:
        return None
    return INSTANCE_TYPES.get(instance_type.strip().lower())
