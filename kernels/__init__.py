"""Triton kernels for DeepSeek serving (MoE routing, AWQ W4A16 GEMM) and the vLLM plugin
that installs them.

May import: torch, triton and (in the plugin only, lazily) vllm. Never the project's other
packages: the serving image ships this package alone with `runtime`.
"""
