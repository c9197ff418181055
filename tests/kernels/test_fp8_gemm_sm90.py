"""The Gluon sm_90 FP8 block-scaled GEMM (kernels/fp8_gemm_sm90.py).

Gluon has no CPU interpreter, so the numbers are checked only on a Hopper GPU (the H200
runs are committed as kernels/bench/results/*_fp8_sm90_pytest.txt). On any machine the
kernel is compiled for sm_90a through this Triton's own ptxas, and the build is checked
for what the kernel exists for: fp8 warpgroup MMAs (QGMMA), no register spills, and no
"wgmma serialized" report from ptxas (info C7514), which is what copying an in-flight
accumulator or reading it early would cause."""

import os
import re
import subprocess

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402
import triton  # noqa: E402

from kernels import fp8_gemm_sm90 as sm90  # noqa: E402
from kernels.reference import fp8_gemm_reference, per_block_quant_fp8, per_token_group_quant_fp8  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs only on a Hopper (sm_90) GPU")
needs_gluon = pytest.mark.skipif(not sm90.HAVE_GLUON, reason="this Triton build has no Gluon Hopper modules")

CONFIGS = [
    dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=8),
    dict(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=4),
    dict(BLOCK_M=128, BLOCK_N=64, GROUP_M=8, STAGES=3, num_warps=4),
]


def _compile(cfg):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]

    def desc(name, gdt, shape):
        return f"tensordesc<{name}[{shape[0]}, {shape[1]}],{gl.NVMMASharedLayout.get_default_for(shape, gdt)!r}>"

    sig = {"a_desc": desc("fp8e4nv", gl.float8e4nv, [bm, 128]), "b_desc": desc("fp8e4nv", gl.float8e4nv, [bn, 128]),
           "c_desc": desc("bf16", gl.bfloat16, [bm, bn]), "as_ptr": "*fp32", "bs_ptr": "*fp32"}
    sig.update({n: "i32" for n in ("M", "N", "K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk")})
    consts = {"GROUP_M": cfg["GROUP_M"], "STAGES": cfg["STAGES"], "num_warps": cfg["num_warps"]}
    sig.update({n: "constexpr" for n in consts})
    src = GluonASTSource(fn=sm90._fp8_gemm_sm90_kernel, signature=sig, constexprs=consts, attrs={})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg["num_warps"]))


@needs_gluon
@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=lambda c: f"{c['BLOCK_M']}x{c['BLOCK_N']}_w{c['num_warps']}")
def test_the_build_keeps_its_wgmmas_in_flight(cfg, tmp_path):
    from triton.backends.nvidia.compiler import get_ptxas

    k = _compile(cfg)
    ptxas = get_ptxas(90).path  # the ptxas this Triton builds sm_90 with
    cuobjdump = os.path.join(os.path.dirname(ptxas), "cuobjdump")
    ptx = tmp_path / "k.ptx"
    ptx.write_text(k.asm["ptx"])
    info = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert "C7514" not in info.stderr and "serialized" not in info.stderr, info.stderr
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", info.stderr), info.stderr
    sass = subprocess.run([cuobjdump, "-sass", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True).stdout
    # 4 k=32 fp8 wgmma instructions per 128-wide K block; the pair loop, the first block
    # and the tail each issue their own
    assert sass.count("QGMMA.64x128x32.F32.E4M3.E4M3") >= 16
    assert "HMMA" not in sass


def test_supported_says_no_off_hopper():
    a = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    b = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    assert not sm90.supported(a, b, torch.bfloat16)  # CPU tensors


def _operands(m, n, k, gen):
    a = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) * 0.05
    qa, sa = per_token_group_quant_fp8(a)
    qw, sw = per_block_quant_fp8(w)
    return [t.cuda() for t in (qa, sa, qw, sw)]


def _close(y, ref):
    err = (y.float() - ref).abs()
    bound = 2.0**-7 * ref.abs() + 2e-3 * ref.abs().max()
    assert torch.isfinite(y).all()
    assert (err <= bound).all(), f"max err {err.max().item():.3g}, worst excess {(err - bound).max().item():.3g}"


@needs_hopper
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['BLOCK_M']}x{c['BLOCK_N']}_w{c['num_warps']}")
@pytest.mark.parametrize("m,n,k", [
    (1, 256, 128),  # one K block, one row
    (200, 264, 384),  # M, N tails; an odd block count
    (256, 512, 512),  # an even count: the pair loop and the one-block tail
    (130, 2112, 1792),  # more blocks than stages, both tails
])
def test_matches_the_reference(cfg, m, n, k):
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    qa, sa, qw, sw = _operands(m, n, k, gen)
    assert sm90.supported(qa, qw, torch.bfloat16)
    y = sm90.fp8_gemm_sm90(qa, sa, qw, sw, config=cfg)
    _close(y, fp8_gemm_reference(qa, sa, qw, sw).cuda())


@needs_hopper
@pytest.mark.timeout(120)
def test_column_major_activation_scales():
    # vLLM hands the activation scales column-major
    gen = torch.Generator().manual_seed(3)
    qa, sa, qw, sw = _operands(192, 384, 1024, gen)
    sa_cm = sa.t().contiguous().t()
    y = sm90.fp8_gemm_sm90(qa, sa_cm, qw, sw)
    _close(y, fp8_gemm_reference(qa, sa, qw, sw).cuda())
