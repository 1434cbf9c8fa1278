"""paraplan.executor: apply a plan with native PyTorch distributed (imports torch).

Inside a torchrun process (``paraplan run plan.json -- script.py`` starts one per device)::

    from paraplan.executor import RunOptions, format_report, parallelize, train

    pm = parallelize(model, plan)       # checks, mesh, PP split, TP/SP, checkpointing, FSDP/DDP
    report = train(pm, RunOptions(steps=20))
    print(format_report(report))        # measured vs predicted step time, tokens/s, memory

or step by step: `Optimizers(pm, lr=...)`, `train_step(pm, opts, x, y)`, `save_checkpoint` /
`load_checkpoint`. Names load on first use, so `paraplan.executor.launch` (the launcher the CLI
imports) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "parallelize": ".compose",
    "ParallelModel": ".compose",
    "causal_lm_loss": ".compose",
    "ChainModule": ".chain",
    "to_chain_module": ".convert",
    "module_fingerprint": ".checks",
    "ModuleFingerprint": ".checks",
    "synthetic_tokens": ".data",
    "Optimizers": ".optim",
    "RunOptions": ".training",
    "train": ".training",
    "train_step": ".training",
    "global_loss": ".training",
    "RunReport": ".report",
    "format_report": ".report",
    "save_checkpoint": ".checkpoint",
    "load_checkpoint": ".checkpoint",
    "latest_checkpoint": ".checkpoint",
    "run_plan": ".launch",
    "MemorySchedule": ".memory_schedule",
    "Segment": ".memory_schedule",
    "ScheduledChain": ".memory_schedule",
    "apply_memory_schedule": ".memory_schedule",
    "schedule_from_solution": ".memory_schedule",
    "schedule_from_ops": ".memory_schedule",
    "schedule_ops": ".memory_schedule",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
