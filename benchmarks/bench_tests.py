"""How long the test tiers take, as a developer or CI runs them.

    python benchmarks/bench_tests.py [--tier fast|full|both]
    python benchmarks/bench_tests.py --ci-log LOG     # the full tier from a fresh clone's `bash .ci/run` log

Runs each tier in a fresh pytest process (the README's commands), records wall time,
CPU time of the process tree, the load average before and after the run (a busy machine
inflates wall time; the CPU time does not grow with it) and pytest's own summary line, and
writes benchmarks/results/tests.json. Goals: the fast tier under 60 s and the full run under
20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = {
    "fast": ["-n", "2", "--dist", "loadgroup", "-m", "not integration and not slow and not engine"],
    "full": ["-n", "2", "--dist", "loadgroup"],
}
GOALS_S = {"fast": 60, "full": 1200}


def run_tier(name: str) -> dict:
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TIERS[name]],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = next((ln for ln in reversed(proc.stdout.splitlines()) if " in " in ln and "passed" in ln), "")
    result = {
        "command": "python -m pytest -q " + " ".join(f'"{a}"' if " " in a else a for a in TIERS[name]),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "load_average_before": round(load, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "exit_code": proc.returncode,
        "summary": summary.strip("= "),
        "goal_s": GOALS_S[name],
        "within_goal": wall < GOALS_S[name],
    }
    if proc.returncode != 0:  # what failed, for the reader of a red run
        print("\n".join(proc.stdout.splitlines()[-80:]), file=sys.stderr)
    print(f"{name:5s} {result['wall_s']:7.1f} s wall  {result['cpu_s']:7.1f} s cpu  "
          f"(goal {GOALS_S[name]} s, load {load:.1f})  {result['summary']}")
    return result


def _seconds(clock: str) -> float:
    minutes, _, seconds = clock.rstrip("s").partition("m")
    return int(minutes) * 60 + float(seconds)


def from_ci_log(path: Path) -> dict:
    """The full tier as `.ci/run` ran it (a fresh clone: install, then the README's test
    command), from that run's log: its summary line, wall time, load average before, and
    the CPU time of its children (bash `times`, second line: the tests and the install)."""
    lines = path.read_text(errors="replace").splitlines()
    summary = next((ln for ln in reversed(lines) if " in " in ln and "passed" in ln), "")
    done = next(ln for ln in reversed(lines) if ln.startswith("ci: the README's test command: exit "))
    load = next(ln for ln in lines if ln.startswith("ci: load average before the tests: "))
    exit_code = int(done.split("exit ", 1)[1].split(",", 1)[0])
    wall = float(done.rsplit(", ", 1)[1].split(" s wall", 1)[0])
    times = [ln for ln in lines if re.fullmatch(r"\d+m[\d.]+s \d+m[\d.]+s", ln.strip())]
    cpu = sum(_seconds(t) for t in times[-1].split()) if len(times) >= 2 else None
    # the run's own summary of where its time went (tests/server_scheduling.py)
    busy = {m.group(2): {"busy_s": float(m.group(3)), "finished_s": float(m.group(4))}
            for m in (re.fullmatch(r"(worker|unit) (\S+): busy (\d+) s, from \d+ s to (\d+) s", ln.strip())
                      for ln in lines) if m}
    return {"command": "bash .ci/run on a fresh clone (the README's test command: python -m pytest -q -n 2 "
                       "--dist loadgroup)",
            "wall_s": wall, "cpu_s_including_install": cpu,
            "load_average_before": float(load.rsplit(" ", 1)[1]), "exit_code": exit_code,
            "summary": summary.strip("= "), "goal_s": GOALS_S["full"], "within_goal": wall < GOALS_S["full"],
            "commit": next((ln.split()[-1] for ln in lines if ln.startswith("ci: commit ")), None),
            **({"time_per_worker": busy} if busy else {})}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tier", choices=["fast", "full", "both"], default="both")
    parser.add_argument("--ci-log", type=Path, metavar="LOG", nargs="+",
                        help="record the full tier from logs of `bash .ci/run` (runs in a row, the last "
                             "one as the tier's figure) instead of running it")
    args = parser.parse_args()
    names = ["fast", "full"] if args.tier == "both" else [args.tier]
    out_path = ROOT / "benchmarks" / "results" / "tests.json"
    previous = json.loads(out_path.read_text())["tiers"] if out_path.is_file() else {}
    if args.ci_log:
        runs = [from_ci_log(log) for log in args.ci_log]
        tiers = {**previous, "full": runs[-1]}
        if len(runs) > 1:
            tiers["full_runs_in_a_row"] = runs
    else:
        tiers = {**previous, **{n: run_tier(n) for n in names}}
    out = {"date": date.today().isoformat(), "python": platform.python_version(),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "tiers": tiers}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(t["exit_code"] == 0 for t in tiers.values() if isinstance(t, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
