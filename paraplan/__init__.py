"""paraplan: plan how to parallelize training of a PyTorch model, and why.

The Python API (no torch import until a function that needs it is called)::

    import paraplan
    outcome = paraplan.plan("llama3-8b", "8xh100", global_batch=256, seq_len=8192)
    print(outcome.plan.predicted.step_time_s)
"""

from __future__ import annotations

from .api import plan

__all__ = ["plan"]
__version__ = "0.1.0"
