"""What a change of each argument does under the pinned provider: update in place,
replace the resource, or nothing at all (the provider never sends it).

The data is `stacks/provider_changes.yaml`, generated from the provider's own source at the
contract's commit (terraform-provider-volcengine v0.0.194, what pulumi-volcengine 0.0.47
wraps) and checked by tests/test_provider_contract.py against the contract: every argument
the program sets has a verdict with the line that decides it.

    replace   the field, or an enclosing block, is `ForceNew: true` in the resource's schema
    ignored   the resource's update call converts only the fields it lists
              (`ConvertMode: ve.RequestConvertInConvert`) and this field is not among them, so
              `pulumi up` reports success and the cloud keeps the old value
    update    anything else (sent by the update call)

Regenerate after moving the pin (the provider checkout at any commit; the file names the one read):

    python -m stacks.provider_changes --provider DIR/terraform-provider-volcengine
"""

from __future__ import annotations

import argparse
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

CHANGES_FILE = Path(__file__).resolve().with_name("provider_changes.yaml")
VERDICTS = ("update", "replace", "ignored")


@dataclass(frozen=True)
class Change:
    verdict: str  # update | replace | ignored
    file: str
    line: int | None  # the line that decides it (ForceNew, or the update call); None: update by default
    why: str = ""


@lru_cache(maxsize=1)
def load() -> dict[str, dict[str, Change]]:
    """resource type -> argument path -> Change."""
    # libyaml's loader (PyYAML's C binding) where built: the same document, a tenth of the time
    doc = yaml.load(CHANGES_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    out: dict[str, dict[str, Change]] = {}
    for rtype, args in (doc.get("resources") or {}).items():
        out[rtype] = {}
        for path, e in args.items():
            if e["verdict"] not in VERDICTS:
                raise ValueError(f"{CHANGES_FILE.name}: {rtype} {path}: verdict must be one of {VERDICTS}")
            out[rtype][path] = Change(e["verdict"], e["file"], e.get("line"), e.get("why", ""))
    return out


def verdict(resource_type: str, path: str) -> Change | None:
    return load().get(resource_type, {}).get(path)


def ignored(resource_type: str) -> list[str]:
    """Arguments of `resource_type` whose change the pinned provider never sends."""
    return sorted(p for p, c in load().get(resource_type, {}).items() if c.verdict == "ignored")


def commit() -> str:
    return yaml.safe_load(CHANGES_FILE.read_text())["provider"]["commit"]


# --------------------------------------------------------------------------- the generator


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def tf_path(path: str, tf: str | None = None) -> list[str]:
    """`nodeConfig.dataVolumes[].type` -> ['node_config', 'data_volumes', 'type']."""
    if tf:
        return [p for p in re.split(r"[.\[\]]+", tf) if p]
    return [_snake(p) for p in re.split(r"[.\[\]]+", path) if p]


def schema_fields(src: str) -> dict[tuple[str, ...], dict]:
    """Every `"key": {` block of a Go schema file: its path of keys, its first line and the
    line of a `ForceNew: true` written directly in it. String literals are skipped."""
    fields: dict[tuple[str, ...], dict] = {}
    stack: list[tuple[tuple[str, ...], int]] = []  # (path, depth inside its braces)
    depth, line, i, n = 0, 1, 0, len(src)
    key_re = re.compile(r'"([a-z0-9_]+)":\s*\{')
    force_re = re.compile(r"ForceNew:\s*true")
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
        elif c == '"':
            m = key_re.match(src, i)
            if m:
                parent = stack[-1][0] if stack else ()
                depth += 1
                path = parent + (m.group(1),)
                stack.append((path, depth))
                fields.setdefault(path, {"line": line, "force_new": None})
                i = m.end()
                continue
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            line += src.count("\n", i, j)
            i = j + 1
            continue
        elif c == "`":
            j = src.index("`", i + 1)
            line += src.count("\n", i, j)
            i = j + 1
            continue
        elif c == "/" and src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c == "{":
            depth += 1
        elif c == "}":
            if stack and stack[-1][1] == depth:
                stack.pop()
            depth -= 1
        elif c == "F" and stack and stack[-1][1] == depth and force_re.match(src, i):
            fields[stack[-1][0]]["force_new"] = line
        i += 1
    return fields


def _in_convert_fields(service_src: str) -> tuple[set[str], int] | None:
    """The fields the update call sends when it converts only those it lists, and its line;
    None when the update call sends every changed field."""
    m = re.search(r"func \([^)]*\) ModifyResource\(", service_src)
    if not m:
        return None
    body_start = m.end()
    nxt = re.search(r"\nfunc ", service_src[body_start:])
    body = service_src[body_start: body_start + nxt.start()] if nxt else service_src[body_start:]
    if "RequestConvertInConvert" not in body or body.count("Action:") != 1:
        return None
    conv = re.search(r"Convert:\s*map\[string\]ve\.RequestConvert\{", body)
    if not conv:
        return None
    depth, j, keys = 1, conv.end(), set()
    while depth and j < len(body):
        km = re.match(r'\s*"([a-z0-9_]+)":\s*\{', body[j:])
        if km and depth == 1:
            keys.add(km.group(1))
        if body[j] == "{":
            depth += 1
        elif body[j] == "}":
            depth -= 1
        j += 1
    line = service_src[:body_start].count("\n") + 1
    return keys, line


def generate(provider_dir: Path) -> dict:
    from stacks.contract import load as load_contract

    contract = load_contract()
    rev = contract.commit

    def show(path: str) -> str | None:
        r = subprocess.run(["git", "-C", str(provider_dir), "show", f"{rev}:{path}"], capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    out: dict = {"provider": {"repository": contract.provider["repository"], "commit": rev,
                              "version": contract.provider["version"]}, "resources": {}}
    for rtype, args in contract.arguments.items():
        entries = {}
        for path, arg in args.items():
            file = arg.source.file
            src = show(file)
            if src is None:
                raise SystemExit(f"{rtype}: {file} not found at {rev}")
            fields = schema_fields(src)
            parts = tf_path(path, arg.tf)
            if parts[0] == "tags" and ("tags",) not in fields:
                fields[("tags",)] = {"line": None, "force_new": None}  # ve.TagsSchema(): tags update in place
            verdict, line, why = "update", fields.get(tuple(parts[:1]), {}).get("line"), ""
            for k in range(1, len(parts) + 1):
                f = fields.get(tuple(parts[:k]))
                if f and f["force_new"]:
                    verdict, line = "replace", f["force_new"]
                    why = "ForceNew" + ("" if k == len(parts) else f" on {'.'.join(parts[:k])}")
                    break
            if verdict == "update":
                service = file.replace("/resource_volcengine_", "/service_volcengine_")
                ssrc = show(service)
                sent = _in_convert_fields(ssrc) if ssrc else None
                if sent is not None and parts[0] not in sent[0] and parts[0] != "tags":
                    verdict, line, file = "ignored", sent[1], service
                    why = "the update call converts only " + ", ".join(sorted(sent[0]))
            entry = {"verdict": verdict, "file": file}
            if line is not None:
                entry["line"] = line
            if why:
                entry["why"] = why
            entries[path] = entry
        out["resources"][rtype] = entries
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", type=Path, required=True, help="a git checkout of terraform-provider-volcengine")
    args = ap.parse_args()
    doc = generate(args.provider)
    header = ("# Generated by `python -m stacks.provider_changes --provider DIR` from the provider's source at\n"
              "# the commit below (stacks/provider_changes.py says how each verdict is read). Do not edit.\n")
    CHANGES_FILE.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=110))
    n = sum(len(a) for a in doc["resources"].values())
    by = {v: sum(1 for a in doc["resources"].values() for e in a.values() if e["verdict"] == v) for v in VERDICTS}
    print(f"wrote {CHANGES_FILE}: {n} arguments ({by})")


if __name__ == "__main__":
    main()
