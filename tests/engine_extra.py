"""The engine extra (``pip install -e '.[engine]'``: vLLM, torch, transformers, Triton) is
not part of the README's quick-start environment (``pip install -e '.[dev]'``).

A test module that cannot even be imported without it calls :func:`require` first: where
the extra is missing it is skipped with the reason, except in CI, which installs the extra
(.ci/run), so that there a missing engine fails instead of skipping. Tests that need the
extra carry the ``engine`` marker (tests/conftest.py applies it), and the fast tier leaves
them out. :func:`engine_only` names what the extra brings beyond the quick start's
environment (tests/test_fast_tier.py hides it, tests/quick_start_guard.py guards it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import os
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "deepseek-volc"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

REASON = "needs the engine extra: pip install -e '.[engine]'"


def require(*modules: str) -> None:
    for name in modules:
        if os.environ.get("CI"):
            importlib.import_module(name)  # CI installs the engine: a missing one must fail
        else:
            pytest.importorskip(name, reason=REASON)


def _closure(requirements: list[str], extras: set[str]) -> set[str]:
    """Installed distributions these requirements bring, transitively (canonical names)."""
    seen: set[str] = set()
    todo = [(r, extras) for r in requirements]
    while todo:
        spec, active = todo.pop()
        req = Requirement(spec)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (active or {""})):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [(r, set(req.extras)) for r in dist.requires or []]
    return seen


def own_requirements() -> list[str]:
    """The project's requirements as its installed metadata states them, or, where the project
    is not installed (the GPU machine runs the kernel tests from a checkout), as pyproject.toml
    does, each extra's with its ``extra == ...`` marker."""
    try:
        return md.requires(PROJECT) or []
    except md.PackageNotFoundError:
        project = tomllib.loads(PYPROJECT.read_text())["project"]
    own = list(project.get("dependencies", []))
    for extra, reqs in project.get("optional-dependencies", {}).items():
        for spec in reqs:
            req = Requirement(spec)
            req.marker = Marker(f'({req.marker}) and extra == "{extra}"' if req.marker else f'extra == "{extra}"')
            own.append(str(req))
    return own


@functools.cache
def engine_only() -> tuple[frozenset[str], frozenset[str]]:
    """Top-level modules, and pytest plugins, that only the engine extra installs here."""
    own = own_requirements()
    quick_start = _closure(own, {"dev"})
    engine = _closure(own, {"engine"}) - quick_start
    owners = md.packages_distributions()
    modules = frozenset(mod for mod, dists in owners.items()
                        if dists and all(canonicalize_name(d) in engine for d in dists))
    plugins = frozenset(ep.name for ep in md.entry_points(group="pytest11")
                        if ep.dist is not None and canonicalize_name(ep.dist.name) in engine)
    return modules, plugins
