"""The kernel tests run on the machine that races the kernels: it has torch, Triton and a Hopper
GPU, not the Pulumi SDK (kernels/README.md, Benchmark). tests/conftest.py's session fixtures must
not need the SDK there; one that imported it for every test errored all 32 wave/TILED cases on the
H100 of race 20 (`kernels/bench/results/2026-12-07_h100_race20_gpu_and_builds.txt`)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a child pytest in which `import pulumi` fails as it does where the SDK is not installed
WITHOUT_PULUMI = "import sys; sys.modules['pulumi'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"


def test_the_kernel_tests_run_where_the_pulumi_sdk_is_not_installed():
    test = "tests/kernels/test_mla_sm90.py::test_the_wave_default_follows_races_19_and_22"
    r = subprocess.run([sys.executable, "-c", WITHOUT_PULUMI, "-q", "-p", "no:cacheprovider", test],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
