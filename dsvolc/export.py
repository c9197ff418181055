"""`dsvolc manifests STACK DIR`: every Kubernetes object a stack registers, as YAML files.

The objects are the ones the program hands the Kubernetes provider when the stack exists
(the "existing" run of dsvolc.engine, deploy phase 2): the serving workload, the gateway,
autoscaling, monitoring, the platform's plain manifests and the namespaces. Left out:

* Helm releases: they are charts the provider fetches and renders at `pulumi up`; their
  values are in `dsvolc preview --json`;
* Secrets: their values come from Pulumi's state (generated passwords, the reader's key),
  which an offline run does not have.

Values the cloud computes (the reader role's TRN, the VMP write endpoint, ...) are the
offline run's stand-ins (dsvolc/engine.py ExistingStackMocks): the files are for reading,
scanning (checkov, kubeconform, ...) and review, not for `kubectl apply`.

One object per file, `DIR/<namespace or _cluster>/<kind>-<name>.yaml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dsvolc import engine
from stacks import loader

NOT_OBJECTS = ("kubernetes:helm.sh/v3:Release",)
LEFT_OUT_KINDS = ("Secret",)
CLUSTER_DIR = "_cluster"


def kubernetes_objects(recording: engine.Recording) -> list[dict[str, Any]]:
    """The Kubernetes objects of a recording, in registration order, without Helm releases
    and Secrets."""
    out = []
    for r in recording.resources:
        if not r.type.startswith("kubernetes:") or r.type in NOT_OBJECTS:
            continue
        obj = dict(r.raw_inputs)
        if obj.get("kind") in LEFT_OUT_KINDS:
            continue
        out.append(obj)
    return out


def object_path(obj: dict[str, Any]) -> Path:
    md = obj.get("metadata") or {}
    return Path(md.get("namespace") or CLUSTER_DIR) / f"{obj['kind'].lower()}-{md['name']}.yaml"


def render(stack: str, raw: dict | None = None) -> list[dict[str, Any]]:
    """The stack's objects. Raises loader.SettingsError for bad settings."""
    name = loader.stack_name(stack)
    written = None
    if raw is None:
        raw, written = loader.read_stack(stack)
    loader.parse_plan(raw, str(loader.stack_file(stack)), stack=name, written=written)  # every settings error first
    return kubernetes_objects(engine.run(name, raw, mode="existing"))


def write(objects: list[dict[str, Any]], directory: Path) -> list[Path]:
    """Write each object to its file under `directory`; returns the files written. A file
    of the same name is replaced; other files in the directory are left alone."""
    written = []
    for obj in objects:
        path = Path(directory) / object_path(obj)
        if path in written:
            raise ValueError(f"two objects map to {path}: kind and name repeat in one namespace")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(obj, sort_keys=False, width=1000))
        written.append(path)
    return written
