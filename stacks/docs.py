"""The generated tables of docs/infrastructure.md, from the data the program uses: the
provider contract, the GPU instance catalog, the zones, where GPU types are seen and the VKE add-ons (each row
with its source). A test checks the page is current.

    python -m stacks.docs             print the tables
    python -m stacks.docs --update    rewrite them between their markers in docs/infrastructure.md
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from capacity.instances import INSTANCE_CATALOG, READ
from stacks.contract import markdown_table as contract_table
from stacks.addons import ADDONS
from stacks.regions import REGIONS

DOC_PAGE = Path(__file__).resolve().parents[1] / "docs" / "infrastructure.md"


def _begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED {name}: python -m stacks.docs --update -->"


def _end(name: str) -> str:
    return f"<!-- END GENERATED {name} -->"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def instances_table() -> str:
    rows = [
        "| instance type | GPU | GPUs | vCPU | memory GiB | NUMA nodes | RDMA NICs | HPC cluster | confirmed | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in INSTANCE_CATALOG.values():
        rdma = (r.rdma_nics if r.rdma_nics is not None else "yes (count not stated)") if r.rdma else "-"
        note = f" Note: {r.notes}." if r.notes else ""
        rows.append(
            f"| `{r.name}` | {r.gpu} | {r.gpus} | {r.vcpus or '?'} | {r.memory_gib or '?'} | "
            f"{r.numa_nodes or 'not stated'} | {rdma} | {'yes' if r.hpc_only else '-'} | "
            f"{'yes' if r.confirmed else 'no'} | {_cell(r.source + note)} |")
    return "\n".join(rows)


def availability_table() -> str:
    """Where each catalogued GPU type is seen (stacks.regions.refuse_unsold warns elsewhere)."""
    rows = ["| instance type | seen in region | zones named | source | read |", "|---|---|---|---|---|"]
    for r in INSTANCE_CATALOG.values():
        for s in r.seen_in:
            rows.append(f"| `{r.name}` | {s.region} | {', '.join(s.zones) or '-'} | {_cell(s.source)} | {s.read} |")
        if not r.seen_in:
            rows.append(f"| `{r.name}` | unknown | - | no source found names a region | {READ} |")
    return "\n".join(rows)


def zones_table() -> str:
    rows = ["| region | zone | source |", "|---|---|---|"]
    for region, zones in REGIONS.items():
        for z in zones:
            rows.append(f"| {region} | `{z.id}` | {_cell(z.source)} |")
    return "\n".join(rows)


def addons_table() -> str:
    rows = ["| add-on | deploy mode | version | what for | source |", "|---|---|---|---|---|"]
    for a in ADDONS.values():
        mode = a.deploy_mode + (f" ({a.deploy_node_type})" if a.deploy_node_type else "")
        version = f"`{a.version}`" if a.version else "VKE's for the cluster version"
        rows.append(f"| `{a.name}` | {mode} | {version} | {_cell(a.purpose)} | {_cell(a.source)} |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[], str]] = {
    "contract": contract_table,
    "instances": instances_table,
    "zones": zones_table,
    "availability": availability_table,
    "addons": addons_table,
}


def section(text: str, name: str) -> str:
    """The generated section `name` of a page's text."""
    return text.split(_begin(name), 1)[1].split(_end(name), 1)[0].strip("\n")


def update(path: Path = DOC_PAGE) -> bool:
    text = path.read_text()
    new = text
    for name, render in TABLES.items():
        if _begin(name) not in new or _end(name) not in new:
            raise SystemExit(f"{path}: markers {_begin(name)!r} ... {_end(name)!r} not found")
        pre, rest = new.split(_begin(name), 1)
        _, post = rest.split(_end(name), 1)
        new = f"{pre}{_begin(name)}\n{render()}\n{_end(name)}{post}"
    path.write_text(new)
    return new != text


if __name__ == "__main__":  # python -m stacks.docs [--update]
    import sys

    if len(sys.argv) >= 2 and sys.argv[1] == "--update":
        print(f"{DOC_PAGE}: {'updated' if update() else 'already up to date'}")
    else:
        for name, render in TABLES.items():
            print(f"## {name}\n\n{render()}\n")
