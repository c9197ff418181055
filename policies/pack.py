"""The pack's identity and its policies, importable without starting a server."""

from __future__ import annotations

from pathlib import Path

import yaml

from . import (
    capacity,
    cluster,
    edge,
    gateway,
    identity,
    metrics,
    network,
    operations,
    pods,
    pulls,
    storage,
    supply_chain,
    workload,
)

PACK_DIR = Path(__file__).resolve().parent
PACK_NAME = "deepseek-volc"
MODULES = (storage, identity, network, cluster, pods, workload, pulls, gateway, edge, operations, metrics, capacity,
           supply_chain)
POLICIES = [p for m in MODULES for p in m.POLICIES]


def pack_version() -> str:
    """The version the Pulumi CLI reports for this pack (PulumiPolicy.yaml)."""
    doc = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text()) or {}
    return str(doc.get("version", "0.0.1"))


def pack_description() -> str:
    doc = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text()) or {}
    return str(doc.get("description", ""))
