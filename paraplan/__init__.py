"""paraplan: plan how to parallelize training of a PyTorch model, and why.

The Python API (no torch import until a function that needs it is called)::

    import paraplan
    outcome = paraplan.plan("llama3-8b", "8xh100", global_batch=256, seq_len=8192)
    print(outcome.plan.predicted.step_time_s)
"""

from __future__ import annotations

from typing import Any

from .api import model_profile, plan

__all__ = ["model_profile", "plan", "profile"]


def profile(model: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """Profile a real `nn.Module` (see `paraplan.profiler.profile`; imports torch)."""
    from .profiler import profile as run

    return run(model, example_inputs, **kwargs)


__version__ = "0.1.0"
