"""`dsvolc preview STACK`: the offline preview of a stack.

Runs the real program under the mock engine (dsvolc.engine), then the real policy pack
through pulumi_policy's analyzer servicer (dsvolc.policy_runner), and reports both.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from dsvolc import engine
from stacks import loader


@dataclass
class PreviewResult:
    stack: str
    recording: engine.Recording
    violations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mandatory(self) -> list[dict[str, Any]]:
        return [v for v in self.violations if v["enforcement_level"] == "mandatory"]

    def as_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "resources": [r.as_json() for r in self.recording.resources],
            "violations": self.violations,
        }


def run_preview(stack: str, *, policies: bool = True, transforms=None, raw: dict | None = None) -> PreviewResult:
    """Validate the stack's settings, run the program, run the policies.

    Raises loader.SettingsError for bad settings (before anything runs)."""
    name = loader.stack_name(stack)
    if raw is None:
        raw = loader.read_raw(stack)
    loader.parse(raw, str(loader.stack_file(stack)))  # fail fast, with every problem listed
    recording = engine.run(name, raw, transforms=transforms)
    result = PreviewResult(stack=name, recording=recording)
    if policies:
        from dsvolc import policy_runner

        result.violations = policy_runner.analyze(recording, policy_config=policy_runner.load_policy_config(name))
    return result


def render(result: PreviewResult, console: Console) -> None:
    resources = result.recording.resources
    by_urn = {r.urn: r for r in resources}
    children: dict[str | None, list[engine.Recorded]] = {}
    for r in resources:
        parent = r.parent if r.parent in by_urn else None
        children.setdefault(parent, []).append(r)

    tree = Tree(f"[bold]stack {result.stack}[/bold] ({len(resources)} resources)")

    def add(node: Tree, parent: str | None) -> None:
        for r in sorted(children.get(parent, []), key=lambda x: (x.type, x.name)):
            style = "bold cyan" if not r.custom else ""
            label = f"[{style}]{r.name}[/{style}] [dim]{r.type}[/dim]" if style else f"{r.name} [dim]{r.type}[/dim]"
            add(node.add(label), r.urn)

    add(tree, None)
    console.print(tree)

    counts = Counter(r.type for r in resources)
    table = Table(title="resources by type")
    table.add_column("type")
    table.add_column("count", justify="right")
    for t, n in sorted(counts.items()):
        table.add_row(t, str(n))
    console.print(table)

    if result.violations:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for v in result.violations:
            grouped.setdefault(v["policy"], []).append(v)
        vt = Table(title="policy violations")
        vt.add_column("policy")
        vt.add_column("level")
        vt.add_column("resource")
        vt.add_column("message")
        for policy, items in sorted(grouped.items()):
            for v in items:
                level = v["enforcement_level"]
                colour = "red" if level == "mandatory" else "yellow"
                vt.add_row(policy, f"[{colour}]{level}[/{colour}]", v.get("resource") or "(stack)", v["message"])
        console.print(vt)
    mandatory = len(result.mandatory)
    advisory = len(result.violations) - mandatory
    console.print(f"policy verdict: {mandatory} mandatory, {advisory} advisory violation(s)")


def write_json(result: PreviewResult, path: Path) -> None:
    path.write_text(json.dumps(result.as_json(), indent=2, sort_keys=False) + "\n")
