"""What `dsvolc preview` prints and the grouped facts its JSON carries.

A policy's message is "<finding>. Fix: <fix>". Violations are grouped by (policy, level,
fix): one group names the resources it concerns as `Kind namespace/name` (Kubernetes
objects and Helm releases) or `module.Type name` (VolcEngine and Pulumi resources, by their
Pulumi name), never by URN, and carries the fix once. The default output is the summary
(stack, deploy phase, engine plan, verdict) and one entry per group; `--verbose` adds the
resource tree, the count by type and each resource's own finding and URN.

May import: `dsvolc.engine` (the recording's types); rich.
"""

from __future__ import annotations

import textwrap
from typing import Any, Protocol

from rich.console import Console
from rich.text import Text

from dsvolc import engine

FIX = " Fix: "
LEVEL_ORDER = {"mandatory": 0, "remediate": 1, "advisory": 2, "disabled": 3}
LEVEL_STYLE = {"mandatory": "bold red", "advisory": "yellow"}


class Previewed(Protocol):  # dsvolc.preview.PreviewResult, without importing it
    stack: str
    environment_class: str
    policy_config: str
    recording: engine.Recording
    plans: list[dict[str, Any]]
    violations: list[dict[str, Any]]
    first_apply: Any
    deploy_phase: dict[str, Any]
    mandatory: list[dict[str, Any]]
    all_mandatory: list[dict[str, Any]]


def split_fix(message: str) -> tuple[str, str | None]:
    """("<finding>.", "<fix>") of a policy message; (message, None) when it names no fix."""
    head, sep, fix = message.partition(FIX)
    return (head, fix.strip()) if sep else (message, None)


def _short_type(rtype: str) -> str:
    """`volcengine:vke/cluster:Cluster` -> `vke.Cluster`; `deepseek-volc:serving:Serving` ->
    `Serving`; `pulumi:providers:kubernetes` -> `provider.kubernetes`."""
    parts = rtype.split(":")
    if len(parts) != 3:
        return rtype
    pkg, module, kind = parts
    if pkg == "pulumi" and module == "providers":
        return f"provider.{kind}"
    if "/" in module:
        first = module.split("/")[0]
        return f"{pkg if first == 'index' else first}.{kind}"  # random:index/...: random.RandomPassword
    return kind if module in ("index", "") or pkg not in ("volcengine", "random") else f"{module}.{kind}"


def resource_ref(r: engine.Recorded | None, urn: str | None, rtype: str | None) -> dict[str, Any]:
    """How a person names the resource a violation concerns: kind, namespace, name, label."""
    if urn is None:
        return {"kind": "Stack", "namespace": None, "name": None, "label": "(the stack)", "type": None, "urn": None}
    if r is None:  # not in the recording (should not happen): read what the URN says
        parts = urn.split("::")
        rtype = rtype or (parts[2].split("$")[-1] if len(parts) >= 4 else "")
        name = parts[-1]
        kind, ns = _short_type(rtype), None
    elif r.type.startswith("kubernetes:") and not r.type.startswith("kubernetes:helm.sh"):
        md = r.inputs.get("metadata") if isinstance(r.inputs.get("metadata"), dict) else {}
        kind = r.inputs.get("kind") or r.type.rsplit(":", 1)[-1]
        ns, name = md.get("namespace"), md.get("name") or r.name
        rtype = r.type
    elif r.type.startswith("kubernetes:helm.sh"):
        kind, ns, name, rtype = "HelmRelease", r.inputs.get("namespace"), r.inputs.get("name") or r.name, r.type
    else:
        kind, ns, name, rtype = _short_type(r.type), None, r.name, r.type
    label = f"{kind} {ns}/{name}" if ns else f"{kind} {name}"
    return {"kind": kind, "namespace": ns, "name": name, "label": label, "type": rtype, "urn": urn}


def findings(result: Previewed) -> list[dict[str, Any]]:
    """The violations grouped by (policy, level, fix), mandatory first: each group with the
    policy's description, the fix once, and the resources it concerns (with each one's
    finding)."""
    by_urn = {r.urn: r for r in result.recording.resources}
    groups: dict[tuple, dict[str, Any]] = {}
    for v in result.violations:
        finding, fix = split_fix(v["message"])
        key = (v["policy"], v["enforcement_level"], fix if fix is not None else finding)
        g = groups.setdefault(key, {"policy": v["policy"], "enforcement_level": v["enforcement_level"],
                                    "description": v.get("description") or "", "fix": fix, "resources": []})
        urn = v.get("resource")
        g["resources"].append({**resource_ref(by_urn.get(urn), urn, v.get("type")), "finding": finding})
    return sorted(groups.values(), key=lambda g: (LEVEL_ORDER.get(g["enforcement_level"], 9), g["policy"],
                                                   g["fix"] or ""))


def _key(g: dict[str, Any]) -> tuple:
    return (g["policy"], g["enforcement_level"], g["fix"] or tuple(r["finding"] for r in g["resources"]))


def merged(deployed: list[dict[str, Any]], first_apply: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups of the stack as deployed and of its first `pulumi up` as one list, so that
    a fix both phases need is printed once: each group gets `phases` (a subset of
    {"deployed", "first_apply"}) and the resources of both, each label once."""
    out: dict[tuple, dict[str, Any]] = {}
    for phase, groups in (("deployed", deployed), ("first_apply", first_apply)):
        for g in groups:
            m = out.setdefault(_key(g), {**g, "resources": [], "phases": []})
            m["phases"].append(phase)
            seen = {r["label"] for r in m["resources"]}
            m["resources"] += [r for r in g["resources"] if r["label"] not in seen]
    return sorted(out.values(), key=lambda g: (LEVEL_ORDER.get(g["enforcement_level"], 9), g["policy"],
                                                g["fix"] or ""))


def verdict(result: Previewed, *, with_first_apply: bool = True) -> dict[str, Any]:
    mandatory = len(result.mandatory)
    blocking = result.all_mandatory if with_first_apply else result.mandatory
    return {"mandatory": mandatory, "advisory": len(result.violations) - mandatory, "passes": not blocking}


def _para(console: Console, text: str, indent: int, style: str = "", *, prefix: str = "") -> None:
    """A paragraph wrapped at the console's width under `indent` spaces, words unbroken
    (rich would pad every wrapped line with spaces to the width)."""
    body = textwrap.fill(prefix + text, width=max(console.width, indent + 20), initial_indent=" " * indent,
                         subsequent_indent=" " * indent, break_long_words=False, break_on_hyphens=False)
    out = Text(body, style=style)
    if prefix:
        out.stylize("bold", indent, indent + len(prefix))
    console.print(out, highlight=False, soft_wrap=True)


def _packed(labels: list[str], width: int) -> list[str]:
    """Labels joined by ", " into lines of at most `width`, none split inside."""
    lines: list[str] = []
    for label in labels:
        if lines and len(lines[-1]) + 2 + len(label) + 1 <= width:  # room for the comma after it
            lines[-1] += f", {label}"
        else:
            if lines:
                lines[-1] += ","
            lines.append(label)
    return lines


def _level(level: str) -> Text:
    return Text(f"{level:<10}", style=LEVEL_STYLE.get(level, ""))


def render_findings(groups: list[dict[str, Any]], console: Console, *, verbose: bool = False) -> None:
    """One entry per (policy, fix): level, policy and how many resources; the policy's
    description once per policy; the resources; the fix once. Verbose: each resource's
    finding and URN too."""
    last_policy = None
    for g in groups:
        n = len(g["resources"])
        head = Text.assemble(_level(g["enforcement_level"]), (g["policy"], "bold"),
                             f"  {n} resource{'s' if n != 1 else ''}")
        console.print(head, highlight=False)
        phases = g.get("phases")
        if phases == ["first_apply"]:
            _para(console, "at the first `pulumi up` only (deploy phase 1)", 4, "dim")
        elif phases and "first_apply" in phases:
            _para(console, "also at the first `pulumi up` (deploy phase 1)", 4, "dim")
        if g["policy"] != last_policy and g["description"]:
            _para(console, g["description"], 4, "dim")
        last_policy = g["policy"]
        if verbose:
            for r in g["resources"]:
                _para(console, r["label"], 4, "cyan")
                _para(console, r["finding"], 6)
                if r["urn"]:
                    _para(console, r["urn"], 6, "dim")
        else:
            labels = sorted(dict.fromkeys(r["label"] for r in g["resources"]))
            for line in _packed(labels, console.width - 4):
                console.print(Text("    " + line, style="cyan"), highlight=False, soft_wrap=True)
        if g["fix"]:
            _para(console, g["fix"], 4, prefix="fix: ")
        elif not verbose:  # no fix text: the finding is what there is to say
            for finding in dict.fromkeys(r["finding"] for r in g["resources"]):
                _para(console, finding, 4)
