"""How long `dsvolc preview STACK` takes, end to end in a fresh process, as a user runs it:
settings, the program under the mock engine and the policy pack, for both deploy phases
(the stack as deployed and its first `pulumi up`), which is what the command does by default.

    python benchmarks/bench_preview.py [--runs N] [--stacks dev,staging,prod] [--vs REF] [--breakdown N]

Each stack gets one warm-up run, then N counted runs; each run's wall time and CPU time
(user + system of the process) are recorded, with the load average before and after (a busy
machine inflates wall time much more than CPU time). With `--vs REF` the same command from a
checkout of REF (`git archive`, in a temporary directory) runs in turn with this tree's, A B
A B ..., and the ratio this/REF is taken pair by pair, so it holds when the machine's speed
drifts. Python's bytecode cache is on, as by default (PYTHONDONTWRITEBYTECODE is unset for
the runs): a user's second run does not recompile the project.

`--breakdown N` adds where prod's CPU time goes (imports, each phase's program run and
policy analysis), the median over N fresh processes, for this tree and the baseline.

Writes benchmarks/results/preview.json (stacks not run this time keep their earlier figures),
with the resource count of each phase beside the figures. Goal: prod under 2 s on a quiet
2-core machine. On a shared one wall time measures the neighbours; the CPU time of the
process (user + system, every thread) is the figure that holds, so the goal is checked on
prod's CPU median (`within_goal`; `within_goal_wall` beside it): exit 1 when it misses.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import date
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = {"prod": 2.0}
DEPLOYED = re.compile(r"^stack \S+: .*?, (\d+) resources \(existing stack\)", re.M)
FIRST_APPLY = re.compile(r"^first `pulumi up`: .*?; (\d+) resources; ", re.M)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPATH", None)  # the tree under test is the working directory (python -m)
    return env


def run_once(tree: Path, stack: str) -> dict:
    """One `dsvolc preview STACK --quiet` in a fresh process from `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dsvolc.cli", "preview", stack, "--quiet"],
                          cwd=tree, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):  # 1: a mandatory violation, still a finished preview
        raise SystemExit(f"{tree}: preview {stack} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    deployed, first = DEPLOYED.search(proc.stdout), FIRST_APPLY.search(proc.stdout)
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "resources": {"deployed": int(deployed.group(1)) if deployed else None,
                          "first_apply": int(first.group(1)) if first else None}}


def summary(runs: list[dict]) -> dict:
    walls, cpus = [r["wall"] for r in runs], [r["cpu"] for r in runs]
    return {"median_s": round(statistics.median(walls), 3), "min_s": round(min(walls), 3),
            "max_s": round(max(walls), 3), "cpu_median_s": round(statistics.median(cpus), 3),
            "cpu_min_s": round(min(cpus), 3), "runs": len(runs)}


def checkout(ref: str, into: Path) -> str:
    """The tree of `ref` under `into`; returns its commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


def stages(stack: str) -> None:
    """Where one preview's time goes, in this process (CPU seconds, printed as JSON): the
    CLI's imports, then `run_both` as the command runs it, with each program run under the
    mock engine (`engine.run`, the first paying for the SDK modules it loads) and each policy
    analysis (`policy_runner.analyze`) timed as it is called; `other` is the rest of
    `run_both` (settings, the plan, the collector's catch-up once it is back on). Then the
    deployed phase's program once more, its SDK modules loaded: `sdk_imports` is the
    difference (that run with the collector off in either tree). Works on any tree with those functions, so a baseline is split the same way.
    (The command itself also runs its imports with the collector off: dsvolc/cli.py.)"""
    t = time.process_time()
    import dsvolc.cli  # noqa: F401  (what the command imports before it runs)
    from dsvolc import engine, policy_runner, preview

    try:  # as the command does, where the tree has it
        from dsvolc import lazy_annotations

        lazy_annotations.install()
    except ImportError:
        pass

    out = {"cli_imports": time.process_time() - t}
    run, analyze = engine.run, policy_runner.analyze

    def timed(label, fn, mode_of):
        def call(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                key = f"{'deployed' if mode_of(args, kwargs) == 'existing' else 'first_apply'}_{label}"
                out[key] = out.get(key, 0.0) + time.process_time() - t0
        return call

    engine.run = timed("program", run, lambda a, k: k.get("mode", "new"))
    policy_runner.analyze = timed("policies", analyze, lambda a, k: a[0].mode)
    t = time.process_time()
    preview.run_both(stack)
    out["run_both"] = time.process_time() - t
    out["other"] = out["run_both"] - sum(v for k, v in out.items() if k.endswith(("_program", "_policies")))
    from stacks import loader

    engine.run = run
    raw = loader.read_raw(stack)
    gc.collect()
    gc.disable()  # the program's own work, the same way in either tree
    t = time.process_time()
    run(loader.stack_name(stack), raw, mode="existing")
    out["deployed_program_again"] = time.process_time() - t
    gc.enable()
    out["sdk_imports"] = out["deployed_program"] - out["deployed_program_again"]
    print(json.dumps({k: round(v, 3) for k, v in out.items()}))


def breakdown(tree: Path, stack: str, runs: int) -> dict:
    """The median of each stage over `runs` fresh processes from `tree`."""
    got = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--stages", stack], cwd=tree,
                              env={**_env(), "PYTHONPATH": str(tree)}, check=True, capture_output=True, text=True)
        got.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {k: round(statistics.median(g[k] for g in got), 3) for k in got[0]}


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of `pid`, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _children(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().strip()
    except OSError:
        return ""


def bench_warm(stacks: list[str], runs: int) -> dict:
    """`dsvolc preview STACK --quiet` through a warm server of this tree (dsvolc/warm.py):
    each run's CPU time is the caller's process plus the server's child that ran it (the
    server's reaped-children time); the server's own CPU while serving (importing what a
    child reported) is recorded beside it, and its warm-up once."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="dwb", dir="/tmp") as run_dir:
        env = {**_env(), "XDG_RUNTIME_DIR": run_dir}
        server = subprocess.Popen([sys.executable, "-m", "dsvolc.launch", "serve", "10"], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            if not server.stdout.readline().startswith("ready "):
                raise SystemExit("the warm server did not start")
            warm_up_s = sum(_proc_cpu(server.pid))
            for stack in stacks:
                mine, served_before = [], sum(_proc_cpu(server.pid))
                for i in range(runs + 1):  # the first: the server learns what this stack imports
                    own0, kids0 = _proc_cpu(server.pid)
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t = time.perf_counter()
                    proc = subprocess.run([sys.executable, "-m", "dsvolc.launch", "preview", stack, "--quiet"],
                                          cwd=ROOT, env=env, capture_output=True, text=True)
                    wall = time.perf_counter() - t
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    if proc.returncode not in (0, 1):
                        raise SystemExit(f"warm preview {stack} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
                    deadline = time.monotonic() + 30
                    while _children(server.pid) and time.monotonic() < deadline:
                        time.sleep(0.02)
                    time.sleep(0.1)
                    own1, kids1 = _proc_cpu(server.pid)
                    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                    deployed, first = DEPLOYED.search(proc.stdout), FIRST_APPLY.search(proc.stdout)
                    if i:
                        mine.append({"wall": wall, "cpu": client + (kids1 - kids0),
                                     "resources": {"deployed": int(deployed.group(1)) if deployed else None,
                                                   "first_apply": int(first.group(1)) if first else None}})
                result = {"date": date.today().isoformat(), **summary(mine), "resources": mine[-1]["resources"],
                          "server_cpu_while_serving_s": round(sum(_proc_cpu(server.pid)) - served_before
                                                              - sum(r["cpu"] for r in mine), 3)}
                if stack in GOAL_S:
                    result["goal_s"] = GOAL_S[stack]
                    result["within_goal"] = result["cpu_median_s"] < GOAL_S[stack]
                    result["within_goal_wall"] = result["median_s"] < GOAL_S[stack]
                results[stack] = result
                print(f"{stack:8s} warm: wall median {result['median_s']:.2f} s, cpu median "
                      f"{result['cpu_median_s']:.2f} s (caller + the server's child), {runs} runs", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {"server_warm_up_cpu_s": round(warm_up_s, 3), "stacks": results}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def bench(stacks: list[str], runs: int, base: Path | None, base_ref: dict | None) -> dict:
    results = {}
    for stack in stacks:
        run_once(ROOT, stack)  # warm-up: bytecode cache, file cache
        if base is not None:
            run_once(base, stack)
        load_before = os.getloadavg()
        mine, theirs = [], []
        for _ in range(runs):
            mine.append(run_once(ROOT, stack))
            if base is not None:
                theirs.append(run_once(base, stack))
        load_after = os.getloadavg()
        result = {"date": date.today().isoformat(), **summary(mine), "resources": mine[-1]["resources"],
                  "load_average_1m": [round(load_before[0], 2), round(load_after[0], 2)]}
        if stack in GOAL_S:
            result["goal_s"] = GOAL_S[stack]
            result["within_goal"] = result["cpu_median_s"] < GOAL_S[stack]
            result["within_goal_wall"] = result["median_s"] < GOAL_S[stack]
        if theirs:
            result["baseline"] = {**(base_ref or {}), **summary(theirs), "resources": theirs[-1]["resources"]}
            result["ratio_wall_median"] = round(statistics.median(a["wall"] / b["wall"] for a, b in zip(mine, theirs)), 3)
            result["ratio_cpu_median"] = round(statistics.median(a["cpu"] / b["cpu"] for a, b in zip(mine, theirs)), 3)
        results[stack] = result
        line = (f"{stack:8s} wall median {result['median_s']:.2f} s (min {result['min_s']:.2f}, max "
                f"{result['max_s']:.2f}), cpu median {result['cpu_median_s']:.2f} s, {runs} runs, "
                f"{result['resources']['deployed']} + {result['resources']['first_apply']} resources, "
                f"load {result['load_average_1m'][0]:.1f} -> {result['load_average_1m'][1]:.1f}")
        if theirs:
            line += (f"; baseline wall median {result['baseline']['median_s']:.2f} s, cpu median "
                     f"{result['baseline']['cpu_median_s']:.2f} s; ratio wall {result['ratio_wall_median']:.2f}, "
                     f"cpu {result['ratio_cpu_median']:.2f}")
        print(line, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stacks", default="dev,staging,prod")
    parser.add_argument("--vs", metavar="REF", help="a git ref to time in turn with this tree (the baseline)")
    parser.add_argument("--breakdown", type=int, metavar="N", default=0,
                        help="also record where prod's time goes, median CPU seconds per stage over N processes")
    parser.add_argument("--warm", action="store_true",
                        help="also time the command through a warm server of this tree (`dsvolc warm`)")
    parser.add_argument("--stages", metavar="STACK", help=argparse.SUPPRESS)  # one breakdown process
    args = parser.parse_args()
    if args.stages:
        stages(args.stages)
        return 0
    stacks = [s for s in args.stacks.split(",") if s]
    out = {"date": date.today().isoformat(), "python": platform.python_version(),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, {cpu_model()}",
           "command": "python -m dsvolc.cli preview STACK --quiet (both deploy phases)",
           "bytecode_cache": "on (Python's default)"}
    path = ROOT / "benchmarks" / "results" / "preview.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    previous = earlier.get("stacks", {})
    previous = {k: v for k, v in previous.items() if "resources" in v}  # figures of this benchmark only
    with tempfile.TemporaryDirectory() as tmp:
        base, base_ref = None, None
        if args.vs:
            base = Path(tmp)
            base_ref = {"ref": args.vs, "commit": checkout(args.vs, base)}
        out["stacks"] = {**previous, **bench(stacks, args.runs, base, base_ref)}  # stacks not run keep their figures
        if "warm" in earlier:
            out["warm"] = earlier["warm"]
        if args.warm:
            warm = bench_warm(stacks, args.runs)
            out["warm"] = {"command": "dsvolc preview STACK --quiet with `dsvolc warm` running "
                                      "(python -m dsvolc.launch)", "server_warm_up_cpu_s": warm["server_warm_up_cpu_s"],
                           "stacks": {**earlier.get("warm", {}).get("stacks", {}), **warm["stacks"]}}
        if "prod_cpu_breakdown_s" in earlier:
            out["prod_cpu_breakdown_s"] = earlier["prod_cpu_breakdown_s"]
        if args.breakdown:
            out["prod_cpu_breakdown_s"] = {"this tree": breakdown(ROOT, "prod", args.breakdown)}
            if base is not None:
                out["prod_cpu_breakdown_s"]["baseline"] = breakdown(base, "prod", args.breakdown)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    missed = [s for s, r in out["stacks"].items() if r.get("within_goal") is False]
    if args.warm:  # the goal is then the warm command's
        missed = [s for s, r in out["warm"]["stacks"].items() if r.get("within_goal") is False]
    for s in missed:
        got = (out["warm"] if args.warm else out)["stacks"][s]["cpu_median_s"]
        print(f"{s}: CPU median {got:.2f} s misses the goal of {GOAL_S[s]:.1f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
