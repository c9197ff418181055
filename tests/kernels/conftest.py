"""Kernel tests run on the GPU when there is one and otherwise under Triton's CPU
interpreter; the switch must be set before any @triton.jit function is defined. Every
test here needs the engine extra (torch, Triton): tests/engine_extra.py."""

import importlib.util
import os


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:  # no engine extra: the modules skip themselves
        return False
    import torch

    return torch.cuda.is_available()


if not _cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")
