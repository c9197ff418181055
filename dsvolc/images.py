"""`dsvolc images STACK`: what to copy into the stack's own registry, and recording digests.

    dsvolc images prod                       every chart, image and file: source, target, digest
    dsvolc images prod --json images.json    the same as JSON
    dsvolc images prod --script > mirror.sh  copy commands (skopeo, helm, curl) that write digests/
    dsvolc images prod --record digests/     record what the copies resolved into the lock file
    dsvolc images prod --ref vllm-base       one mirror reference, by digest (fails if not recorded)
    dsvolc images prod --record-build meta.json --image serving
                                             the digest a build pushed (docker buildx --metadata-file)
                                             into serving.image.digest of the stack file

Digests are never typed: they come from the copy (skopeo's --digestfile, helm push's
Digest line, sha256sum of a file) or from the build's metadata.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from stacks import loader
from stacks.loader import SettingsError

IMAGE_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
FILE_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _fail(message: str, code: int = 1) -> None:
    Console(stderr=True, soft_wrap=True).print(f"error: {message}", highlight=False, markup=False)
    raise typer.Exit(code)


def _digest_file(entry) -> str:
    return f"{entry.kind}-{entry.name}.digest"


def copy_script(plan, entries) -> str:
    """A POSIX shell script copying every artifact into the mirror with standard tools,
    each writing the digest it resolved to digests/<kind>-<name>.digest."""
    settings = plan.settings
    from workloads.supply_chain import mirror

    host = mirror.registry_host(plan)
    lines = [
        "#!/usr/bin/env bash",
        f"# Mirror of stack {settings.stack} into {mirror.mirror_prefix(plan)}.",
        f"# Log in first: skopeo login {host} && helm registry login {host}",
        f"# Then record: dsvolc images {settings.stack} --record digests/",
        "set -euo pipefail",
        "mkdir -p digests charts files",
    ]
    for e in entries:
        out = f"digests/{_digest_file(e)}"
        lines.append(f"# {e.kind} {e.name}: {e.purpose}")
        if e.kind == "image" and e.source.startswith("built by"):
            lines.append(f"# built, not copied: runtime/build.sh plugin {settings.stack} records it")
            continue
        if e.kind == "image":
            repo, _, _tag = e.source.rpartition(":")
            # an image already recorded is copied by its digest: a moved upstream tag cannot slip in
            src = f"docker://{repo}@{e.digest}" if e.digest else f"docker://{e.source}"
            lines.append(f"skopeo copy --all --preserve-digests --digestfile {out} "
                         f"{shlex.quote(src)} {shlex.quote('docker://' + e.target)}")
        elif e.kind == "chart":
            version = e.target.rsplit(":", 1)[1]
            dest = e.target.rsplit(":", 1)[0].rsplit("/", 1)[0]  # oci://host/ns/charts
            if e.source.startswith("oci://"):
                pull = f"helm pull {shlex.quote(e.source.rsplit(':', 1)[0])} --version {version} -d charts"
            else:
                url, chart, _ = e.source.split(" ")
                pull = f"helm pull {chart} --repo {shlex.quote(url)} --version {version} -d charts"
            lines.append(pull)
            lines.append(f"helm push charts/{e.name}-{version}.tgz {dest} 2>&1 | tee /dev/stderr "
                         f"| sed -n 's/^Digest: //p' > {out}")
        elif e.kind == "file":
            local = f"files/{e.name}"
            lines.append(f"curl -fsSL -o {local} {shlex.quote(e.source)}")
            if e.digest:
                lines.append(f"echo '{e.digest}  {local}' | sha256sum -c -")
            lines.append(f"sha256sum {local} | cut -d' ' -f1 > {out}")
    return "\n".join(lines) + "\n"


def record(plan, entries, directory: Path) -> list[str]:
    """Read digests/<kind>-<name>.digest into the lock; returns what changed. A digest that
    differs from the one recorded is refused: the upstream artifact moved under its tag."""
    from workloads.supply_chain import mirror

    lock = mirror.read_lock(plan)
    sections = {"images": dict(lock.images), "charts": dict(lock.charts), "files": dict(lock.files)}
    changed, problems = [], []
    for e in entries:
        f = directory / _digest_file(e)
        if not f.is_file():
            continue
        value = f.read_text().strip()
        pattern = FILE_SHA256 if e.kind == "file" else IMAGE_DIGEST
        if not pattern.match(value):
            problems.append(f"{f}: expected {'64 hex digits' if e.kind == 'file' else 'sha256:<64 hex digits>'}, "
                            f"got {value[:80]!r}")
            continue
        old = sections[e.lock_section].get(e.lock_key)
        if old and old != value:
            problems.append(f"{e.kind} {e.name}: {f} says {value}, the lock says {old}: {e.source} changed "
                            "upstream; investigate before replacing the recorded digest")
            continue
        if old != value:
            sections[e.lock_section][e.lock_key] = value
            changed.append(f"{e.kind} {e.name}: {value}")
    if problems:
        _fail("\n  ".join(["nothing recorded:", *problems]))
    mirror.write_lock(mirror.lock_path(plan), mirror.Lock(sections["images"], sections["charts"],
                                                               sections["files"], mirror.lock_path(plan)))
    return changed


def record_build(stack: str, plan, metadata: Path, image: str) -> str:
    """The digest a build pushed, from docker buildx's --metadata-file, into the stack."""
    from workloads.supply_chain import mirror

    try:
        meta = json.loads(metadata.read_text())
    except (OSError, ValueError) as exc:
        _fail(f"{metadata}: not a build metadata file ({exc})")
    value = meta.get("containerimage.digest", "")
    if not IMAGE_DIGEST.match(value):
        _fail(f"{metadata}: containerimage.digest is {value!r}; expected sha256:<64 hex digits> "
              "(docker buildx build --push --metadata-file FILE)")
    if image == "plugin":
        lock = mirror.read_lock(plan)
        images = dict(lock.images)
        images[mirror.target_key(mirror.GATEWAYAPI_PLUGIN)] = value
        mirror.write_lock(mirror.lock_path(plan), mirror.Lock(images, lock.charts, lock.files, lock.path))
        return value
    from ruamel.yaml import YAML

    path = loader.stack_file(stack)
    y = YAML()  # round trip: the stack file keeps its comments and order
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)  # the stack files' layout
    doc = y.load(path.read_text())
    img = doc["config"][loader.SETTINGS_KEY]["serving"]["image"]
    img["digest"] = value
    with path.open("w") as fh:
        y.dump(doc, fh)
    return value


def images(
    stack: str = typer.Argument(..., help="stack name (dev, staging, prod) or path to a Pulumi.<stack>.yaml"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the list as JSON to this file"),
    script: bool = typer.Option(False, "--script", help="print the copy commands (skopeo, helm, curl)"),
    record_dir: Optional[Path] = typer.Option(None, "--record", help="record the digests the copies wrote here"),
    ref: Optional[str] = typer.Option(None, "--ref", help="print one mirror reference by digest ('serving': the "
                                      "stack's serving repository)"),
    record_build_file: Optional[Path] = typer.Option(None, "--record-build",
                                                     help="docker buildx --metadata-file of a pushed build"),
    image: str = typer.Option("serving", "--image", help="what --record-build built: serving or plugin"),
    plugin_build_args: bool = typer.Option(False, "--plugin-build-args", hidden=True,
                                           help="URL, sha256 and target of the plugin image (runtime/build.sh)"),
) -> None:
    """List every chart, image and file the stack deploys, as copied into its own registry
    (source, target, digest), and record the digests the copy or the build resolved."""
    from workloads.supply_chain import mirror

    try:
        plan = loader.load_plan(stack)
    except SettingsError as exc:
        _fail(str(exc), 2)
    settings = plan.settings
    from workloads.supply_chain import inventory

    entries = inventory.entries(plan)
    console = Console(soft_wrap=True)
    if ref is not None:
        if ref == "serving":
            print(settings.serving.image.repository or plan.names.image_repository)
            return
        if ref not in mirror.BY_KEY:
            _fail(f"--ref: {ref!r} is not an image; expected serving or one of {', '.join(mirror.BY_KEY)}", 2)
        img = mirror.BY_KEY[ref]
        if not mirror.digest(plan, img):
            _fail(f"{img.source} has no recorded digest: mirror it first (dsvolc images {settings.stack} --script)")
        print(mirror.ref(plan, ref))
        return
    if plugin_build_args:
        f = mirror.GATEWAYAPI_PLUGIN
        sha = mirror.plugin_sha256(plan)
        if not sha:
            _fail(f"{f.source} has no recorded sha256: mirror it first (dsvolc images {settings.stack} --script)")
        print(f.source, sha, mirror.target(plan, f))
        return
    if record_build_file is not None:
        if image not in ("serving", "plugin"):
            _fail(f"--image: expected serving or plugin, got {image!r}", 2)
        value = record_build(stack, plan, record_build_file, image)
        console.print(f"recorded {image} {value}", highlight=False)
        return
    if record_dir is not None:
        changed = record(plan, entries, record_dir)
        console.print(f"recorded {len(changed)} digest(s) in {mirror.lock_path(plan)}", highlight=False)
        for c in changed:
            console.print(f"  {c}", highlight=False)
        return
    if script:
        print(copy_script(plan, entries), end="")
        return
    table = Table(title=f"stack {settings.stack}: mirror {mirror.mirror_prefix(plan)}")
    for col in ("kind", "name", "source", "target", "digest"):
        table.add_column(col, overflow="fold")
    for e in entries:
        table.add_row(e.kind, e.name, e.source, e.target, e.digest or "[yellow]resolve at mirror time[/yellow]")
    console.print(table)
    missing = sum(1 for e in entries if not e.digest)
    console.print(f"{len(entries)} artifacts, {missing} without a recorded digest"
                  + (f" (dsvolc images {settings.stack} --script, then --record)" if missing else ""),
                  highlight=False)
    if json_out is not None:
        json_out.write_text(json.dumps({
            "stack": settings.stack, "mirror": mirror.mirror_prefix(plan),
            "artifacts": [{"kind": e.kind, "name": e.name, "source": e.source, "target": e.target,
                           "digest": e.digest, "purpose": e.purpose} for e in entries]}, indent=2) + "\n")
