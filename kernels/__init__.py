"""Triton kernels for DeepSeek serving: MoE routing and AWQ W4A16 GEMM, plus a vLLM plugin."""
