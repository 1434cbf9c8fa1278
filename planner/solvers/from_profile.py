"""A `ModelProfile` as the solvers' inputs: its layer chain (`chain_from_profile`, for the DP)
and its op graphs (`graph_from_profile`, for the ILP).

Both are for one micro-batch on one GPU without tensor, sequence or context parallelism, and
agree on times: a layer takes its measured time (profile mode "measure"), or its FLOPs times
`seconds_per_flop`, and in the op graph that time is split over the layer's operations (see
`graph_from_profile`), so the two have the same no-recomputation makespan.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from ..model import LayerCost, LayerGraph, LayerKind, ModelProfile
from .chain import ChainLayer, LayerChain
from .graph import GraphOp, OpGraph

if TYPE_CHECKING:
    import networkx as nx


def _check_args(micro_batch_size: int, seconds_per_flop: float | None) -> None:
    if (
        isinstance(micro_batch_size, bool)
        or not isinstance(micro_batch_size, int)
        or micro_batch_size < 1
    ):
        raise ValueError(
            f"micro_batch_size={micro_batch_size!r} must be an integer >= 1; pass e.g. 1"
        )
    if seconds_per_flop is not None and not (
        isinstance(seconds_per_flop, int | float)
        and math.isfinite(seconds_per_flop)
        and seconds_per_flop > 0
    ):
        raise ValueError(
            f"seconds_per_flop={seconds_per_flop!r} must be a finite number > 0; pass "
            "1 / (peak FLOP/s * achievable efficiency), or None for measured times"
        )


def _layer_times(
    profile: ModelProfile, seconds_per_flop: float | None, micro_batch_size: int
) -> list[tuple[float, float]]:
    """(forward, backward) seconds of every layer for the micro-batch."""
    measured = all(x.fwd_time_s is not None and x.bwd_time_s is not None for x in profile.layers)
    if seconds_per_flop is None and not measured:
        raise ValueError(
            f"profile {profile.name!r} has no measured layer times; pass seconds_per_flop "
            "(1 / (peak FLOP/s * efficiency)) or profile the model with mode='measure'"
        )
    b = micro_batch_size

    def times(cost: LayerCost) -> tuple[float, float]:
        if seconds_per_flop is None:
            return (cost.fwd_time_s or 0.0) * b, (cost.bwd_time_s or 0.0) * b
        return cost.fwd_flops * b * seconds_per_flop, cost.bwd_flops * b * seconds_per_flop

    return [times(cost) for cost in profile.layers]


def chain_from_profile(
    profile: ModelProfile,
    *,
    micro_batch_size: int = 1,
    seconds_per_flop: float | None = None,
    name: str | None = None,
) -> LayerChain:
    """The profile's layers as a solver `LayerChain` for one micro-batch, with every figure the
    profile has: measured layer times unless `seconds_per_flop` is given (then
    ``flops * micro_batch_size * seconds_per_flop``, e.g. to plan for a GPU from a CPU profile;
    pass ``1 / (peak_flops * efficiency)``), and the transient bytes inside each forward and
    backward (`fwd_tmp_bytes`, `bwd_tmp_bytes`; 0 in an analytic spec).

    `saved_bytes` is `act_tp_bytes + act_replicated_bytes` (Korthikanti et al. 2022 §4.1), at
    least the layer's input. Each layer's input is the previous layer's output (the same
    tensor): the profiler records inputs only for the blocks it hooks, so a traced head reports
    0 bytes. Every figure scales with the micro-batch size. Raises ValueError on bad arguments
    or, without `seconds_per_flop`, on a profile without measured times."""
    _check_args(micro_batch_size, seconds_per_flop)
    times = _layer_times(profile, seconds_per_flop, micro_batch_size)
    b = micro_batch_size
    layers = []
    x_in = profile.layers[0].input_bytes * b
    for cost, (fwd_s, bwd_s) in zip(profile.layers, times, strict=True):
        saved = (cost.act_tp_bytes + cost.act_replicated_bytes) * b
        layers.append(
            ChainLayer(
                name=cost.name,
                fwd_s=fwd_s,
                bwd_s=bwd_s,
                input_bytes=x_in,
                saved_bytes=max(saved, x_in),
                output_bytes=cost.output_bytes * b,
                fwd_tmp_bytes=cost.fwd_tmp_bytes * b,
                # the embedding's is weight-sized, per micro-batch (`LayerCost.bwd_tmp_bytes`)
                bwd_tmp_bytes=cost.bwd_tmp_bytes * (1 if cost.kind == LayerKind.EMBEDDING else b),
            )
        )
        x_in = cost.output_bytes * b
    default = f"{profile.name} ({_micro_batch(b)})"
    return LayerChain(layers=tuple(layers), name=name or default)


def layer_graphs(profile: ModelProfile) -> tuple[LayerGraph, ...]:
    """One op graph per layer of the chain: the profile's own, and for a block the profiler did
    not trace (it traces two of a run of identical blocks on the meta device) the graph of the
    last traced block before it. A layer without operations has an empty graph (its input
    passes through). Raises ValueError when a layer has none."""
    by_layer = {g.layer: g for g in profile.op_graphs}
    graphs: list[LayerGraph] = []
    for index, cost in enumerate(profile.layers):
        graph = by_layer.get(index)
        if graph is None and graphs and graphs[-1].layer > 0:
            graph = graphs[-1]  # an untraced block repeats the last traced one
        if graph is None:
            raise ValueError(
                f"profile {profile.name!r} has no op graph for layer {index} ({cost.name!r}); "
                "op graphs come from tracing a model (paraplan profile, or a Hugging Face "
                "preset), not from an analytic spec: trace the model, or use the chain DP"
            )
        graphs.append(graph)
    return tuple(graphs)


class _Builder:
    """Appends layers' op graphs to one `OpGraph`, dropping ops that create no tensor."""

    def __init__(self, input_bytes: float) -> None:
        self.nodes: list[GraphOp] = [GraphOp(name="input", output_bytes=input_bytes, is_input=True)]
        """Node 0, the only input node: the first layer's input. An op that reads nothing but
        parameters and constants (outside the graph) is made to read it, so every compute node
        has an input and node l + 1 is the l-th operation, as in `chain_to_graph`."""
        self.reads_own: set[int] = set()
        """Nodes whose own output some backward reads beyond what their `bwd_inputs` say."""
        self.carry = (0.0, 0.0)
        """Times of layers without operations, given to the next operation."""

    def add_layer(
        self,
        name: str,
        graph: LayerGraph,
        x_in: int,
        times: tuple[float, float],
        b: int,
        flops_per_byte: float,
    ) -> int:
        """Append one layer whose input is node `x_in`; returns the node of its output."""
        where: dict[int, int | None] = {}  # local op -> graph node holding its storage

        def ref(r: int) -> int | None:
            return x_in if r == -1 else None if r < 0 else where[r]

        kept: list[tuple[int, list[int], float]] = []  # (node, inputs, weight)
        for k, op in enumerate(graph.nodes):
            ins = list(dict.fromkeys(g for g in map(ref, op.inputs) if g is not None))
            created = op.output_bytes > 0 or op.fwd_flops > 0
            index = len(self.nodes)
            where[k] = index if created else (ins[0] if ins else None)
            reads = [g for g in map(ref, op.bwd_reads) if g is not None]
            if not created:
                # A view or in-place op: its output is an input's storage, which its backward
                # reading keeps alive until that input's own backward (later: the safe side).
                self.reads_own.update(g for g in reads if not self.nodes[g].is_input)
                continue
            moved = op.output_bytes * b + sum(self.nodes[g].output_bytes for g in ins)
            weight = max(op.fwd_flops * b, flops_per_byte * moved)
            self.reads_own.update(
                g for g in reads if g not in ins and g != index and not self.nodes[g].is_input
            )
            self.nodes.append(
                GraphOp(
                    name=f"{name}/{k}:{op.op.removeprefix('aten.').removesuffix('.default')}",
                    output_bytes=op.output_bytes * b,
                    inputs=tuple(ins) if ins else (0,),
                    bwd_inputs=tuple(g for g in ins if g in reads),
                    bwd_output=index in reads,
                )
            )
            kept.append((index, ins, weight))
        self._spread(kept, times)
        out = ref(graph.output) if graph.output >= -1 else None
        return x_in if out is None else out

    def _spread(self, kept: list[tuple[int, list[int], float]], times: tuple[float, float]) -> None:
        """Split the layer's forward and backward times over its ops by weight (evenly when
        every weight is 0); a layer without ops hands its times on to the next one."""
        fwd_s, bwd_s = times[0] + self.carry[0], times[1] + self.carry[1]
        if not kept:
            self.carry = (fwd_s, bwd_s)
            return
        self.carry = (0.0, 0.0)
        total = sum(w for _, _, w in kept)
        for index, _, weight in kept:
            share = weight / total if total > 0 else 1 / len(kept)
            self.nodes[index] = dataclasses.replace(
                self.nodes[index], fwd_s=fwd_s * share, bwd_s=bwd_s * share
            )

    def finish(self, name: str, output: int) -> OpGraph:
        """The graph, pruned to what `output` (the last layer's output) needs."""
        nodes = [
            dataclasses.replace(node, bwd_output=True) if i in self.reads_own else node
            for i, node in enumerate(self.nodes)
        ]
        if any(self.carry) and len(nodes) > 1:  # trailing layers without ops
            last = nodes[-1]
            nodes[-1] = dataclasses.replace(
                last, fwd_s=last.fwd_s + self.carry[0], bwd_s=last.bwd_s + self.carry[1]
            )
        return prune(OpGraph(nodes=tuple(nodes), name=name), output)


def to_networkx(graph: OpGraph) -> nx.DiGraph:
    """The graph as a `networkx.DiGraph`: one vertex per node index (attribute ``op``: the
    `GraphOp`), an edge from every input to its reader."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from((i, {"op": node}) for i, node in enumerate(graph.nodes))
    g.add_edges_from((i, j) for j, node in enumerate(graph.nodes) for i in node.inputs)
    return g


def prune(graph: OpGraph, output: int) -> OpGraph:
    """The graph without the operations nothing depends on: kept are `output` (e.g. the loss)
    and every node whose output some backward reads, with their ancestors (a reachability walk
    on `to_networkx`); the rest (e.g. a mask built and never used) would only add backward
    seeds. Indices keep their order (still topological), renumbered."""
    import networkx as nx

    g = to_networkx(graph)
    needed = {0, output} | {i for i, n in enumerate(graph.nodes) if n.bwd_output}
    needed |= {i for n in graph.nodes for i in n.bwd_inputs}
    keep: set[int] = set(needed)
    for i in needed:
        keep |= nx.ancestors(g, i)
    order = sorted(keep)
    new = {old: k for k, old in enumerate(order)}
    nodes = [
        dataclasses.replace(
            graph.nodes[old],
            inputs=tuple(new[i] for i in graph.nodes[old].inputs),
            bwd_inputs=tuple(new[i] for i in graph.nodes[old].bwd_inputs),
        )
        for old in order
    ]
    return OpGraph(nodes=tuple(nodes), name=graph.name)


def graph_from_profile(
    profile: ModelProfile,
    *,
    layers: range | None = None,
    micro_batch_size: int = 1,
    seconds_per_flop: float | None = None,
    flops_per_byte: float = 0.0,
    name: str | None = None,
) -> OpGraph:
    """The profile's op graphs, for the chain layers in `layers` (default: the whole model),
    as one `OpGraph` for the remat ILP (`solve_remat_ilp`), for one micro-batch.

    Node 0 is the input of the first layer; each layer's graph reads the previous layer's
    output. Every recorded operation that creates a tensor becomes a node (views and in-place
    ops create none: a reader of their result reads the tensor they alias); its backward reads
    what autograd saved for it (`ProfiledOp.bwd_reads`, Checkmate's model: each tensor kept or
    recomputed on its own, Jain et al. 2020 §4.1). Parameters are static memory, outside the
    graph; an op reading only parameters or constants reads node 0. Operations nothing depends
    on are dropped (`prune`).

    Times: each layer's time, as in `chain_from_profile` (measured, or FLOPs times
    `seconds_per_flop`), is split over its operations by a roofline weight,
    ``max(flops, flops_per_byte * bytes read and written)``: pass the device's machine balance
    (peak FLOP/s over memory bandwidth, Williams et al. 2009) so that elementwise operations are
    not free to recompute; 0 splits by FLOPs alone. Transients inside an operation are not
    recorded: the graph's transients are its intermediate tensors and gradients."""
    _check_args(micro_batch_size, seconds_per_flop)
    if not (
        isinstance(flops_per_byte, int | float)
        and math.isfinite(flops_per_byte)
        and flops_per_byte >= 0
    ):
        raise ValueError(
            f"flops_per_byte={flops_per_byte!r} must be a finite number >= 0: the device's peak "
            "FLOP/s over its memory bandwidth, or 0 to split layer times by FLOPs alone"
        )
    span = range(len(profile.layers)) if layers is None else layers
    if not span or span.start < 0 or span.stop > len(profile.layers) or span.step != 1:
        raise ValueError(
            f"layers={layers!r} must be a non-empty range of consecutive layer indices within "
            f"0..{len(profile.layers) - 1}, e.g. range(1, 2) for the first block"
        )
    graphs = layer_graphs(profile)
    times = _layer_times(profile, seconds_per_flop, micro_batch_size)
    b = micro_batch_size
    first = profile.layers[span.start]
    x_in = first.input_bytes if span.start == 0 else profile.layers[span.start - 1].output_bytes
    builder = _Builder(x_in * b)
    out = 0
    for index in span:
        cost = profile.layers[index]
        out = builder.add_layer(cost.name, graphs[index], out, times[index], b, flops_per_byte)
    default = f"{profile.name} op graph ({_micro_batch(b)})"
    if layers is not None:
        default = (
            f"{profile.name} layers {span.start}..{span.stop - 1} op graph ({_micro_batch(b)})"
        )
    return builder.finish(name or default, out)


def _micro_batch(size: int) -> str:
    """``one micro-batch of 8 sequences``: the chain's batch in words (not a bare count)."""
    return f"one micro-batch of {size} sequence{'' if size == 1 else 's'}"
