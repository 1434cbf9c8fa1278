"""paraplan.executor: apply a plan with native PyTorch distributed (imports torch).

Public API (loaded on first use, so `paraplan.executor.launch` stays light)::

    pm = parallelize(model, plan)        # inside torchrun: mesh, TP/SP, PP, AC, FSDP/DDP
    report = train(pm, steps=20)          # timed steps, run report vs the plan's predictions
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "parallelize": ".compose",
    "ParallelModel": ".compose",
    "causal_lm_loss": ".compose",
    "Chain": ".chain",
    "to_chain": ".chain",
    "module_fingerprint": ".checks",
    "ModuleFingerprint": ".checks",
    "synthetic_tokens": ".data",
    "global_loss": ".training",
    "run_plan": ".launch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
