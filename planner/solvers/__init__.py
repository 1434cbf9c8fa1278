"""Memory solvers: optimal checkpointing on chains (DP), rematerialization and offload on op
graphs (ILP), the pipeline replay, and the simulator that checks them all.

Pure Python; numpy and PuLP are imported inside the functions that need them, so importing
this package stays cheap. The models and their sources are in docs/cost-model.md.
"""

from .chain import ChainLayer, LayerChain
from .checkpoint_dp import ChainSolution, solve_checkpoint_dp, sqrt_segment_starts
from .examples import gpt2_block_graph, gpt2_layer_chain, vgg16_chain
from .from_profile import chain_from_profile, graph_from_profile, layer_graphs
from .graph import GraphOp, OpGraph, TensorPart, chain_to_graph
from .policies import Policy, store_all_ops, uniform_schedule
from .remat_ilp import RematSolution, min_peak_remat_ilp, solve_remat_ilp
from .schedule import Backward, Forward, Offload, Op, Prefetch, SolveStatus, Wait, format_schedule
from .simulator import SimResult, simulate
from .tradeoff import STRATEGIES, TradeoffCurve, TradeoffPoint, default_budgets, tradeoff_curves

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
