"""`dsvolc new NAME --from STACK [--class dev|staging|prod]`: a new environment, one command.

Writes `stacks/Pulumi.<NAME>.yaml` from the source stack's file, comments and order kept
(ruamel.yaml round trip), with what must differ between two stacks changed:

- the stack's cloud resource names derive from its file name (docs/settings.md), so they
  follow NAME by themselves; a name the source sets explicitly (`cluster.name`,
  `weights.bucket_name`, `registry.name`) has the source's name replaced by NAME, or is
  removed (then it derives from NAME) where it does not contain it;
- the public API host `gateway.tls.domain` and its certificate `gateway.tls.certificate_id`
  get the source's name replaced by NAME (`api.dev.deepseek.example.com` ->
  `api.alice.deepseek.example.com`); --domain and --certificate-id set them instead;
- `environment_class` is set to --class when given.

Everything else (region, zones, CIDRs: each stack has its own VPC, so the same block is
fine unless the VPCs are peered) is the source's. The result is validated like any stack
before anything is written; nothing is written when it is invalid or the file exists. The
workflows and tests read the list of stacks from `stacks/Pulumi.*.yaml`
(dsvolc/stackfiles.py), so no other file needs editing.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacks import loader
from stacks.loader import SettingsError

CLASSES = ("dev", "staging", "prod")
# settings that name a cloud resource explicitly (unset: derived from the stack name)
EXPLICIT_NAMES = (("cluster", "name"), ("weights", "bucket_name"), ("registry", "name"))


class NewStackError(Exception):
    """The stack cannot be made; the message says why and what was expected."""


@dataclass
class NewStack:
    name: str
    source: str
    path: Path
    environment_class: str
    class_changed: bool = False
    changes: list[str] = field(default_factory=list)  # what differs from the source, one line each
    domain: str | None = None


def _replace_label(value: str, old: str, new: str) -> str | None:
    """`value` with `old` replaced by `new` where it stands as a whole name part (between
    dots, dashes or the ends); None when it does not."""
    pattern = re.compile(rf"(?<![a-z0-9]){re.escape(old)}(?![a-z0-9])")
    return pattern.sub(new, value) if pattern.search(value) else None


def _plain(node: Any) -> Any:
    """ruamel's round-trip containers as plain dicts and lists (for the loader)."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def make(name: str, source: str, *, environment_class: str | None = None, domain: str | None = None,
         certificate_id: str | None = None, stacks_dir: Path | None = None) -> NewStack:
    """Build the new stack file's text, validate it and write it; raises NewStackError or
    loader.SettingsError (nothing written in either case)."""
    from ruamel.yaml import YAML

    from stacks.settings import STACK_NAME

    if not re.fullmatch(STACK_NAME, name):
        raise NewStackError(f"NAME: {name!r} is not a stack name; expected a lower-case DNS label of 1-20 characters "
                            "(a-z, 0-9, '-' inside), since every cloud resource name derives from it")
    stacks_dir = Path(stacks_dir) if stacks_dir is not None else loader.STACKS_DIR
    if environment_class is not None and environment_class not in CLASSES:
        raise NewStackError(f"--class: {environment_class!r} is not an environment class; expected dev, staging "
                            "or prod")
    target = stacks_dir / f"Pulumi.{name}.yaml"
    if target.exists():
        raise NewStackError(f"{target} exists: stack {name!r} is already defined; choose another name")
    src_path = loader.stack_file(source) if Path(source).suffix in (".yaml", ".yml") else stacks_dir / f"Pulumi.{source}.yaml"
    if not src_path.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in stacks_dir.glob("Pulumi.*.yaml"))
        raise NewStackError(f"--from: no stack file {src_path}; known stacks: {', '.join(known)}")
    src_name = loader.stack_name(str(src_path))
    loader.read_raw(str(src_path))  # the source is a stack file (clear error otherwise)

    y = YAML()  # round trip: the new file keeps the source's comments and order
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)  # the stack files' layout
    doc = y.load(src_path.read_text())
    raw = doc["config"][loader.SETTINGS_KEY]
    result = NewStack(name=name, source=src_name, path=target,
                      environment_class=environment_class or str(raw.get("environment_class")))

    if environment_class is not None and raw.get("environment_class") != environment_class:
        result.changes.append(f"environment_class: {raw.get('environment_class')} -> {environment_class}")
        result.class_changed = True
        raw["environment_class"] = environment_class
    for section, key in EXPLICIT_NAMES:
        block = raw.get(section)
        if not isinstance(block, dict) or not block.get(key):
            continue
        renamed = _replace_label(str(block[key]), src_name, name)
        if renamed is None:
            result.changes.append(f"{section}.{key}: {block[key]} removed (derived from the stack name)")
            del block[key]
        else:
            result.changes.append(f"{section}.{key}: {block[key]} -> {renamed}")
            block[key] = renamed
    tls = (raw.get("gateway") or {}).get("tls") if isinstance(raw.get("gateway"), dict) else None
    if isinstance(tls, dict):
        for key, given in (("domain", domain), ("certificate_id", certificate_id)):
            old = tls.get(key)
            if old is None and given is None:
                continue
            new = given if given is not None else _replace_label(str(old), src_name, name)
            if new is None:
                raise NewStackError(
                    f"gateway.tls.{key}: {old!r} of stack {src_name} does not contain {src_name!r}, so the new "
                    f"stack's value cannot be derived; give it with --{key.replace('_', '-')}")
            if new != old:
                result.changes.append(f"gateway.tls.{key}: {old} -> {new}")
                tls[key] = new
        result.domain = tls.get("domain")
    elif domain is not None or certificate_id is not None:
        raise NewStackError(f"--domain/--certificate-id: stack {src_name} has no gateway.tls to set them in")

    buf = io.StringIO()
    y.dump(doc, buf)
    text = buf.getvalue()
    # the source's own first comment line (`# dev: ...`) describes it: say where NAME came from
    first, _, rest = text.partition("\n")
    header = f"# {name}: made from stack {src_name} by `dsvolc new {name} --from {src_name}`."
    text = (f"{header}\n{first.replace(f'# {src_name}:', f'# {src_name} (the source):', 1)}\n{rest}"
            if first.startswith("#") else f"{header}\n{text}")

    # validate the new stack as the loader will read it: name and settings, every problem listed
    loader.parse(_plain(raw), str(target), stack=name)
    clash = [s for s, d in _domains(stacks_dir).items() if result.domain and d == result.domain]
    if clash:
        raise NewStackError(f"gateway.tls.domain: {result.domain} is served by stack {clash[0]} already; give the "
                            "new stack its own with --domain")

    # write it whole or not at all: a temporary file in the same directory, then a rename
    # that refuses to replace a file created meanwhile
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, target)  # fails if the target appeared meanwhile
    except FileExistsError:
        raise NewStackError(f"{target} exists: stack {name!r} is already defined; choose another name") from None
    finally:
        tmp.unlink()
    return result


def _domains(stacks_dir: Path) -> dict[str, str | None]:
    """The API host each stack file of stacks_dir serves (a file that does not read: none)."""
    out = {}
    for p in stacks_dir.glob("Pulumi.*.yaml"):
        try:
            raw = loader.read_raw(str(p))
        except SettingsError:
            continue
        tls = (raw.get("gateway") or {}).get("tls") or {}
        out[loader.stack_name(str(p))] = tls.get("domain") if isinstance(tls, dict) else None
    return out


def next_steps(result: NewStack) -> list[str]:
    """What a deployment of the new stack needs beyond its file (docs/deploy.md)."""
    n = result.name
    shown = n if result.path.parent == loader.STACKS_DIR else str(result.path)
    steps = [f"dsvolc preview {shown}: the offline verdict (the workflows preview it from now on)"]
    if result.class_changed:
        steps[0] += (f"; a {result.environment_class} stack meets the {result.environment_class} policy config, "
                     "so it may need settings its source did not")
    if not n.endswith("-example"):
        steps += [
            f"its runner: a self-hosted GitHub Actions runner inside its VPC, labelled deepseek-volc-{n} "
            "(docs/deploy.md, step 3); the deploy workflow picks the label from the stack name",
            f"its GitHub environment: {result.environment_class} (its environment_class) holds the deploy "
            "secrets; nothing to create when that environment exists",
        ]
        if result.domain:
            steps.append(f"the certificate for {result.domain} in VolcEngine's certificate service, under "
                         "gateway.tls.certificate_id")
        steps.append(f"deploy phase 1: run the deploy workflow by hand with bootstrap: {n} "
                     f"(or DSVOLC_BOOTSTRAP=1 pulumi up -s {n})")
    return steps


__all__ = ["NewStack", "NewStackError", "SettingsError", "make", "next_steps"]
