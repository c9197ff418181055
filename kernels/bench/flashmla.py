"""FlashMLA's sm90 dense decode as a peer of `mla_decode`, built on the benchmark machine.

FlashMLA (deepseek-ai/FlashMLA) is never part of this repository: its sources travel in an
ignored folder (`$DSVOLC_PEER_FLASHMLA`, default `.peers/FlashMLA`: its `csrc/` at
9241ae3e) with CUTLASS's headers (`$DSVOLC_PEER_CUTLASS`, default `.peers/cutlass`: NVIDIA/cutlass
at 147f5673, the commit FlashMLA pins as its submodule). `build()` compiles the three
translation units of its dense decode (`csrc/sm90/decode/dense/instantiations/bf16.cu`,
`csrc/smxx/decode/combine/combine.cu`, `csrc/smxx/decode/get_decoding_sched_meta/
get_decoding_sched_meta.cu`) with the flags of its setup.py, plus the binding below (ours:
it exposes only `dense_attn_decode_interface` from its `csrc/api/dense_decode.h`), through
torch's extension loader. `$DSVOLC_PEER_FLASHMLA_SO` loads a module built earlier instead.

FlashMLA's dense decode takes bf16/fp16 caches with page 64 only (no fp8 dense cache at
this commit), q [B, 1, H, 576] and the cache as [blocks, 64, 1, 576].
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import tempfile
import time

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
BINDING = r"""
#include <pybind11/pybind11.h>
#include "dense_decode.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("dense_decode_fwd", &dense_attn_decode_interface); }
"""


def _dirs():
    fm = os.environ.get("DSVOLC_PEER_FLASHMLA", os.path.join(REPO, ".peers", "FlashMLA"))
    cu = os.environ.get("DSVOLC_PEER_CUTLASS", os.path.join(REPO, ".peers", "cutlass"))
    return os.path.abspath(fm), os.path.abspath(cu)


def missing_sources() -> str | None:
    """What of FlashMLA's sources is not carried, said for a user (None when both are)."""
    fm, cu = _dirs()
    if os.path.isdir(os.path.join(fm, "csrc")) and os.path.isdir(os.path.join(cu, "include")):
        return None
    return (f"FlashMLA sources not carried (csrc/ under {fm}, include/ under {cu}; set $DSVOLC_PEER_FLASHMLA and "
            "$DSVOLC_PEER_CUTLASS): deepseek-ai/FlashMLA 9241ae3e, NVIDIA/cutlass 147f5673")


def build(build_dir: str, log=print):
    """Compile FlashMLA's dense decode into `build_dir`; returns the module (None when the
    sources are not carried)."""
    from torch.utils.cpp_extension import CUDA_HOME, load

    missing = missing_sources()
    if missing:
        log(f"{missing}: peer skipped")
        return None
    fm, cu = _dirs()
    csrc = os.path.join(fm, "csrc")
    os.makedirs(build_dir, exist_ok=True)
    glue = os.path.join(build_dir, "dsvolc_flashmla_binding.cpp")
    with open(glue, "w") as f:
        f.write(BINDING)
    inc = [os.path.join(csrc, "api"), csrc, os.path.join(csrc, "kerutils", "include"), os.path.join(csrc, "sm90"),
           os.path.join(cu, "include"), os.path.join(cu, "tools", "util", "include"),
           os.path.join(CUDA_HOME or "/usr/local/cuda", "include", "cccl")]
    feats = ["-DFLASH_MLA_DISABLE_FP16", "-DFLASH_MLA_DISABLE_SM100"]
    nvcc = ["-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
            "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
            "--use_fast_math", "-lineinfo", "-gencode", "arch=compute_90a,code=sm_90a", *feats]
    t = time.time()
    mod = load(
        name="dsvolc_flashmla_peer",
        sources=[glue, os.path.join(csrc, "sm90/decode/dense/instantiations/bf16.cu"),
                 os.path.join(csrc, "smxx/decode/combine/combine.cu"),
                 os.path.join(csrc, "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu")],
        extra_include_paths=inc,
        extra_cflags=["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations", *feats],
        extra_cuda_cflags=nvcc,
        build_directory=build_dir,
        verbose=False,
    )
    log(f"FlashMLA dense decode built in {time.time() - t:.0f} s ({build_dir})")
    return mod


def load_prebuilt(path: str):
    import torch  # noqa: F401  (the module links against torch's libraries)

    loader = importlib.machinery.ExtensionFileLoader("dsvolc_flashmla_peer", path)
    spec = importlib.util.spec_from_file_location("dsvolc_flashmla_peer", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load_peer(log=print, build_dir: str | None = None):
    """(call, prepare) for the MLA benchmark, or None. `prepare(q, cache, bt, sl, scale)`
    runs FlashMLA's scheduler once and returns the state a graph-safe `call` replays."""
    try:
        so = os.environ.get("DSVOLC_PEER_FLASHMLA_SO")
        mod = load_prebuilt(so) if so else build(build_dir or tempfile.mkdtemp(prefix="flashmla-"), log)
    except Exception as ex:  # noqa: BLE001  (a peer that fails to build is reported, not fatal)
        log(f"FlashMLA peer unavailable: {type(ex).__name__}: {str(ex)[-600:]}")
        return None
    if mod is None:
        return None

    def prepare(q, cache, bt, sl, scale):
        q4, k4 = q.unsqueeze(1), cache.unsqueeze(2)
        _, _, meta, splits = mod.dense_decode_fwd(q4, k4, 512, sl, bt, scale, False, None, None)
        return q4, k4, meta, splits

    def call(state, sl, bt, scale):
        q4, k4, meta, splits = state
        out, lse, _, _ = mod.dense_decode_fwd(q4, k4, 512, sl, bt, scale, False, meta, splits)
        return out[:, 0], lse[:, :, 0]

    return call, prepare
