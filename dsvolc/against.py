"""`dsvolc preview STACK --against REF`: what a `pulumi up` of this change does to the stack
as it was deployed from REF (a git ref of this repository: the PR's base in pull requests).

Both sides are rendered by their own code: REF's tree is exported with `git archive` into a
temporary directory and previewed there as deployed (`--existing`), the working tree here.
Each resource is then matched by type and name (and the aliases it declares) and classed:

    create    only in the change
    delete    only at REF
    update    inputs changed, none of them replaces it
    replace   an input the provider replaces on changed (`stacks/provider_changes.yaml`:
              ForceNew), an input named in the resource's `replace_on_changes`, its
              replacement trigger, or an immutable field of a Kubernetes object
    same      nothing the engine would send changed (changes of inputs in the resource's
              `ignore_changes` are listed but not sent)

A replace or delete of a stateful or protected resource (cluster, bucket, registry, APIG
gateway, HPC cluster, IAM role, VMP workspace) is a mandatory violation unless the stack
accepts it by name in `accept_replacements`; a change of an input the pinned provider never
sends (verdict `ignored`) is reported, since `pulumi up` would report success and change
nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stacks import provider_changes
from stacks.contract import leaves

ROOT = Path(__file__).resolve().parent.parent

STATEFUL = {
    "volcengine:vke/cluster:Cluster": "the cluster and everything on it",
    "volcengine:tos/bucket:Bucket": "the weights bucket and its objects",
    "volcengine:cr/registry:Registry": "the registry and every image in it",
    "volcengine:apig/apigGateway:ApigGateway": "the edge and its public address",
    "volcengine:ecs/hpcCluster:HpcCluster": "the RDMA fabric of a GPU pool (its nodes leave it)",
    "volcengine:iam/role:Role": "the role pods assume (they lose access until the new one exists)",
    "volcengine:vmp/workspace:Workspace": "the metrics workspace and its data",
}

# Fields of Kubernetes objects the API server refuses to change, so pulumi-kubernetes replaces
# the object (Kubernetes API reference: Deployment/StatefulSet/DaemonSet `spec.selector`
# "immutable after creation"; Service `spec.clusterIP`; Job `spec.selector`, `spec.template`;
# LeaderWorkerSet `spec.leaderWorkerTemplate.size`, per its CRD's x-kubernetes-validations).
K8S_IMMUTABLE = {
    "Deployment": ("spec.selector",),
    "StatefulSet": ("spec.selector", "spec.serviceName", "spec.volumeClaimTemplates"),
    "DaemonSet": ("spec.selector",),
    "Service": ("spec.clusterIP",),
    "Job": ("spec.selector", "spec.template"),
    "PersistentVolumeClaim": ("spec.storageClassName", "spec.volumeName"),
}


class AgainstError(RuntimeError):
    """REF cannot be rendered (not a ref of this repository, or its preview failed)."""


@dataclass
class Change:
    action: str  # create | delete | update | replace | same
    type: str
    name: str
    changed: list[str] = field(default_factory=list)  # input paths that differ
    why: list[str] = field(default_factory=list)  # what makes it a replace, or what is not sent
    not_sent: list[str] = field(default_factory=list)  # changed inputs the provider never sends
    ignored: list[str] = field(default_factory=list)  # changed inputs in ignore_changes

    @property
    def stateful(self) -> bool:
        return self.type in STATEFUL


def stack_name(stack: str) -> str:
    """`prod`, or the stack a `.../Pulumi.prod.yaml` path names."""
    p = Path(stack)
    if p.suffix in (".yaml", ".yml") and p.name.startswith("Pulumi."):
        return p.name[len("Pulumi."):-len(p.suffix)]
    return stack


def render_at(ref: str, stack: str, root: Path = ROOT) -> dict[str, Any]:
    """The preview JSON of `stack` (as deployed) rendered by the code and settings at `ref`
    (a path given as STACK is compared with the stack of the same name at `ref`)."""
    stack = stack_name(stack)
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise AgainstError(f"--against {ref}: not a commit of this repository ({sha.stderr.strip()})")
    with tempfile.TemporaryDirectory(prefix="dsvolc-against-") as tmp:
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", sha.stdout.strip()],
                                 capture_output=True)
        if archive.returncode != 0:
            raise AgainstError(f"--against {ref}: git archive failed: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        if not (Path(tmp) / "stacks" / f"Pulumi.{stack}.yaml").exists():
            return {"stack": stack, "resources": [], "missing": True}
        out = Path(tmp) / "against.json"
        env = {**os.environ, "PYTHONPATH": tmp, "COLUMNS": "200"}
        run = subprocess.run([sys.executable, "-m", "dsvolc.cli", "preview", stack, "--existing", "--quiet",
                              "--json", str(out)], cwd=tmp, env=env, capture_output=True, text=True)
        if run.returncode not in (0, 1) or not out.exists():
            tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
            raise AgainstError(f"--against {ref}: its preview of {stack} failed (exit {run.returncode}): "
                               + " / ".join(tail))
        return json.loads(out.read_text())


def _flat(inputs: dict[str, Any]) -> dict[str, str]:
    return {path: json.dumps(value, sort_keys=True, default=str) for path, value in leaves(inputs or {})}


def _covered(path: str, prefixes: list[str]) -> bool:
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "[") for p in prefixes)


def _kind(type_: str) -> str:
    return type_.rsplit(":", 1)[-1]


def classify(type_: str, name: str, old: dict, new: dict, *, ignore_changes=(), replace_on_changes=(),
             trigger_changed: bool = False) -> Change:
    a, b = _flat(old), _flat(new)
    changed = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
    ch = Change("same", type_, name, changed=changed)
    sent = []
    for p in changed:
        if _covered(p, list(ignore_changes)):
            ch.ignored.append(p)
        else:
            sent.append(p)
    for p in sent:
        if type_.startswith("volcengine:"):
            v = provider_changes.verdict(type_, p.replace("[]", "[]")) or _map_verdict(type_, p)
            if v is not None and v.verdict == "replace":
                ch.why.append(f"{p}: {v.why} ({v.file.rsplit('/', 1)[-1]}:{v.line})")
            elif v is not None and v.verdict == "ignored":
                ch.not_sent.append(f"{p}: {v.why} ({v.file.rsplit('/', 1)[-1]}:{v.line})")
        elif type_.startswith("kubernetes:") and _covered(p, list(K8S_IMMUTABLE.get(_kind(type_), ()))):
            ch.why.append(f"{p}: immutable in the Kubernetes API")
        if _covered(p, list(replace_on_changes)):
            ch.why.append(f"{p}: named in replace_on_changes")
    if trigger_changed:
        ch.why.append("its replacement trigger changed")
    if ch.why:
        ch.action = "replace"
    elif sent:
        ch.action = "update"
    return ch


def _map_verdict(type_: str, path: str):
    """The verdict of a map argument whose key `path` is (`tags.team` -> `tags`)."""
    for p, v in provider_changes.load().get(type_, {}).items():
        if path.startswith(p + "."):
            return v
    return None


def diff(old: dict[str, Any], new: dict[str, Any], recorded: dict[tuple[str, str], Any] | None = None) -> list[Change]:
    """Changes from preview JSON `old` (REF) to `new` (this tree). `recorded` maps
    (type, name) to this tree's engine records, for their resource options."""
    recorded = recorded or {}
    before = {(r["type"], r["name"]): r for r in old.get("resources", [])}
    out: list[Change] = []
    seen = set()
    for r in new.get("resources", []):
        key = (r["type"], r["name"])
        rec = recorded.get(key)
        aliases = list(getattr(rec, "aliases", []) or [])
        match = key if key in before else next(((r["type"], a) for a in aliases if (r["type"], a) in before), None)
        if match is None:
            out.append(Change("create", r["type"], r["name"]))
            continue
        seen.add(match)
        o = before[match]
        out.append(classify(r["type"], r["name"], o.get("inputs", {}), r.get("inputs", {}),
                            ignore_changes=getattr(rec, "ignore_changes", []) or [],
                            replace_on_changes=getattr(rec, "replace_on_changes", []) or [],
                            trigger_changed=o.get("replacement_trigger") != r.get("replacement_trigger")
                            and "replacement_trigger" in o))
    for key, o in before.items():
        if key not in seen:
            out.append(Change("delete", o["type"], o["name"]))
    return out


def violations(changes: list[Change], accepted: list[str]) -> list[dict[str, Any]]:
    """A replace or delete of a stateful resource the stack does not accept: mandatory."""
    out = []
    for c in changes:
        if c.stateful and c.action in ("replace", "delete"):
            level = "advisory" if c.name in accepted else "mandatory"
            why = "; ".join(c.why) if c.why else "it is no longer in the program"
            out.append({
                "policy": "no-stateful-replacement",
                "enforcement_level": level,
                "resource": f"{c.type} {c.name}",
                "message": (f"{c.action} of {c.name} ({STATEFUL[c.type]}): {why}. Fix: undo the change, or, if "
                            f"losing it is intended, add {c.name!r} to accept_replacements in the stack file."
                            + (" Accepted by the stack." if level == "advisory" else "")),
            })
    for c in changes:
        for n in c.not_sent:
            out.append({"policy": "change-not-applied", "enforcement_level": "advisory",
                        "resource": f"{c.type} {c.name}",
                        "message": f"{n}: `pulumi up` would report success and the cloud keep the old value."})
    return out


def summary(changes: list[Change]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in changes:
        counts[c.action] = counts.get(c.action, 0) + 1
    return counts


def as_json(ref: str, changes: list[Change], found: list[dict[str, Any]]) -> dict[str, Any]:
    return {"ref": ref, "summary": summary(changes),
            "changes": [asdict(c) for c in changes if c.action != "same"], "violations": found}


def short(type_: str) -> str:
    """`volcengine:vke/cluster:Cluster` -> `vke/cluster`, `kubernetes:apps/v1:Deployment` -> `Deployment`."""
    pkg, mod, kind = (type_.split(":") + ["", ""])[:3]
    return kind if pkg == "kubernetes" else (mod or type_)


def compare(ref: str, stack: str, result) -> dict[str, Any]:
    """Changes and verdicts of this tree's preview `result` (the stack as deployed) against REF."""
    from stacks import loader

    old = render_at(ref, stack)
    new = result.as_json()
    recorded = {(r.type, r.name): r for r in result.recording.resources}
    changes = diff(old, new, recorded)
    accepted = list(loader.load(stack).accept_replacements)
    doc = as_json(ref, changes, violations(changes, accepted))
    if old.get("missing"):
        doc["note"] = f"stack {stack} does not exist at {ref}: everything is created"
    return doc


def render_changes(doc: dict[str, Any], console) -> None:
    counts = ", ".join(f"{n} {a}" for a, n in sorted(doc["summary"].items()))
    console.print(f"against {doc['ref']}: {counts}", highlight=False, markup=False, soft_wrap=True)
    if doc.get("note"):
        console.print(f"  {doc['note']}", highlight=False, markup=False, soft_wrap=True)
    for c in doc["changes"]:
        what = f"{c['action']:7s} {short(c['type'])} {c['name']}"
        detail = "; ".join(c["why"]) if c["action"] == "replace" else ", ".join(c["changed"][:6]) + (
            f" (+{len(c['changed']) - 6})" if len(c["changed"]) > 6 else "")
        console.print(f"  {what}" + (f": {detail}" if detail else ""), highlight=False, markup=False, soft_wrap=True)
        if c["ignored"]:
            console.print(f"          not applied (ignore_changes): {', '.join(c['ignored'])}", highlight=False,
                          markup=False, soft_wrap=True)
    for v in doc["violations"]:
        console.print(f"{v['enforcement_level']} {v['policy']}: {v['message']}", highlight=False, markup=False,
                      soft_wrap=True)
