"""Memory solvers: optimal checkpointing on chains (DP), rematerialization and offload on op
graphs (ILP), the pipeline replay, and the simulator that checks them all.

Pure Python; numpy and PuLP are imported inside the functions that need them, and each
submodule when one of its names is first asked for, so importing this package stays cheap.
The models and their sources are in docs/cost-model.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers; at run time `__getattr__` loads them
    from .chain import ChainLayer, LayerChain
    from .checkpoint_dp import ChainSolution, solve_checkpoint_dp, sqrt_segment_starts
    from .examples import gpt2_block_graph, gpt2_layer_chain, vgg16_chain
    from .from_profile import chain_from_profile, graph_from_profile, layer_graphs
    from .graph import GraphOp, OpGraph, TensorPart, chain_to_graph
    from .policies import Policy, store_all_ops, uniform_schedule
    from .remat_ilp import RematSolution, min_peak_remat_ilp, solve_remat_ilp
    from .schedule import (
        Backward,
        Forward,
        Offload,
        Op,
        Prefetch,
        SolveStatus,
        Wait,
        format_schedule,
    )
    from .simulator import SimResult, simulate
    from .tradeoff import STRATEGIES, TradeoffCurve, TradeoffPoint, default_budgets, tradeoff_curves

_SOURCES: dict[str, str] = {
    "Backward": "schedule",
    "ChainLayer": "chain",
    "ChainSolution": "checkpoint_dp",
    "Forward": "schedule",
    "GraphOp": "graph",
    "LayerChain": "chain",
    "Offload": "schedule",
    "Op": "schedule",
    "OpGraph": "graph",
    "Policy": "policies",
    "Prefetch": "schedule",
    "RematSolution": "remat_ilp",
    "STRATEGIES": "tradeoff",
    "SimResult": "simulator",
    "SolveStatus": "schedule",
    "TensorPart": "graph",
    "TradeoffCurve": "tradeoff",
    "TradeoffPoint": "tradeoff",
    "Wait": "schedule",
    "chain_from_profile": "from_profile",
    "chain_to_graph": "graph",
    "default_budgets": "tradeoff",
    "format_schedule": "schedule",
    "gpt2_block_graph": "examples",
    "gpt2_layer_chain": "examples",
    "graph_from_profile": "from_profile",
    "layer_graphs": "from_profile",
    "min_peak_remat_ilp": "remat_ilp",
    "simulate": "simulator",
    "solve_checkpoint_dp": "checkpoint_dp",
    "solve_remat_ilp": "remat_ilp",
    "sqrt_segment_starts": "checkpoint_dp",
    "store_all_ops": "policies",
    "tradeoff_curves": "tradeoff",
    "uniform_schedule": "policies",
    "vgg16_chain": "examples",
}
"""The submodule each name of `__all__` comes from (imported on first use)."""


__all__ = [
    "STRATEGIES",
    "Backward",
    "ChainLayer",
    "ChainSolution",
    "Forward",
    "GraphOp",
    "LayerChain",
    "Offload",
    "Op",
    "OpGraph",
    "Policy",
    "Prefetch",
    "RematSolution",
    "SimResult",
    "SolveStatus",
    "TensorPart",
    "TradeoffCurve",
    "TradeoffPoint",
    "Wait",
    "chain_from_profile",
    "chain_to_graph",
    "default_budgets",
    "format_schedule",
    "gpt2_block_graph",
    "gpt2_layer_chain",
    "graph_from_profile",
    "layer_graphs",
    "min_peak_remat_ilp",
    "simulate",
    "solve_checkpoint_dp",
    "solve_remat_ilp",
    "sqrt_segment_starts",
    "store_all_ops",
    "tradeoff_curves",
    "uniform_schedule",
    "vgg16_chain",
]


def __getattr__(name: str) -> Any:
    """A name of `__all__`, imported from its submodule when first asked for (PEP 562): the
    search imports only the pipeline replay, not the ILP and the examples."""
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
