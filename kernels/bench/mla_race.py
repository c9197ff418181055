"""Issue 27's MLA decode race in one command: FlashMLA built from its source on the machine, the
goal cases timed beside it in one process, the candidates in both orders over alternate runs,
Nsight Compute of the default beside FlashMLA, the summary against the 0.9x goal.

    python -m kernels.bench.mla_race --out DIR [--runs 4] [--budget-s 540] [--tests] [--no-ncu] [--no-fp8]
    python -m kernels.bench.mla_race --out DIR --runs 0 --no-ncu   # FlashMLA and the fp8 step only
    python -m kernels.bench.mla_race --summary DIR/run*/results.json     # any runs' JSON, no GPU

Each step is a child process with a time limit (``bench_kernels --only mla``, the FlashMLA
build, ``ncu``, pytest): the budget's remainder, at most ``STEP_CAP`` times the step's usual time
(``STEP_S``), so a kernel that hangs costs one step; a step whose usual time would pass
``--budget-s`` is skipped and said so, so a lent machine's limit ends a race with what it measured.
After the bf16 runs one run times both caches with the fp8 cache's candidates (``FP8_VARIANTS``;
an fp8 row's FlashMLA time is the same case's bf16 cache's, FlashMLA having no fp8 dense decode),
summarised as ``<case> fp8``; ``--runs 0`` leaves only that run (its bf16 rows keep FlashMLA's
time and the default's), for a race of the fp8 candidates on a short loan. ``--tests`` runs the
GPU tests first, before the build, so a loan cut short keeps the verdict on a new build's
correctness. FlashMLA's sources (``kernels/bench/flashmla.py``: ``$DSVOLC_PEER_FLASHMLA``,
``$DSVOLC_PEER_CUTLASS``) are required: a race of the goal without its peer measures nothing the
goal asks. ``--dry-run`` prints the steps. Orders alternate because races 19c-19d saw one kernel
1-5% apart by its place in the run (kernels/README.md, Benchmark)."""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

CASES = ("h128_b32_4k", "h128_b64_4k", "h128_b128_4k", "h128_b32_32k", "h128_b64_32k")  # issue 27's goal 1
VARIANTS = ("sm90", "sm90_tiled_qreg", "sm90_qreg")
# the fp8 cache's candidates (one run, both caches: an fp8 row's FlashMLA time is the bf16 cache's
# from the same process, FlashMLA having no fp8 dense decode)
FP8_VARIANTS = ("sm90", "sm90_qfp8", "sm90_qfp8_pv8", "sm90_qfp8_pv8_s4")
GOAL = 0.9
# a step's usual seconds on an H100 (races 19-21): what the budget reserves before starting it
STEP_S = {"build": 120, "run": 45, "fp8": 75, "ncu": 60, "tests": 90}
STEP_CAP = 3  # a step is stopped at this many times its usual seconds (a kernel that hangs leaves the rest a budget)
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # every step runs from here
NCU_KERNELS = "regex:_mla_sm90_kernel|flash_fwd_splitkv_mla_kernel|flash_fwd_mla_combine_kernel"


def steps(out: str, runs: int, cases=CASES, variants=VARIANTS, ncu: bool = True, tests: bool = False,
          profile_case: str = "h128_b64_4k", fp8: bool = True) -> list[tuple[str, list[str], str]]:
    """The race's steps as (kind, argv, its output file under ``out``), in order: with ``tests`` the
    GPU tests first, then the FlashMLA build (its module's path reaches the later steps through
    ``$DSVOLC_PEER_FLASHMLA_SO``), the runs, the fp8 step, Nsight Compute."""
    py = sys.executable
    build_dir = os.path.join(out, "flashmla-build")
    todo = [("build", [py, "-c", f"from kernels.bench.flashmla import build; build({build_dir!r})"], "build.txt")]
    for i in range(runs):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        name = f"run{i + 1}{'AB'[i % 2]}"
        todo.append(("run", [py, "-m", "kernels.bench.bench_kernels", "--only", "mla", "--mla-kv", "bf16",
                             "--mla-variants", ",".join(order), "--cases", ",".join(cases), "--mla-timer", "scrub",
                             "--out", os.path.join(out, name)], f"{name}_stdout.txt"))
    if fp8:
        todo.append(("fp8", [py, "-m", "kernels.bench.bench_kernels", "--only", "mla", "--mla-kv", "bf16,fp8",
                             "--mla-variants", ",".join(FP8_VARIANTS), "--cases", ",".join(cases), "--mla-timer",
                             "scrub", "--out", os.path.join(out, "fp8")], "fp8_stdout.txt"))
    if ncu:
        todo.append(("ncu", ["ncu", "--set", "full", "--cache-control", "none", "--clock-control", "none", "-k",
                             NCU_KERNELS, "-c", "5", py, "-m", "kernels.bench.mla", "--profile", "--case",
                             profile_case], f"ncu_default_{profile_case}.txt"))
    if tests:  # first: a build's correctness is what a loan cut short must not lose (it needs no FlashMLA)
        todo.insert(0, ("tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/test_mla_sm90.py",
                                  "tests/kernels/test_mla_decode.py", "tests/kernels/test_mla_sm90_qfp8.py", "-k",
                                  "wave or tiled or qfp8"], "tests.txt"))
    return todo


def summarize(paths: list[str]) -> dict:
    """Per case, each candidate's speed over FlashMLA's in each run (FlashMLA's time over its
    own, both from one process), with the lowest, median and highest, and whether the default
    held ``GOAL`` in every run. Runs without FlashMLA's time or a passed check are left out."""
    cases: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for row in data.get("mla", []):
            peers = row.get("peers") or {}
            if row.get("kv") == "bf16":
                peer = peers.get("flashmla") or {}
                if not peer.get("ok"):
                    continue
                key = row["case"]
            elif row.get("kv") == "fp8":  # FlashMLA's time on the same case's bf16 cache (checked there)
                peer = peers.get("flashmla_bf16_cache") or {}
                key = f"{row['case']} fp8"
            else:
                continue
            if not peer.get("us"):
                continue
            per = cases.setdefault(key, {})
            for name, v in (row.get("variants") or {}).items():
                if v.get("ok") and v.get("us"):
                    per.setdefault(name, []).append(peer["us"] / v["us"])
    summary = {}
    for case, per in cases.items():
        summary[case] = {name: dict(runs=[round(x, 3) for x in xs], low=round(min(xs), 3),
                                    median=round(statistics.median(xs), 3), high=round(max(xs), 3))
                         for name, xs in per.items()}
        default = per.get("default", [])
        summary[case]["goal_held"] = bool(default) and min(default) >= GOAL
    return summary


def table(summary: dict) -> str:
    """The summary as markdown: a row per case and candidate."""
    lines = [f"speed over FlashMLA's (FlashMLA us / ours us, one process a run); goal {GOAL}x at every case",
             "", "| case | candidate | runs | low | median | high |", "|---|---|---:|---:|---:|---:|"]
    for case, per in summary.items():
        for name, s in per.items():
            if name != "goal_held":
                lines.append(f"| {case} | {name} | {len(s['runs'])} | {s['low']:.3f} | {s['median']:.3f} | "
                             f"{s['high']:.3f} |")
        lines.append(f"| {case} | default held {GOAL} in every run | | {per['goal_held']} | | |")
    return "\n".join(lines) + "\n"


def race(out: str, runs: int, budget_s: float, ncu: bool, tests: bool, dry_run: bool = False, log=print,
         fp8: bool = True) -> int:
    from kernels.bench import flashmla

    missing = flashmla.missing_sources()
    if missing:
        log(f"mla_race: {missing}")
        return 2
    out = os.path.abspath(out)
    ncu = ncu and (dry_run or shutil.which("ncu") is not None)
    todo = steps(out, runs, ncu=ncu, tests=tests, fp8=fp8)
    if dry_run:
        for kind, argv, dest in todo:
            log(f"{kind}: {shlex.join(argv)}" + (f" > {os.path.join(out, dest)}" if dest else ""))
        return 0
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0, status, results = time.monotonic(), 0, []
    for kind, argv, dest in todo:
        left = budget_s - (time.monotonic() - t0)
        if left < STEP_S[kind]:
            log(f"mla_race: {kind} skipped ({left:.0f} s of the budget left, it takes about {STEP_S[kind]} s)")
            if kind == "build":  # without FlashMLA the runs would race nothing the goal asks
                return 1
            continue
        with open(os.path.join(out, dest), "w") as f:
            try:
                rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                    timeout=min(left, STEP_CAP * STEP_S[kind])).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        log(f"mla_race: {kind} -> {dest} exit {rc} ({time.monotonic() - t0:.0f} s in)")
        if kind == "build":
            built = glob.glob(os.path.join(out, "flashmla-build", "*.so"))
            if rc or not built:
                log("mla_race: FlashMLA did not build (see build.txt): nothing to race against")
                return 1
            env["DSVOLC_PEER_FLASHMLA_SO"] = os.path.abspath(built[0])
        status = status or rc
        found = os.path.join(argv[argv.index("--out") + 1], "results.json") if kind in ("run", "fp8") else ""
        if found and os.path.isfile(found):  # this race's runs only, not an earlier race's in the same folder
            results.append(found)
    if not results:
        log("mla_race: no timed run finished: nothing to summarise")
        return status or 1
    summary = summarize(results)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table(summary))
    log(table(summary))
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench.mla_race", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the race's folder (created)")
    ap.add_argument("--runs", type=int, default=4, help="timed runs, the candidates' order reversed every other")
    ap.add_argument("--budget-s", type=float, default=540.0, help="seconds the whole race may take")
    ap.add_argument("--no-ncu", action="store_true", help="no Nsight Compute profile")
    ap.add_argument("--tests", action="store_true", help="first the wave, TILED, QFP8 and PV8 GPU tests")
    ap.add_argument("--no-fp8", action="store_true", help="no fp8-cache run")
    ap.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    ap.add_argument("--summary", nargs="+", metavar="RESULTS_JSON", help="summarise earlier runs' results.json")
    a = ap.parse_args(argv)
    if a.summary:
        missing = [p for p in a.summary if not os.path.isfile(p)]
        if missing:
            ap.error(f"--summary: no such file {missing[0]}")
        try:
            print(table(summarize(a.summary)), end="")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as ex:
            ap.error(f"--summary: not a benchmark results.json ({type(ex).__name__}: {ex})")
        return 0
    if not a.out:
        ap.error("--out DIR is required (or --summary RESULTS_JSON ...)")
    if a.runs < 0 or a.budget_s <= 0:
        ap.error(f"--runs must be >= 0 and --budget-s > 0 (got {a.runs}, {a.budget_s})")
    if a.runs == 0 and a.no_fp8:
        ap.error("--runs 0 with --no-fp8 times nothing: give --runs >= 1 or drop --no-fp8")
    return race(a.out, a.runs, a.budget_s, not a.no_ncu, a.tests, a.dry_run, fp8=not a.no_fp8)


if __name__ == "__main__":
    sys.exit(main())
