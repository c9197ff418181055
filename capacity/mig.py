"""Multi-Instance GPU (MIG) profiles: which slices each catalogued GPU can be cut into,
how many of a profile fit one GPU, and how much memory a slice gives the engine.

A pool partitions every GPU of its nodes into as many instances of one profile as fit
(the "all-<profile>" layout), and a serving pod takes one slice. A CUDA process sees a
single MIG device, so a replica on a slice runs with tensor and pipeline parallel 1.

Sources:

* Profile names, fraction of memory and instances per GPU: NVIDIA Multi-Instance GPU User
  Guide, "Supported MIG Profiles"
  (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) and
  "Supported GPUs" (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html:
  A100 40/80 GB, H100, H20 and H200 all take up to 7 instances). H800 is the export variant
  of H100 SXM (same GH100 die and 80 GB); it is given the H100 table.
* Memory a slice reports (`nvidia-smi mig -lgip`, the number vLLM's
  gpu_memory_utilization is a fraction of): for A100 40 GB and 80 GB the per-profile
  MemorySizeMB of NVIDIA's NVML mock of those boards, NVIDIA/go-nvml
  pkg/nvml/mock/gpus/a100.go (commit 2f9e261fe40a7a1c54783d66805e8920564763b4), e.g.
  1g.5gb = 4864 MiB, 7g.40gb = 40192 MiB. For the Hopper boards no such table was found:
  their slices are *estimated* as the profile's memory fraction x the board's driver-reported
  memory (capacity.catalog.GPUS) x 0.9625, the ratio the A100-80G 1g.10gb slice shows
  (9856 / 10240 MiB). `MigProfile.estimated` says which is which.

The "+me" (media extension) variants have the same memory as their base profile and only
add video decoders; they are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from capacity.catalog import GPUS
from capacity.specs import GPUSpec, MiB

# Memory comes in eighths of the board on every GPU listed here ("Fraction of Memory").
EIGHTHS = 8
# What the A100-80G 1g.10gb slice reports against an eighth of the board (9856 / 10240).
HOPPER_SLICE_RATIO = 9856 / 10240


@dataclass(frozen=True)
class MigProfile:
    gpu: str  # catalog GPU key
    name: str  # e.g. "1g.10gb"
    compute_slices: int  # the "<n>g" part: sevenths of the SMs
    memory_eighths: int  # fraction of the board's memory, in eighths
    per_gpu: int  # instances of this profile one GPU holds (all-<profile> layout)
    memory_mib: int  # memory the slice reports
    estimated: bool  # memory_mib derived, not read from a source

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    @property
    def resource(self) -> str:
        """The extended resource the NVIDIA device plugin advertises (mixed strategy)."""
        return f"nvidia.com/mig-{self.name}"


# (name, compute slices, memory eighths, instances per GPU, reported MiB or None)
_A100_40G = [
    ("1g.5gb", 1, 1, 7, 4864),
    ("1g.10gb", 1, 2, 4, 9856),
    ("2g.10gb", 2, 2, 3, 9856),
    ("3g.20gb", 3, 4, 2, 19968),
    ("4g.20gb", 4, 4, 1, 19968),
    ("7g.40gb", 7, 8, 1, 40192),
]
_A100_80G = [
    ("1g.10gb", 1, 1, 7, 9856),
    ("1g.20gb", 1, 2, 4, 19968),
    ("2g.20gb", 2, 2, 3, 19968),
    ("3g.40gb", 3, 4, 2, 40192),
    ("4g.40gb", 4, 4, 1, 40192),
    ("7g.80gb", 7, 8, 1, 80384),
]


def _hopper(sizes: tuple[int, int, int, int]) -> list[tuple[str, int, int, int, None]]:
    """The Hopper layout, with profile names from the board's size per memory share."""
    one, two, four, eight = sizes
    return [
        (f"1g.{one}gb", 1, 1, 7, None),
        (f"1g.{two}gb", 1, 2, 4, None),
        (f"2g.{two}gb", 2, 2, 3, None),
        (f"3g.{four}gb", 3, 4, 2, None),
        (f"4g.{four}gb", 4, 4, 1, None),
        (f"7g.{eight}gb", 7, 8, 1, None),
    ]


_TABLES = {
    "A100-40G": _A100_40G,
    "A100-80G": _A100_80G,
    "H100": _hopper((10, 20, 40, 80)),
    "H800": _hopper((10, 20, 40, 80)),
    "H20": _hopper((12, 24, 48, 96)),
    "H200": _hopper((18, 35, 71, 141)),
}


def _build() -> dict[str, dict[str, MigProfile]]:
    out: dict[str, dict[str, MigProfile]] = {}
    for gpu, rows in _TABLES.items():
        board_mib = GPUS[gpu].memory_bytes // MiB
        out[gpu] = {}
        for name, g, eighths, per_gpu, mib in rows:
            estimated = mib is None
            if estimated:
                mib = math.floor(board_mib * eighths / EIGHTHS * HOPPER_SLICE_RATIO)
            out[gpu][name] = MigProfile(gpu, name, g, eighths, per_gpu, mib, estimated)
    return out


MIG_PROFILES: dict[str, dict[str, MigProfile]] = _build()


class MigError(KeyError):
    """A profile the GPU does not have, or a GPU without MIG; the message says what fits."""

    def __str__(self) -> str:  # KeyError quotes its message; this one reads as a sentence
        return str(self.args[0])


def mig_profile(gpu: str, profile: str) -> MigProfile:
    """The profile `profile` of catalog GPU `gpu`, or MigError naming the valid choices."""
    if gpu not in MIG_PROFILES:
        raise MigError(f"{gpu} has no MIG; MIG GPUs: {', '.join(MIG_PROFILES)}")
    table = MIG_PROFILES[gpu]
    if profile not in table:
        raise MigError(f"{profile!r} is not a MIG profile of {gpu}; expected one of {', '.join(table)}")
    return table[profile]


def slice_gpu(gpu: GPUSpec, profile: MigProfile) -> GPUSpec:
    """The slice as a GPU the planner can size a replica on: the slice's memory, the
    board's number formats, no interconnect (one slice, one process)."""
    return replace(gpu, name=f"{gpu.name} MIG {profile.name}", memory_bytes=profile.memory_bytes,
                   interconnect="none (one MIG slice)", nominal_gb=0,
                   source=f"{gpu.source}; MIG slice: capacity/mig.py")


__all__ = ["MIG_PROFILES", "MigError", "MigProfile", "mig_profile", "slice_gpu"]
