"""What the Gluon Hopper kernels' tests share: whether a Hopper GPU is here, and their sm_90a
build in a process of its own (kernels/bench/sm90.py's reports), without TRITON_INTERPRET: the
interpreter, which the CPU test runs set, patches Triton's language for the process it runs in."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernels run only on a Hopper (sm_90) GPU")


def build(report: str, *args, **kwargs) -> dict:
    """``kernels.bench.sm90.<report>(*args, **kwargs)`` (JSON-able arguments) in a clean process:
    its registers, spills, MMA counts and shared memory, without the PTX."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (f"import json, sys; from kernels.bench.sm90 import {report}; a = json.loads(sys.argv[1]); "
            f"i = {report}(*a[0], **a[1]); i.pop('ptx'); print(json.dumps(i))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps([args, kwargs])], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
