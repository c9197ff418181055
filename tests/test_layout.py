"""The shape of the code: settings carry what the user wrote and nothing derived, a
`StackPlan` carries every derived decision and is computed once per program run, infra
and workloads take the plan, no product module holds two ideas' worth of lines, and no
module imports itself round a cycle."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import subprocess
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent

# "No module longer than about 700 lines" (the project's layout rule). Every product module
# now keeps to it, so the limit is the rule itself: a module that grows past it splits.
MAX_LINES = 700


def product_modules() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split() if not p.startswith("tests/")]


def test_no_product_module_is_longer_than_about_700_lines():
    lengths = {p: len((ROOT / p).read_text().splitlines()) for p in product_modules() if (ROOT / p).is_file()}
    too_long = {p: n for p, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


def test_the_settings_are_one_module_per_section():
    import stacks.sections as sections

    names = {m.name for m in pkgutil.iter_modules(sections.__path__)}
    assert {"network", "cluster", "weights", "registry", "observability", "gateway", "serving", "autoscaling",
            "rollout", "monitoring", "alerting", "resilience"} <= names


def settings_models() -> list[type[BaseModel]]:
    """Every pydantic model of the settings: the root and the models of each section."""
    import stacks.sections as sections
    import stacks.settings

    modules = [stacks.settings] + [importlib.import_module(f"stacks.sections.{m.name}")
                                   for m in pkgutil.iter_modules(sections.__path__)]
    found = {}
    for mod in modules:
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__.startswith("stacks."):
                found[obj.__qualname__] = obj
    return list(found.values())


def test_settings_models_define_only_fields_and_validators():
    """No property, method or computed field on any settings model: whatever is derived
    from the settings lives in the plan (stacks/plan/)."""
    models = settings_models()
    assert len(models) > 30  # every section's models were found
    offenders = []
    for model in models:
        d = model.__pydantic_decorators__
        validators = set(d.field_validators) | set(d.model_validators) | set(d.validators)
        for name, attr in vars(model).items():
            if name.startswith("__") or name in ("model_config", "_abc_impl"):
                continue
            if name in validators:
                continue
            if callable(attr) or isinstance(attr, (property, classmethod, staticmethod)):
                offenders.append(f"{model.__name__}.{name}")
        offenders += [f"{model.__name__}.{name} (computed field)" for name in d.computed_fields]
    assert not offenders, f"derived members on settings models: {offenders}"


def test_the_plan_is_typed_and_frozen():
    from stacks import load_plan
    from stacks.plan import StackPlan

    plan = load_plan("prod")
    assert isinstance(plan, StackPlan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.policy_config = "policies/config/dev.json"  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.pools["h20"] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.tags["stack"] = "other"  # type: ignore[index]


def test_infra_and_workloads_take_the_plan():
    from infra import build_infra
    from stacks.plan import StackPlan
    from workloads.engine.context import build_context
    from workloads.serving import build_serving

    for fn in (build_infra, build_serving, build_context):
        first = next(iter(inspect.signature(fn).parameters))
        assert typing.get_type_hints(fn)[first] is StackPlan, fn.__qualname__


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_infra_and_workloads_never_derive_the_plan_again():
    """Neither layer imports what derives the plan (build_plan, the loader) or the
    planner's entry points: they read the plan they are given."""
    forbidden = {"stacks.build_plan", "stacks.plan.build_plan", "stacks.plan.build", "stacks.loader",
                 "stacks.load", "stacks.parse", "capacity.planner.plan", "capacity.planner.single_node_options"}
    for layer in ("infra", "workloads"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            hit = _imported_names(path) & forbidden
            assert not hit, f"{path.relative_to(ROOT)} imports {sorted(hit)}"


def test_one_program_run_plans_the_stack_once(monkeypatch):
    """Under the mock engine the program loads the settings, plans them once (one call of
    the engine planning, which asks the capacity planner for each layout it ranks), and
    builds infra and workloads from that plan."""
    import stacks
    import stacks.plan
    import stacks.plan.build
    from dsvolc import engine
    from stacks import read_raw

    calls = {"build_plan": 0, "planner": 0}
    real_build, real_plan = stacks.plan.build.build_plan, stacks.plan.build.plan_engine

    def counted_build(*a, **k):
        calls["build_plan"] += 1
        return real_build(*a, **k)

    def counted_plan(*a, **k):
        calls["planner"] += 1
        return real_plan(*a, **k)

    for mod in (stacks, stacks.plan, stacks.plan.build):
        monkeypatch.setattr(mod, "build_plan", counted_build)
    monkeypatch.setattr(stacks.plan.build, "plan_engine", counted_plan)
    run = getattr(engine.run, "__wrapped__", engine.run)  # a run of its own, not a shared recording (conftest)
    rec = run("dev", read_raw("dev"), mode="existing")
    assert any(r.type == "kubernetes:helm.sh/v3:Release" for r in rec.resources)  # workloads were built
    assert calls == {"build_plan": 1, "planner": 1}


# --------------------------------------------------------------------------- import cycles


def module_graph() -> dict[str, set[str]]:
    """The project's own modules (tests and benchmarks aside) and what each imports,
    top-level and lazy imports alike, a package's `__init__` named by the package."""
    mods: dict[str, Path] = {}
    for rel in product_modules():
        parts = Path(rel).with_suffix("").parts
        if parts[0] == "benchmarks" or len(parts) < 2:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = ROOT / rel
    tops = {m.split(".")[0] for m in mods}

    def resolve(cur: str, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Import):
            wanted = [a.name for a in node.names]
        else:
            assert isinstance(node, ast.ImportFrom)
            base = node.module or ""
            if node.level:
                parts = cur.split(".") if mods[cur].name == "__init__.py" else cur.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            wanted = [base] + [f"{base}.{a.name}" for a in node.names]
        out = set()
        for n in wanted:
            while n and n not in mods:
                n = n.rpartition(".")[0]
            if n and n != cur and n.split(".")[0] in tops:
                out.add(n)
        return out

    graph = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[m] |= resolve(m, node)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(n: str) -> None:
        index[n] = low[n] = counter[0]
        counter[0] += 1
        stack.append(n)
        on.add(n)
        for w in graph[n]:
            if w not in index:
                visit(w)
                low[n] = min(low[n], low[w])
            elif w in on:
                low[n] = min(low[n], index[w])
        if low[n] == index[n]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == n:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in graph:
        if n not in index:
            visit(n)
    return out


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules_or_packages():
    graph = module_graph()
    assert {"stacks.plan", "stacks.settings", "infra", "workloads.serving"} <= set(graph)
    packages: dict[str, set[str]] = {}
    for m, deps in graph.items():
        top = m.split(".")[0]
        packages.setdefault(top, set()).update(d.split(".")[0] for d in deps if d.split(".")[0] != top)
    assert cycles(packages) == []
    assert cycles(graph) == []
