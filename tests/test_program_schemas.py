"""Every Kubernetes object the program registers, as the engine receives it, passes the
Kubernetes OpenAPI schema of the stack's cluster version or its real CRD schema."""

from __future__ import annotations

import pytest

import k8s_schema
from dsvolc import engine
from stacks import load, read_raw, shipped_stacks

STACKS = shipped_stacks()
# Helm releases are charts, not objects.
NOT_OBJECTS = {"kubernetes:helm.sh/v3:Release"}


@pytest.mark.parametrize("stack", STACKS)
def test_every_registered_object_is_schema_valid(stack):
    version = load(stack).cluster.kubernetes_version
    rec = engine.run(stack, read_raw(stack), mode="existing")
    checked = 0
    for r in rec.resources:
        if not r.type.startswith("kubernetes:") or r.type in NOT_OBJECTS:
            continue
        obj = dict(r.raw_inputs)
        assert obj.get("apiVersion") and obj.get("kind"), r.name
        k8s_schema.validate(obj, version)
        checked += 1
    kinds = {r.type for r in rec.resources if r.type.startswith("kubernetes:")}
    assert checked >= 20 and len(kinds) >= 12


def test_every_custom_kind_has_a_schema():
    known = k8s_schema.known_kinds()
    kinds = {(r.raw_inputs["apiVersion"], r.raw_inputs["kind"]) for s in STACKS
             for r in engine.run(s, read_raw(s), mode="existing").resources
             if r.type.startswith("kubernetes:") and r.type not in NOT_OBJECTS}
    builtin_groups = {"apps", "policy", "batch", "autoscaling", "networking.k8s.io", "rbac.authorization.k8s.io",
                      "scheduling.k8s.io"}
    custom = {(av, kind) for av, kind in kinds if "/" in av and av.split("/")[0] not in builtin_groups}
    missing = {(av, kind) for av, kind in custom
               if av.split("/")[1] not in known.get((av.split("/")[0], kind), ())}
    assert not missing, missing
