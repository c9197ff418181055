"""Kernel tests run on the GPU when there is one and otherwise under Triton's CPU
interpreter; the switch must be set before any @triton.jit function is defined."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
