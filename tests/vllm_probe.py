"""Many small checks of what vLLM registers, under different environments, for one import.

The plugin's switches (``DSVOLC_KERNELS``, ``DSVOLC_MLA``, ``DSVOLC_FP8_GEMM``) are read when
vLLM loads its general plugins, and what they register is process-global: each setting needs a
process of its own. A fresh interpreter per setting pays vLLM's import every time (about 14 s
on a 2-core machine). :func:`run_cases` pays it once: one interpreter imports the modules the
checks read (``preload``), then forks a child per case, which sets the case's environment and
runs its code, so each case still starts with nothing registered. vLLM's own processes import
those modules before they load plugins too (the worker loads them in its init, after its
imports), so a preloaded module is a state the plugin must handle anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_DRIVER = r"""
import importlib, json, os, sys, tempfile, threading, traceback
spec = json.load(sys.stdin)
for name in spec["preload"]:
    importlib.import_module(name)
if threading.active_count() != 1:  # a fork would copy a lock another thread may hold
    sys.exit("a preloaded module started a thread: %s" % [t.name for t in threading.enumerate()])
results = {}
with tempfile.TemporaryDirectory() as tmp:
    for case, (code, env, drop) in spec["cases"].items():
        out_path, err_path = os.path.join(tmp, case + ".out"), os.path.join(tmp, case + ".err")
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            rc = 0
            try:
                for k in drop:
                    os.environ.pop(k, None)
                os.environ.update(env)
                os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT), 1)
                os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT), 2)
                exec(compile(code, "<case %s>" % case, "exec"), {"__name__": "__main__"})
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                rc = 1
            finally:
                sys.stdout.flush(); sys.stderr.flush()
                os._exit(rc)
        _, status = os.waitpid(pid, 0)
        results[case] = {"rc": os.waitstatus_to_exitcode(status),
                         "stdout": open(out_path).read(), "stderr": open(err_path).read()}
print("\n@@results@@" + json.dumps(results))
"""


@dataclass(frozen=True)
class Case:
    code: str
    env: Mapping[str, str]
    drop: Sequence[str] = ()  # variables the case runs without


def run_cases(cases: Mapping[str, Case], preload: Sequence[str], *, timeout: float = 600) -> dict[str, str]:
    """Each case's stdout; a case that fails (or a driver that does) fails with its stderr."""
    spec = {"preload": list(preload),
            "cases": {k: [c.code, dict(c.env), list(c.drop)] for k, c in cases.items()}}
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSVOLC_")}
    p = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(spec), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0 or "@@results@@" not in p.stdout:
        raise AssertionError(f"the probe's driver failed ({p.returncode}):\n{p.stderr[-3000:]}")
    results = json.loads(p.stdout.rsplit("@@results@@", 1)[1])
    bad = {k: r for k, r in results.items() if r["rc"] != 0}
    if bad:
        raise AssertionError("\n".join(f"case {k} exited {r['rc']}:\n{r['stderr'][-3000:]}" for k, r in bad.items()))
    return {k: r["stdout"] for k, r in results.items()}


def registrations(cases: Mapping[str, Case], preload: Sequence[str]):
    """A module-scoped fixture: each case's stdout, from one probe run per test module."""
    import pytest

    @pytest.fixture(scope="module")
    def registered() -> dict[str, str]:
        return run_cases(cases, preload)

    return registered


__all__ = ["Case", "run_cases", "registrations"]
