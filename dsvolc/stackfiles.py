"""The stacks of the repository, read from `stacks/Pulumi.*.yaml`: the one list every
workflow and test derives its stacks from.

A stack is a file `stacks/Pulumi.<name>.yaml`; its `environment_class` puts it in a deploy
tier (dev, then staging, then prod). A stack named `*-example` shows a serving shape and is
previewed offline like every stack, but has no cloud deployment.

    python -m dsvolc.stackfiles [--bootstrap NAME] >> "$GITHUB_OUTPUT"

writes the matrices the workflows use, as JSON lists: `all` (offline preview), `deployed`
(`pulumi preview`), `dev`, `staging`, `prod` (the deploy tiers) and, with --bootstrap, the
GitHub environment (the stack's class) of the stack to bootstrap.

It needs PyYAML and nothing else of the project (the workflow's job installs only that), so
it imports no other module of the project.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("dev", "staging", "prod")  # deploy order
EXAMPLE_SUFFIX = "-example"


@dataclass(frozen=True)
class StackFile:
    name: str
    environment_class: str | None  # None: the file has none (the loader refuses it)
    path: Path

    @property
    def deployed(self) -> bool:
        return not self.name.endswith(EXAMPLE_SUFFIX)


def settings_key(root: Path = ROOT) -> str:
    """`<project>:settings`, the project's name from Pulumi.yaml."""
    project = yaml.safe_load((root / "Pulumi.yaml").read_text())["name"]
    return f"{project}:settings"


def stack_files(root: Path = ROOT) -> list[StackFile]:
    """Every stack file under root/stacks, sorted by name."""
    key = settings_key(root)
    out = []
    for path in sorted((root / "stacks").glob("Pulumi.*.yaml")):
        name = path.name[len("Pulumi."):-len(".yaml")]
        doc = yaml.safe_load(path.read_text()) or {}
        raw = ((doc.get("config") or {}).get(key) or {}) if isinstance(doc, dict) else {}
        cls = raw.get("environment_class") if isinstance(raw, dict) else None
        out.append(StackFile(name, cls if cls in CLASSES else None, path))
    return out


def matrices(root: Path = ROOT) -> dict[str, list[str]]:
    stacks = stack_files(root)
    out = {"all": [s.name for s in stacks], "deployed": [s.name for s in stacks if s.deployed]}
    for cls in CLASSES:
        out[cls] = [s.name for s in stacks if s.deployed and s.environment_class == cls]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsvolc.stackfiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    parser.add_argument("--bootstrap", default="", help="the stack to bootstrap; prints its GitHub environment")
    args = parser.parse_args(argv)
    stacks = {s.name: s for s in stack_files(args.root)}
    lines = [f"{k}={json.dumps(v)}" for k, v in matrices(args.root).items()]
    if args.bootstrap:
        s = stacks.get(args.bootstrap)
        if s is None or not s.deployed or s.environment_class is None:
            known = ", ".join(n for n, x in stacks.items() if x.deployed)
            print(f"error: bootstrap: {args.bootstrap!r} is not a deployed stack with an environment_class; "
                  f"expected one of: {known}", file=sys.stderr)
            return 2
        lines.append(f"bootstrap-environment={s.environment_class}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
