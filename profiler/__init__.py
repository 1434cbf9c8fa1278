"""paraplan.profiler: real `nn.Module`s into the planner's `ModelProfile` (imports torch).

`profile(model, example_inputs)` traces one training step: per layer FLOPs, parameters, bytes
saved for backward, transient peaks, op graphs, and (mode="measure") measured times.
"""

from .api import profile
from .chain_export import profile_chain

__all__ = ["profile", "profile_chain"]
