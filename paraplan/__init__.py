"""paraplan: plan how to parallelize training of a PyTorch model, and why.

The Python API (no torch import until a function that needs it is called)::

    import paraplan
    outcome = paraplan.plan("llama3-8b", "8xh100", global_batch=256, seq_len=8192)
    print(outcome.plan.predicted.step_time_s)
    pm = paraplan.parallelize(model, "plan.json")   # inside torchrun (paraplan run)
    pm = paraplan.auto_parallelize(model, batch, global_batch=64)  # profile, plan, apply
"""

from __future__ import annotations

from typing import Any

from .api import auto_parallelize, detect_cluster, model_profile, plan

__all__ = ["auto_parallelize", "detect_cluster", "model_profile", "parallelize", "plan", "profile"]


def profile(model: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """Profile a real `nn.Module` (see `paraplan.profiler.profile`; imports torch)."""
    from .profiler import profile as run

    return run(model, example_inputs, **kwargs)


def parallelize(model: Any, plan: Any, **kwargs: Any) -> Any:
    """Apply a plan (a `Plan` or a plan JSON path) to `model` inside a torchrun process (see
    `paraplan.executor.parallelize`; imports torch)."""
    from .executor import parallelize as apply
    from .planner.plan import Plan
    from .planner.plan_io import load_plan

    return apply(model, plan if isinstance(plan, Plan) else load_plan(plan), **kwargs)


__version__ = "0.1.0"
